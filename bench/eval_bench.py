"""Eval attempts per second with a scripted baseline, and the harness's own share of an attempt.

    python bench/eval_bench.py --pool-run ledgers/<pool run> [--pool-run ...] [--backend docker]
        [-n 100] [-c N]
    python bench/eval_bench.py --composition [--backend docker|bwrap|both] [-n 60] [-c N]

The first mode evaluates the environment's scripted baseline (behind the real local server,
on loopback: the deshuffle heuristic, or the Harbor policy for task directories) greedily on
the first N tasks of a passed pool's frozen set, through the real harness (sessions or
trials, trajectories, journals, Parquet), and prints, from that one run: attempts/s, and
where an attempt's wall time went — the model (its requests, the server's policy included),
the bash commands, the sandbox (a session's start and stop; for a task directory, the trial's
containers, snapshot and cleanup), scoring (for a task directory, the task's own verifier),
and the rest, the harness itself. The harness's own share is everything but the model and
the commands. Each ``--pool-run`` is measured in turn, in one invocation (a chat eval and an
agentic one side by side).

The second mode measures a one-shot agent run as a composition of a session (start → exec
→ stop, `validate.sandbox.session.run_in_session`) against the backend's direct `run` and
the bare loops of bench/sandbox_bench.py, at the same concurrency, in one invocation.
Targets for replacing the direct run: docker ≥ 0.9 × bare ``docker run``; bwrap per attempt
≤ 2.5 × a bare ``python3 -c pass``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validate.cli.main import DEFAULT_CONCURRENCY  # noqa: E402
from validate.core.paths import DEFAULT_IMAGE  # noqa: E402


def eval_rate(pool_run: Path, backend: str, n: int, c: int) -> None:
    import pyarrow.parquet as pq

    from validate.api import context
    from validate.audit.run import audit
    from validate.contract.manifest import derive, write_manifest
    from validate.devtools.localserver import serve
    from validate.eval import contract as ec
    from validate.eval.client import ChatClient
    from validate.eval.freeze import parent_of
    from validate.eval.run import EvalPhase, evaluate

    parent, frozen = parent_of(pool_run, audit=lambda root: audit(root).problems)
    if frozen.execution.backend != backend:
        sys.exit(f"--backend: the pool ran on {frozen.execution.backend}; evaluate on that backend")
    work = Path(tempfile.mkdtemp(prefix="eval-bench-"))
    from environment.protocol import LoadHints
    from validate.contract.manifest import check_environment

    env, _, taskset = check_environment(frozen, LoadHints())
    if env.attempt_kind == "trial":
        from environment.harbor.baseline import MODEL_NAME, policy
    else:
        from environment.deshuffle.baseline import MODEL_NAME, policy
    sub = derive(frozen, env, taskset, name=f"{frozen.name}.bench", idx=frozen.selection.idx[:n],
                 rule=f"eval bench: the first {n} tasks of {frozen.name}")
    write_manifest(sub, work / "bench.json")
    parent = parent.model_copy(update={"manifest_sha256": sub.sha256, "manifest_name": sub.name,
                                       "manifest_path": str(work / "bench.json"),
                                       "task_count": len(sub.tasks)})
    with serve({MODEL_NAME: policy}) as server:
        contract = ec.build(name="bench", parent=parent, manifest=sub, reward_code="sha256:bench",
                            model=ec.ModelSpec(id=MODEL_NAME, revision="bench", server="localserver",
                                               base_url=server.base_url), attempt_kind=env.attempt_kind,
                            limits=ec.AgentLimits(attempt_timeout_s=45, tool_timeout_s=15))
        ctx = context(work / "bench.json", kind="eval", run_dir=work / "run", concurrency=c, allow_patch=True)
        client = ChatClient(server.base_url)
        t0 = time.perf_counter()
        try:
            summary = evaluate(ctx, contract, client, EvalPhase(passes=("greedy",)))
        finally:
            ctx.sandbox.close()
        wall = time.perf_counter() - t0
    rows = pq.read_table(work / "run" / "samples.parquet").to_pylist()
    total = sum(r["wall_s"] for r in rows)
    parts = {k: sum(r[k] for r in rows) for k in ("model_s", "endpoint_wait_s", "tool_s", "sandbox_s",
                                                  "score_s")}
    rest = total - sum(parts.values())
    print(f"eval ({env.name}, {contract.agent.name}), {backend}, -c {c}: {summary.attempts} attempts in "
          f"{wall:.1f} s = {summary.attempts / wall:.2f} attempts/s (greedy pass, {len(sub.tasks)} tasks; "
          f"mean greedy reward {summary.greedy.mean_reward.value:.3f})")
    print(f"per attempt: {statistics.fmean(r['wall_s'] for r in rows) * 1000:.0f} ms mean wall")
    for name, value in [*parts.items(), ("harness (the rest)", rest)]:
        print(f"  {name:<22} {value / len(rows) * 1000:8.1f} ms   {100 * value / total:5.1f} %")
    own = total - parts["model_s"] - parts["endpoint_wait_s"] - parts["tool_s"]
    print(f"harness's own share (all but the model and the commands): {100 * own / total:.1f} % "
          "of the wall time")


def composition(backend: str, n: int, c: int) -> None:
    from bench.sandbox_bench import bare_bwrap, bare_docker, bare_python, rate
    from validate.run.workspace import temp_storage
    from validate.sandbox import Mount, RunRequest, open_sandbox
    from validate.sandbox.session import run_in_session

    sandbox = open_sandbox(backend, image=DEFAULT_IMAGE, run_label="bench-composition")
    counter = iter(range(10**9))

    def attempt(via_session: bool):
        def one() -> None:
            with temp_storage() as root:
                ws = root / "ws"
                ws.mkdir()
                req = RunRequest(argv=("python3", "-S", "-c", "pass"), name=f"comp-{next(counter)}",
                                 mounts=(Mount(source=ws, target="/workspace", read_only=False),))
                r = run_in_session(sandbox, req) if via_session else sandbox.run(req)
                assert r.exit_code == 0, r
        return one

    try:
        direct = rate(attempt(False), n, c)
        composed = rate(attempt(True), n, c)
        if backend == "docker":
            bare = rate(bare_docker, n, c)
            print(f"docker, -c {c}: bare `docker run` {bare:.2f}/s; direct run {direct:.2f}/s "
                  f"({direct / bare:.2f}×); session composition {composed:.2f}/s ({composed / bare:.2f}× "
                  f"bare, target ≥ 0.90; {composed / direct:.2f}× direct)")
        else:
            bare_py = 1 / rate(bare_python, n, 1)  # the image's python3 -c pass, as bench/sandbox_bench.py
            one_direct, one_composed = rate(attempt(False), n // 2, 1), rate(attempt(True), n // 2, 1)
            print(f"bwrap, -c {c}: bare bwrap {rate(bare_bwrap, n, c):.2f}/s; direct run {direct:.2f}/s; "
                  f"session composition {composed:.2f}/s ({composed / direct:.2f}× direct)")
            print(f"bwrap, one at a time: python3 -c pass {bare_py * 1000:.1f} ms; direct "
                  f"{1000 / one_direct:.1f} ms ({1 / one_direct / bare_py:.2f}×); composition "
                  f"{1000 / one_composed:.1f} ms ({1 / one_composed / bare_py:.2f}×, target ≤ 2.5)")
    finally:
        sandbox.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pool-run", type=Path, action="append", default=[],
                   help="a passed pool run (its frozen set is evaluated); repeat to measure several "
                        "in one invocation")
    p.add_argument("--composition", action="store_true",
                   help="measure the one-shot run as a session composition")
    p.add_argument("--backend", default="docker", choices=["docker", "bwrap", "both"])
    p.add_argument("-n", type=int, default=100, help="tasks (eval) or attempts per loop (composition)")
    p.add_argument("-c", type=int, default=DEFAULT_CONCURRENCY, help="concurrency")
    args = p.parse_args()
    backends = ["docker", "bwrap"] if args.backend == "both" else [args.backend]
    for backend in backends:
        if args.composition:
            composition(backend, args.n, args.c)
        elif not args.pool_run:
            p.error("--pool-run is required (or --composition)")
        else:
            for pool_run in args.pool_run:
                eval_rate(pool_run, backend, args.n, args.c)


if __name__ == "__main__":
    main()
