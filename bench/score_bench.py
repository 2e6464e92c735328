"""Scorer and generator speed on the whole local corpus, fast vs naive, measured in one run.

    python bench/score_bench.py [--corpus ../shared/corpus/papers.jsonl.gz]

Builds one task holding every paper of the corpus (~10k paragraphs), scores an oracle reply
and a shuffled reply with the fast scorer and the naive O(N²) reference, prints the times
and the speed-up (target: fast ≤ 25 ms and ≥ 100× naive), then the tasks generated per
second on an ordinary 1–3 paper config (target ≥ 1,000/s).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from environment.deshuffle import Corpus, DeshuffleConfig, DeshuffleTaskset, analyze_ordering  # noqa: E402
from tests.naive_scorer import naive_metrics  # noqa: E402


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared/corpus/papers.jsonl.gz"))
    args = ap.parse_args()
    corpus = Corpus.from_path(args.corpus)
    n = len(corpus)
    task = DeshuffleTaskset(DeshuffleConfig(min_papers=n, max_papers=n), corpus).task(0)
    gold = [list(t) for t in task.gold]
    rng = random.Random(0)
    shuffled = [x for t in gold for x in t]
    rng.shuffle(shuffled)
    replies = {"oracle": gold, "shuffled": [shuffled[i::n] for i in range(n)]}
    print(f"one task: {task.n_papers} papers, {task.n_labels} units")
    for name, groups in replies.items():
        text = f"\\boxed{{{json.dumps(groups)}}}"
        fast = best_of(lambda text=text: analyze_ordering(text, gold), 5)
        naive = best_of(lambda groups=groups: naive_metrics(groups, gold), 1)
        print(f"{name:9s} fast {fast * 1e3:8.2f} ms   naive {naive * 1e3:9.1f} ms   "
              f"speed-up {naive / fast:7.0f}x   reward {analyze_ordering(text, gold)[0]:.4f}")
    ts = DeshuffleTaskset(DeshuffleConfig(min_papers=1, max_papers=3, include_headers=True), corpus)
    count = 3000
    t0 = time.perf_counter()
    for t in ts.tasks(0, count):
        t.hash  # noqa: B018 - hashing is part of generating a task
    rate = count / (time.perf_counter() - t0)
    print(f"generation: {rate:,.0f} tasks/s (1-3 papers, headers on, hash included)")


if __name__ == "__main__":
    main()
