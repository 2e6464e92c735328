"""Scorer: hand-computed examples for every metric, and agreement with the naive reference."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings, strategies as st

from environment.deshuffle import analyze_ordering
from environment.deshuffle.score import count_inversions, score_partition
from tests.fuzz_replies import random_gold, split_by_sizes
from tests.naive_scorer import naive_metrics


def boxed(value) -> str:
    return f"Here it is: \\boxed{{{json.dumps(value)}}}"


# (gold, reply, P, R, F1, tau, exact) — computed by hand from the definitions.
HAND = [
    ([[1, 2, 3]], [1, 2, 3], 1, 1, 1, 1, 1),
    ([[1, 2, 3]], [3, 2, 1], 1, 1, 1, 0, 0),
    ([[1, 2, 3]], [2, 1, 3], 1, 1, 1, 2 / 3, 0),           # (1,2) discordant, (1,3) (2,3) agree
    ([[1, 2], [3, 4]], [[1, 2, 3, 4]], 0.5, 1, 2 / 3, 1, 0),  # merge: every label 2/4 precise
    ([[1, 2, 3, 4]], [[1, 2], [3, 4]], 1, 0.5, 2 / 3, 1, 0),  # split: recall 2/4, (1,2) (3,4) agree
    ([[1, 2], [3, 4]], [[1, 3], [2, 4]], 0.5, 0.5, 0.5, 0, 0),  # no comparable pair: tau 0
    ([[1, 2, 3], [4, 5]], [[4, 5], [3, 1, 2]], 1, 1, 1, (1 / 3 + 1) / 2, 0.5),
    ([[1], [2, 3]], [[1], [2, 3]], 1, 1, 1, 0.5, 1.0),      # single-unit paper: tau 0 for it
]


@pytest.mark.parametrize("gold,reply,p,r,f1,tau,exact", HAND)
def test_hand_computed(gold, reply, p, r, f1, tau, exact):
    reward, m = analyze_ordering(boxed(reply), gold)
    assert m["parsed_ok"] == 1.0
    assert m["grouping_precision"] == pytest.approx(p, abs=1e-12)
    assert m["grouping_recall"] == pytest.approx(r, abs=1e-12)
    assert m["grouping_f1"] == pytest.approx(f1, abs=1e-12)
    assert m["norm_kendall_tau"] == pytest.approx(tau, abs=1e-12)
    assert m["paper_exact_match"] == pytest.approx(exact, abs=1e-12)
    assert reward == pytest.approx(f1 * tau, abs=1e-12)


def test_flat_list_for_several_papers_is_one_group():
    _, m = analyze_ordering(boxed([1, 2, 3, 4]), [[1, 2], [3, 4]])
    assert m["grouping_precision"] == 0.5 and m["grouping_recall"] == 1.0


@pytest.mark.parametrize("seq,expected", [([], 0), ([1], 0), ([1, 2, 3], 0), ([3, 2, 1], 3),
                                          ([2, 4, 1, 3, 5], 3), ([5, 4, 3, 2, 1, 0], 15)])
def test_count_inversions(seq, expected):
    assert count_inversions(seq) == expected


def random_case(rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
    """A random gold and a reply built by one of several mistakes (or none)."""
    gold = random_gold(rng, max_papers=6, max_units=25)
    mode = rng.choice(["exact", "random_groups", "merge", "split", "partial", "shuffle_within"])
    groups = [list(t) for t in gold]
    if mode == "random_groups":
        flat = [x for t in gold for x in t]
        rng.shuffle(flat)
        k = rng.randint(1, len(flat))
        cuts = sorted(rng.sample(range(1, len(flat)), k - 1)) if k > 1 else []
        groups = [flat[a:b] for a, b in zip([0, *cuts], [*cuts, len(flat)], strict=True)]
    elif mode == "merge" and len(groups) > 1:
        a, b = rng.sample(range(len(groups)), 2)
        merged = groups[a] + groups[b]
        rng.shuffle(merged) if rng.random() < 0.5 else None
        groups = [g for j, g in enumerate(groups) if j not in (a, b)] + [merged]
    elif mode == "split":
        j = rng.randrange(len(groups))
        g = groups.pop(j)
        if len(g) > 1:
            c = rng.randint(1, len(g) - 1)
            groups += [g[:c], g[c:]]
        else:
            groups.append(g)
    elif mode == "partial":
        for g in groups:
            for _ in range(rng.randint(0, 3)):
                if len(g) > 1:
                    x = rng.randrange(len(g) - 1)
                    g[x], g[x + 1] = g[x + 1], g[x]
    elif mode == "shuffle_within":
        for g in groups:
            rng.shuffle(g)
    rng.shuffle(groups)
    return gold, groups


def test_fast_agrees_with_naive_on_thousands_of_cases():
    rng = random.Random(20261130)
    for _ in range(3000):
        gold, groups = random_case(rng)
        fast = score_partition(groups, gold)
        slow = naive_metrics(groups, gold)
        for key, value in slow.items():
            assert abs(fast[key] - value) <= 1e-12, (key, gold, groups)


@st.composite
def gold_and_reply(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    return random_case(random.Random(seed))


@settings(max_examples=300, deadline=None)
@given(gold_and_reply())
def test_property_reward_bounded_and_reply_roundtrip(case):
    gold, groups = case
    reward, m = analyze_ordering(boxed(groups), gold)
    assert m["parsed_ok"] == 1.0
    assert 0.0 <= reward <= 1.0 + 1e-12
    assert all(0.0 <= v <= 1.0 + 1e-12 for v in m.values())
    assert reward == pytest.approx(m["grouping_f1"] * m["norm_kendall_tau"], abs=1e-15)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(2, 30), min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_property_oracle_scores_one_and_reverse_zero(sizes, rnd):
    labels = list(range(1, sum(sizes) + 1))
    rnd.shuffle(labels)
    gold = split_by_sizes(labels, sizes)
    reward, m = analyze_ordering(boxed(gold if len(gold) > 1 else gold[0]), gold)
    assert reward == 1.0 and m["paper_exact_match"] == 1.0
    reward, m = analyze_ordering(boxed([t[::-1] for t in gold]), gold)
    assert reward == 0.0 and m["grouping_f1"] == 1.0


def test_random_order_has_expected_tau_one_half():
    rng = random.Random(7)
    gold = [list(range(1, 41))]
    taus = []
    for _ in range(400):
        perm = list(gold[0])
        rng.shuffle(perm)
        taus.append(analyze_ordering(boxed(perm), gold)[1]["norm_kendall_tau"])
    assert abs(sum(taus) / len(taus) - 0.5) < 0.02
