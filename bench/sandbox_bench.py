"""Attempts per second of the harness vs a bare loop of the backend's own command.

    python bench/sandbox_bench.py [--backend docker|bwrap|both] [-n 60] [-c N]

At the same concurrency, it times (a) the bare command in a loop —
``docker run --rm --network none IMAGE python3 -c pass`` for docker (and, to isolate the
harness's own share, a bare API loop with the harness's container settings); for bwrap the same
bwrap line the harness uses, minus the harness — and (b) the harness playing the ``empty``
agent on N real tasks (materialise + run + score + record). It prints both rates and their
ratio, measured in one run. Targets: docker harness ≥ 0.9 × bare; bwrap per attempt ≤ 2.5 ×
a bare ``python3 -c pass``. ``--ambiguous`` adds the docker harness's rate on an agent that
SIGKILLs itself (exit 137), the one case where it asks the daemon for the container's events.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validate.api import DEFAULT_CONCURRENCY  # noqa: E402
from validate.core.paths import DEFAULT_IMAGE, ImagePaths  # noqa: E402


def rate(fn, n: int, c: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        list(pool.map(lambda _: fn(), range(n)))
    return n / (time.perf_counter() - t0)


def bare_docker() -> None:
    subprocess.run(["docker", "run", "--rm", "--network", "none", DEFAULT_IMAGE, "python3", "-c", "pass"],
                   check=True, capture_output=True)


def bare_docker_api():
    """The very container the harness creates (its `create_container`: network disabled, limits,
    read-only, no caps), in a bare create/start/wait/remove loop: what is left between it
    and the harness is the harness's share."""
    import itertools

    from validate.sandbox import RunRequest
    from validate.sandbox.docker import DockerSandbox

    sandbox = DockerSandbox(DEFAULT_IMAGE, run_label="bench-bare")
    api = sandbox.client.api
    numbers = itertools.count()

    def one() -> None:
        cid = sandbox.create_container(RunRequest(argv=("python3", "-c", "pass"),
                                                  name=f"bare-{next(numbers)}"))
        api.start(cid)
        api.wait(cid)
        api.remove_container(cid, force=True)

    return one


def bare_bwrap() -> None:
    """The harness's own bwrap line (seccomp filter, no nested user namespaces, the watchdog
    as PID 1), without the harness: no cgroups, no status pipe, no workspace."""
    from validate.sandbox.base import watchdog_argv
    from validate.sandbox.seccomp import filter_fd

    rootfs = str(ImagePaths(DEFAULT_IMAGE).rootfs)
    fd = filter_fd()
    try:
        subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bwrap",
                        "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                        "--as-pid-1", "--seccomp", str(fd), "--ro-bind", rootfs, "/", "--proc", "/proc",
                        "--dev", "/dev", "--tmpfs", "/tmp", "--",
                        *watchdog_argv(("python3", "-c", "pass"), 60.0)],
                       check=True, capture_output=True, pass_fds=(fd,))
    finally:
        os.close(fd)


def bare_python() -> None:
    subprocess.run([str(ImagePaths(DEFAULT_IMAGE).rootfs / "usr/bin/python3"), "-c", "pass"], check=True,
                   capture_output=True)


def harness(backend: str, n: int, c: int, corpus: str, agent: str = "empty") -> float:
    """Attempts/s of the harness playing one control on n tasks: a deshuffle control, or a
    program of tests/agents/ (the hostile environment the tests register)."""
    from environment.protocol import LoadHints
    from validate.contract.manifest import check_environment, freeze
    from validate.core import environments
    from validate.core.paths import RunPaths
    from validate.evidence.patches import code_state
    from validate.run.context import RunContext
    from validate.run.executors import make_executor
    from validate.run.phases import RunPhase, run_agents
    from validate.sandbox import open_sandbox

    env_name = "deshuffle-papers"
    if agent != "empty":
        from tests.hostile import HostileDeshuffle

        environments.register(HostileDeshuffle)
        env_name = HostileDeshuffle.name
    hints = LoadHints(search=(Path(corpus),))
    env = environments.get(env_name)
    sandbox = open_sandbox(backend, image=DEFAULT_IMAGE, run_label="bench")
    manifest = freeze(name="bench", env_name=env_name, config=env.Config(corpus=corpus), hints=hints,
                      idx=list(range(n)), rule="bench", facts=sandbox.facts(),
                      controls=[agent.replace("_", "-")], git_commit=code_state().label)
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        env, _, taskset = check_environment(manifest, hints)
        ctx = RunContext(env=env, manifest=manifest, taskset=taskset, sandbox=sandbox,
                         paths=RunPaths(tmp / "run"), executor=make_executor("threads", c), run_id="bench",
                         code=code_state(), hints=hints)
        t0 = time.perf_counter()
        summary = run_agents(ctx, RunPhase(agents="controls"))
        elapsed = time.perf_counter() - t0
        assert (
            summary.counts.attempts == n and "infrastructure_failure" not in summary.counts.excluded_by_reason
        )
        return n / elapsed
    finally:
        sandbox.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="both", choices=["docker", "bwrap", "both"])
    ap.add_argument("-n", type=int, default=60, help="attempts per measurement")
    ap.add_argument("-c", type=int, default=DEFAULT_CONCURRENCY,
                    help="concurrency (default: the harness's, 2 per CPU core: %(default)s)")
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared/corpus/papers.jsonl.gz"))
    ap.add_argument("--ambiguous", action="store_true",
                    help="docker: also the rate on an agent exiting 137 (the daemon's events are asked)")
    args = ap.parse_args()
    backends = ["docker", "bwrap"] if args.backend == "both" else [args.backend]
    print(f"n={args.n} attempts, concurrency {args.c}")
    if "docker" in backends:
        bare = rate(bare_docker, args.n, args.c)
        same = rate(bare_docker_api(), args.n, args.c)
        ours = harness("docker", args.n, args.c, args.corpus)
        print(f"docker  bare `docker run --network none` {bare:6.2f}/s   harness {ours:6.2f}/s   "
              f"harness/bare {ours / bare:5.2f}  (target ≥ 0.90)")
        print(
            f"        bare API loop, the harness's settings {same:6.2f}/s   harness/that {ours / same:5.2f}"
        )
        if args.ambiguous:
            killed = harness("docker", args.n, args.c, args.corpus, agent="fake-kill")
            print(f"        an agent exiting 137 (events asked) {killed:6.2f}/s   that/plain "
                  f"{killed / ours:5.2f}")
    if "bwrap" in backends:
        py_ms = 1000 / rate(bare_python, args.n, 1)
        bare = rate(bare_bwrap, args.n, args.c)
        ours = harness("bwrap", args.n, args.c, args.corpus)
        one_ms = 1000 / harness("bwrap", args.n, 1, args.corpus)
        print(f"bwrap   bare {bare:6.2f}/s   harness {ours:6.2f}/s   harness/bare {ours / bare:5.2f}")
        print(f"        one attempt at a time: harness {one_ms:5.1f} ms per attempt vs python3 -c pass "
              f"{py_ms:5.1f} ms = {one_ms / py_ms:4.2f}x  (target ≤ 2.5x)")


if __name__ == "__main__":
    main()
