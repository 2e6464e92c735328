"""The full fuzzing budget: ≥ 100,000 generated replies through the parser and scorer, or
generated corpus files through the corpus loaders.

    python bench/fuzz_bench.py [-n 100000] [--seed 0]
    python bench/fuzz_bench.py --corpus [-n 3200] [--seed 20240611]

Replies: fails (exit 1, with the offending reply) on any exception, on parsed_ok disagreeing
with whether the reply is a valid partition, or on a reward outside [0, 1]. Prints replies/s.
Corpus (``-n`` counts files of 1-8 lines each, see tests/test_fuzz_corpus.py): fails on any
exception but `CorpusError` or on an outcome the oracle knows differently. Prints lines/s
and the CPU share of the wall time (well under 1 means the machine was busy).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz_replies import check  # noqa: E402


def corpus_main(n_files: int, seed: int) -> int:
    from tests.test_fuzz_corpus import run_fuzz

    t0, c0 = time.perf_counter(), time.process_time()
    try:
        with tempfile.TemporaryDirectory() as work:
            counts = run_fuzz(seed, n_files, Path(work))
    except AssertionError as e:
        print(f"FAILED: {e}")
        return 1
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    lines = counts.pop("lines")
    print(f"{lines:,} corpus lines in {n_files:,} files in {dt:.1f} s ({lines / dt:,.0f} lines/s, "
          f"CPU/wall {cpu / dt:.2f}): only success or CorpusError; outcomes {counts}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=None,
                    help="replies (default 100,000) or corpus files (default 3,200)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--corpus", action="store_true",
                    help="fuzz the corpus loaders instead of the reply parser")
    args = ap.parse_args()
    if args.corpus:
        return corpus_main(args.n or 3_200, 20_240_611 if args.seed is None else args.seed)
    args.n, args.seed = args.n or 100_000, args.seed or 0
    t0 = time.perf_counter()
    try:
        counts = check(random.Random(args.seed), args.n)
    except AssertionError as e:
        print(f"FAILED: {e}")
        return 1
    dt = time.perf_counter() - t0
    print(f"{args.n:,} replies ({counts['valid']:,} valid, {counts['invalid']:,} invalid) in {dt:.1f} s "
          f"({args.n / dt:,.0f}/s): no exception, parsed_ok exactly when valid, reward in [0, 1]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
