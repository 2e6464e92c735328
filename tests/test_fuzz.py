"""Fuzz the reply parser and scorer (CI budget; the full ≥ 100,000 runs in bench/fuzz_bench.py)."""

from __future__ import annotations

import os
import random

from tests.fuzz_replies import check

BUDGET = int(os.environ.get("FUZZ_BUDGET", "10000"))


def test_fuzzed_replies_parse_exactly_when_valid_and_reward_is_bounded():
    counts = check(random.Random(20261130), BUDGET)
    assert counts["valid"] > BUDGET // 3 and counts["invalid"] > BUDGET // 3
