"""Pool-sized runs: 250, 500 and 1,000 tasks × (oracle + 5 controls) on the local corpus.

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

from validate.cli import DEFAULT_CONCURRENCY  # noqa: E402
AGENTS = "oracle,empty,shuffled,identity,reversed,malformed"

CHILD = r"""
import json, resource, shutil, sys, tempfile, time
from pathlib import Path
from environment.deshuffle import Corpus, DeshuffleConfig
from validate.agents import CONTROLS, resolve
from validate.contract import CorpusSpec, EnvironmentSpec, freeze, verify
from validate.paths import DEFAULT_IMAGE, RunPaths
from validate.runner import RunContext, run
from validate.sandbox import open_sandbox

backend, n, c, corpus_path, agents = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
corpus = Corpus.from_path(corpus_path)
sandbox = open_sandbox(backend, image=DEFAULT_IMAGE, run_label=f"bench{n}")
env = EnvironmentSpec(config=DeshuffleConfig(min_papers=1, max_papers=3),
                      corpus=CorpusSpec(kind="local", location=corpus_path, revision=corpus.revision))
manifest = freeze(name="bench", env=env, idx=list(range(n)), rule="bench", facts=sandbox.facts(), corpus=corpus,
                  control_max_reward=dict.fromkeys(CONTROLS))
root = Path(tempfile.mkdtemp(prefix="pool-bench-"))
try:
    t0 = time.perf_counter()
    taskset = verify(manifest, sandbox)
    ctx = RunContext(manifest=manifest, sandbox=sandbox, taskset=taskset, paths=RunPaths(root / "run"),
                     run_id=f"bench{n}", phase="controls", image_digest=manifest.execution.image_digest)
    written, verdicts = run(ctx, resolve(agents), c)
    wall = time.perf_counter() - t0
finally:
    sandbox.close()
    shutil.rmtree(root, ignore_errors=True)
print(json.dumps({"tasks": n, "attempts": written["attempts"], "wall_s": wall,
                  "compatible": sum(v.compatible for v in verdicts),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="both", choices=["docker", "bwrap", "both"])
    ap.add_argument("--sizes", default="250,500,1000")
    ap.add_argument("-c", type=int, default=DEFAULT_CONCURRENCY,
                    help="concurrency (default: the harness's, 2 per CPU core: %(default)s)")
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared/corpus/papers.jsonl.gz"))
    args = ap.parse_args()
    backends = ["bwrap", "docker"] if args.backend == "both" else [args.backend]
    print(f"agents: {AGENTS}; concurrency {args.c}")
    print(f"{'backend':8s} {'tasks':>6s} {'attempts':>9s} {'wall':>10s} {'attempts/s':>11s} {'peak RSS':>9s}  compatible")
    for backend in backends:
        for n in map(int, args.sizes.split(",")):
            out = subprocess.run([sys.executable, "-c", CHILD, backend, str(n), str(args.c), args.corpus, AGENTS],
                                 cwd=ROOT, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{backend:8s} {n:6d}  FAILED: {out.stderr.strip()[-500:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{backend:8s} {n:6d} {r['attempts']:9d} {r['wall_s']:9.1f}s {r['attempts'] / r['wall_s']:11.2f} "
                  f"{r['peak_rss_mb']:7.0f}MB  {r['compatible']}/{n}", flush=True)


if __name__ == "__main__":
    main()
