"""Eval metrics (`validate.eval.metrics`): the estimators against brute-force enumeration,
the honest denominators (a model's failure counts, an infrastructure loss never does), and
zero-variance groups."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, strategies as st

from validate.eval.metrics import (
    GREEDY_PHASE,
    SAMPLED_PHASE,
    Sample,
    family_rows,
    final_attempts,
    greedy_metrics,
    pass_at_k,
    pass_hat_k,
    sampled_metrics,
    samples_of,
    solved,
    task_eval,
)


def brute(n: int, c: int, k: int) -> tuple[float, float]:
    """(P(some draw solved), P(every draw solved)) over every k-subset of n samples, c solved."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    some = sum(any(outcomes[i] for i in s) for s in subsets)
    every = sum(all(outcomes[i] for i in s) for s in subsets)
    return some / len(subsets), every / len(subsets)


def test_the_estimators_equal_brute_force_enumeration_for_every_small_case():
    for n in range(1, 10):
        for c in range(n + 1):
            for k in range(1, n + 1):
                some, every = brute(n, c, k)
                assert pass_at_k(n, c, k) == pytest.approx(some, abs=1e-12), (n, c, k)
                assert pass_hat_k(n, c, k) == pytest.approx(every, abs=1e-12), (n, c, k)


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_hat_k_le_accuracy_le_pass_at_k(case):
    n, c, k = case
    assert pass_hat_k(n, c, k) <= c / n + 1e-12
    assert c / n <= pass_at_k(n, c, k) + 1e-12
    if n - c < k:  # every k-subset holds a solved sample
        assert pass_at_k(n, c, k) == 1.0
    if c < k:
        assert pass_hat_k(n, c, k) == 0.0


@pytest.mark.parametrize("n,c,k", [(3, 1, 4), (0, 0, 1), (4, 5, 2), (4, -1, 2), (4, 2, 0)])
def test_impossible_counts_are_refused(n, c, k):
    with pytest.raises(ValueError, match="need 0 ≤ c ≤ n"):
        pass_at_k(n, c, k)


def s(task="t", sample=0, status="ok", reward=1.0, phase=SAMPLED_PHASE, family="f") -> Sample:
    return Sample(phase, task, family, sample, status, reward)


def test_a_models_own_failure_is_a_valid_unsolved_sample():
    samples = [s(sample=0, reward=1.0), s(sample=1, status="no_reply", reward=0.0),
               s(sample=2, status="timeout", reward=0.0), s(sample=3, status="exit_nonzero", reward=0.0)]
    t = task_eval("t", "f", samples, 4, 1.0)
    assert t.eligible and t.n_valid == 4 and t.solved == 1 and t.n_lost == 0
    assert t.pass_at_k == 1.0 and t.pass_hat_k == 0.0 and t.accuracy == 0.25 and not t.zero_variance


def test_a_sample_lost_to_infrastructure_leaves_the_task_out_of_pass_at_k_with_its_reason():
    samples = [s(sample=i) for i in range(3)] + [s(sample=3, status="infrastructure_error", reward=None)]
    t = task_eval("t", "f", samples, 4, 1.0)
    assert not t.eligible and t.pass_at_k is None and t.zero_variance is None
    assert t.n_valid == 3 and t.n_lost == 1 and t.lost == ["lost to infrastructure after its retries"]
    assert t.excluded_reason == "3/4 valid samples (1 lost to infrastructure after its retries)"
    assert t.rewards == [1.0, 1.0, 1.0, None]


def test_missing_harness_and_verifier_losses_are_named():
    samples = [s(sample=0, status="harness_error", reward=None),
               s(sample=1, status="scorer_error", reward=None)]
    t = task_eval("t", "f", samples, 3, 1.0)
    assert t.lost == ["harness error", "missing (never ran)", "verifier (scorer) error"]
    assert t.accuracy is None and t.mean_reward is None


def test_zero_variance_means_equal_rewards_not_equal_solved_flags():
    same = task_eval("a", "f", [s("a", i, reward=0.5) for i in range(4)], 4, 1.0)
    differ = task_eval("b", "f", [s("b", i, reward=0.5 + i / 100) for i in range(4)], 4, 1.0)
    assert same.zero_variance and same.solved == 0
    assert not differ.zero_variance and differ.solved == 0


def test_sampled_metrics_keep_denominators_and_count_zero_variance_groups():
    k = 4
    tasks = [task_eval("all", "x", [s("all", i) for i in range(k)], k, 1.0),
             task_eval("none", "x", [s("none", i, reward=0.0) for i in range(k)], k, 1.0),
             task_eval("half", "y", [s("half", i, reward=float(i % 2)) for i in range(k)], k, 1.0),
             task_eval("lost", "y", [s("lost", i, status="infrastructure_error", reward=None)
                                     for i in range(k)], k,
                       1.0)]
    m = sampled_metrics(tasks, k)
    assert (m.tasks, m.eligible) == (4, 3)
    assert m.excluded == [("lost", "0/4 valid samples (4 lost to infrastructure after its retries)")]
    assert m.samples_lost == {"lost to infrastructure after its retries": 4}
    assert m.pass_at_k.value == pytest.approx(2 / 3) and m.pass_at_k.denominator == 3
    assert m.pass_hat_k.value == pytest.approx(1 / 3)
    assert m.mean_accuracy.value == pytest.approx((1 + 0 + 0.5) / 3)
    assert m.headroom == pytest.approx(2 / 3 - 0.5)
    assert (m.zero_variance, m.zero_variance_solved, m.zero_variance_failed) == (2, 1, 1)
    assert m.zero_variance_tasks == ["all", "none"]


def test_greedy_pass_at_1_states_valid_lost_and_the_lower_bound():
    greedy = [s("a", phase=GREEDY_PHASE), s("b", phase=GREEDY_PHASE, reward=0.3),
              s("c", phase=GREEDY_PHASE, status="infrastructure_error", reward=None),
              s("e", phase=GREEDY_PHASE, status="no_reply", reward=0.0)]
    g = greedy_metrics(greedy, ["a", "b", "c", "d", "e"], 1.0)
    assert (g.tasks, g.valid, g.solved) == (5, 3, 1)
    assert g.lost == {"lost to infrastructure after its retries": 1, "missing (never ran)": 1}
    assert g.pass_at_1.value == pytest.approx(1 / 3) and g.pass_at_1_all.value == pytest.approx(1 / 5)
    assert g.mean_reward.value == pytest.approx(1.3 / 3)


def test_final_samples_take_the_last_try_of_each_sample():
    class A:
        def __init__(self, sample, attempt, status, reward):
            self.phase, self.task_id, self.sample, self.attempt = SAMPLED_PHASE, "t", sample, attempt
            self.status, self.reward = status, reward

    rows = [A(0, 2, "ok", 1.0), A(0, 1, "infrastructure_error", None), A(1, 1, "ok", float("nan"))]
    out = samples_of(final_attempts(rows), {"t": "fam"})
    assert out == [Sample(SAMPLED_PHASE, "t", "fam", 0, "ok", 1.0),
                   Sample(SAMPLED_PHASE, "t", "fam", 1, "ok", None)]


def test_family_rows_split_greedy_and_sampled_by_family():
    k = 2
    tasks = [task_eval("a", "x", [s("a", i, family="x") for i in range(k)], k, 1.0),
             task_eval("b", "y", [s("b", i, reward=0.0, family="y") for i in range(k)], k, 1.0)]
    greedy = [s("a", phase=GREEDY_PHASE, family="x"), s("b", phase=GREEDY_PHASE, family="y", reward=0.2)]
    rows = {r.family: r for r in family_rows(greedy, tasks, 1.0)}
    assert (
        rows["x"].greedy_pass_at_1.value == 1.0 and rows["x"].pass_at_k.value == 1.0 and rows["x"].tasks == 1
    )
    assert rows["y"].greedy_pass_at_1.value == 0.0 and rows["y"].greedy_mean_reward.value == pytest.approx(
        0.2
    )
    assert rows["y"].pass_at_k.value == 0.0


@pytest.mark.parametrize("status,reward,expected", [
    ("ok", 1.0, True), ("ok", 0.99, False), ("timeout", 1.0, True), ("no_reply", None, False),
    ("ok", float("nan"), False), ("infrastructure_error", 1.0, False), ("scorer_error", 1.0, False),
])
def test_solved_is_a_valid_attempt_reaching_the_threshold(status, reward, expected):
    assert solved(status, reward, 1.0) is expected
