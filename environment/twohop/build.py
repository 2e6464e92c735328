"""Command line: build twohop-env's dataset, verify it, optionally write it out.

    python -m environment.twohop.build --verify            # 36/36, N chains proved multi-hop
    python -m environment.twohop.build --out tasks.jsonl   # the rows, one JSON object a line

Exit codes: 0 every check passed (or nothing to verify), 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

from pydantic import ValidationError

from environment.protocol import ConfigError
from environment.twohop.dataset import CATEGORY_COUNTS, canonical_json
from environment.twohop.env import TwohopConfig, TwohopEnvironment, TwohopTaskset


def _write_rows(taskset: TwohopTaskset, out: Path) -> None:
    """The rows as JSON lines, written to a temp file beside ``out`` and renamed."""
    data = b"".join(canonical_json(r) + b"\n" for r in taskset.dataset.rows())
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, out)


def _verify(env: TwohopEnvironment, taskset: TwohopTaskset) -> bool:
    tasks = [taskset.task(i) for i in range(taskset.size)]
    failed = False
    for t in tasks:
        for f in env.findings(t):
            print(f"{t.id} ({t.family}): {f.detail}")
            failed = True
    ok, total, chains = env.multi_hop_report(taskset)
    print(f"{ok}/{total}, {chains} chains proved multi-hop")
    for f in env.dataset_findings(taskset, tasks):
        print(("FAIL " if f.blocking else "") + f.detail)
        failed = failed or f.blocking
    return not failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m environment.twohop.build",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--verify", action="store_true", help="run every task and dataset check")
    parser.add_argument("--seed", type=int, default=0, help="universe seed (0: the published dataset)")
    parser.add_argument("--out", type=Path, help="write the dataset rows as JSON lines to this file")
    args = parser.parse_args(argv)
    if args.out is not None and not args.out.parent.is_dir():
        print(f"error: --out: the folder {args.out.parent} does not exist", file=sys.stderr)
        return 2
    env = TwohopEnvironment()
    try:
        taskset = env.load(TwohopConfig(seed=args.seed))
    except ConfigError as e:
        print(f"error: --seed: {e}", file=sys.stderr)
        return 2
    except ValidationError as e:
        print(f"error: --seed: {e.errors()[0]['msg']} (got {args.seed})", file=sys.stderr)
        return 2
    counts = Counter(taskset.task(i).family for i in range(taskset.size))
    print(", ".join(f"{c} {counts[c]}" for c in CATEGORY_COUNTS))
    print(f"revision {taskset.revision}")
    if args.out is not None:
        _write_rows(taskset, args.out)
        print(f"wrote {taskset.size} rows to {args.out}")
    return 0 if not args.verify or _verify(env, taskset) else 1


if __name__ == "__main__":
    sys.exit(main())
