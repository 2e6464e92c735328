"""The full fuzzing budget: ≥ 100,000 generated replies through the parser and scorer.

    python bench/fuzz_bench.py [-n 100000] [--seed 0]

Fails (exit 1, with the offending reply) on any exception, on parsed_ok disagreeing with
whether the reply is a valid partition, or on a reward outside [0, 1]. Prints replies/s.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz_replies import check  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
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
