"""The heuristic baseline's speed and reward on 200 tasks of 1–3 papers, against the shuffled control.

    python bench/baseline_bench.py [--corpus ../shared/corpus/papers.jsonl.gz] [--tasks 200]

Runs the pure solver (temperature 0) on tasks 0..N-1 of the 1–3 paper config with section
headings, for each ``include_headers`` setting; prints the solver's time per task
(median and p95, and per paragraph) and the mean reward, grouping F1 and Kendall tau for
one paper and for several, next to the shuffled control's reward on the same tasks and
the ratio between them, and the oracle's (the gold reply's) reward.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from environment.deshuffle import PARAGRAPHS_FILE, Corpus, DeshuffleConfig, DeshuffleTaskset  # noqa: E402
from environment.deshuffle.baseline import answer, parse_paragraphs, solve  # noqa: E402
from tests.deshuffle_shuffled import shuffled_reply  # noqa: E402


def run(taskset: DeshuffleTaskset, n_tasks: int) -> None:
    rows = []
    for task in taskset.tasks(0, n_tasks):
        paragraphs = parse_paragraphs(task.files[PARAGRAPHS_FILE].decode())
        t0 = time.perf_counter()
        groups = solve(paragraphs, task.n_papers, temperature=0.0)
        elapsed = time.perf_counter() - t0
        score = taskset.score(task, answer(groups, task.n_papers))
        oracle = taskset.score(task, answer([list(p) for p in task.gold], task.n_papers)).reward
        rows.append((task.n_papers, task.n_labels, elapsed, score,
                     taskset.score(task, shuffled_reply(task, opaque_id=task.id)).reward, oracle))
    times = sorted(r[2] for r in rows)
    print(f"  solver time per task: median {statistics.median(times) * 1e3:.0f} ms, "
          f"p95 {times[int(0.95 * (len(times) - 1))] * 1e3:.0f} ms, "
          f"{sum(times) / sum(r[1] for r in rows) * 1e3:.2f} ms per paragraph")
    for label, keep in (("1 paper   ", lambda k: k == 1), ("2-3 papers", lambda k: k > 1)):
        sel = [r for r in rows if keep(r[0])]
        base = statistics.mean(r[3].reward for r in sel)
        shuf = statistics.mean(r[4] for r in sel)
        orac = statistics.mean(r[5] for r in sel)
        f1 = statistics.mean(r[3].metrics["grouping_f1"] for r in sel)
        tau = statistics.mean(r[3].metrics["norm_kendall_tau"] for r in sel)
        print(f"  {label} n={len(sel):3d}  heuristic baseline {base:.3f} (F1 {f1:.3f}, tau {tau:.3f})   "
              f"shuffled control {shuf:.3f}   baseline/shuffled {base / shuf:.2f}x   oracle {orac:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared/corpus/papers.jsonl.gz"))
    ap.add_argument("--tasks", type=int, default=200)
    args = ap.parse_args()
    corpus = Corpus.from_path(args.corpus)
    for headers in (True, False):
        print(f"{args.tasks} tasks, 1-3 papers, include_headers={headers}")
        run(DeshuffleTaskset(DeshuffleConfig(min_papers=1, max_papers=3, include_headers=headers), corpus),
            args.tasks)


if __name__ == "__main__":
    main()
