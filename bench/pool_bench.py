"""Pool-sized runs: 250, 500 and 1,000 tasks × (oracle + 5 controls) on the local corpus,
each attempt on its own capped tmpfs, bwrap under its seccomp filter, both under the watchdog.

    python bench/pool_bench.py [--backend bwrap|docker|both] [--sizes 250,500,1000] [-c N]

Each size runs in a fresh process (freeze in memory → verify → run → finalize) so its peak
RSS is its own. Prints wall time, attempts/s and peak RSS per size and backend, measured in
one invocation, so growth with the pool size is visible: memory should stay flat because
attempts are streamed to the journal and folded into Parquet in batches.
Targets on 2 cores for 1,000 tasks: docker ≤ 15 min, bwrap ≤ 2 min.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validate.api import DEFAULT_CONCURRENCY  # noqa: E402

#: The oracle and the controls of the earlier benches (source-peek and singletons are extra).
CONTROLS = "empty,shuffled,identity,reversed,malformed"

CHILD = r"""
import json, resource, shutil, sys, tempfile, time
from pathlib import Path
from environment.protocol import LoadHints
from validate.core import environments
from validate.contract.manifest import check_environment, freeze
from validate.evidence.patches import code_state
from validate.core.paths import DEFAULT_IMAGE, RunPaths
from validate.run.phases import RunPhase, run_agents
from validate.run.context import RunContext
from validate.run.executors import make_executor
from validate.sandbox import open_sandbox

backend, n, c, corpus_path, controls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
hints = LoadHints(search=(Path(corpus_path),))
env = environments.get("deshuffle-papers")
sandbox = open_sandbox(backend, image=DEFAULT_IMAGE, run_label=f"bench{n}")
config = env.Config(corpus=corpus_path, min_papers=1, max_papers=3)
manifest = freeze(name="bench", env_name=env.name, config=config, hints=hints, idx=list(range(n)), rule="bench",
                  facts=sandbox.facts(), controls=controls.split(","), git_commit=code_state().label)
root = Path(tempfile.mkdtemp(prefix="pool-bench-"))
try:
    t0 = time.perf_counter()
    env, _, taskset = check_environment(manifest, hints)
    ctx = RunContext(env=env, manifest=manifest, taskset=taskset, sandbox=sandbox, paths=RunPaths(root / "run"),
                     executor=make_executor("threads", c), run_id=f"bench{n}", code=code_state(), hints=hints)
    summary = run_agents(ctx, RunPhase())
    wall = time.perf_counter() - t0
finally:
    sandbox.close()
    shutil.rmtree(root, ignore_errors=True)
print(json.dumps({"tasks": n, "attempts": summary.counts.attempts, "wall_s": wall,
                  "compatible": summary.counts.compatible,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""  # noqa: E501


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="both", choices=["docker", "bwrap", "both"])
    ap.add_argument("--sizes", default="250,500,1000")
    ap.add_argument("-c", type=int, default=DEFAULT_CONCURRENCY,
                    help="concurrency (default: the harness's, 2 per CPU core: %(default)s)")
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared/corpus/papers.jsonl.gz"))
    args = ap.parse_args()
    backends = ["bwrap", "docker"] if args.backend == "both" else [args.backend]
    print(f"agents: oracle,{CONTROLS}; concurrency {args.c}")
    print(f"{'backend':8s} {'tasks':>6s} {'attempts':>9s} {'wall':>10s} {'attempts/s':>11s} "
          f"{'peak RSS':>9s}  compatible")
    for backend in backends:
        for n in map(int, args.sizes.split(",")):
            out = subprocess.run([sys.executable, "-c", CHILD, backend, str(n), str(args.c), args.corpus,
                                  CONTROLS],
                                 cwd=ROOT, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{backend:8s} {n:6d}  FAILED: {out.stderr.strip()[-500:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{backend:8s} {n:6d} {r['attempts']:9d} {r['wall_s']:9.1f}s "
                  f"{r['attempts'] / r['wall_s']:11.2f} {r['peak_rss_mb']:7.0f}MB  {r['compatible']}/{n}",
                  flush=True)


if __name__ == "__main__":
    main()
