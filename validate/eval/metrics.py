"""Eval metrics as pure functions: final samples in, numbers with honest denominators out.

A *sample* is the final (non-superseded) attempt of one (phase, task, sample). It is
**valid** when the agent's own run decided it (`validate.core.records.AGENT_STATUSES`: answered,
no answer, crashed, timed out, out of memory, reply too large) — a model's or agent's own
failure is a valid, unsolved sample. It is **lost** otherwise, with its reason: lost to
infrastructure after its retries, a harness error, a verifier (scorer) error, an
unsupported execution contract, or missing (never ran, e.g. an interrupted run). Lost
samples are counted and shown, never dropped silently and never counted as the model's
failure. A sample is **solved** when valid and its reward reaches the pass threshold.

- Deterministic pass@1 (phase ``eval-greedy``): solved / valid, with the lost count beside
  it and the conservative solved / all tasks.
- Sampled (phase ``eval``, k samples a task): a task with fewer than k valid samples is
  listed with its reason and left out of pass@k, pass^k, the mean sample accuracy and the
  zero-variance count. Over the others: pass@k by the unbiased estimator
  1 − C(n−c, k)/C(n, k), pass^k = C(c, k)/C(n, k) (all k solved), the mean sample accuracy
  c/n, and the gap pass@k − mean accuracy (exploration headroom). A zero-variance group is a
  task whose k rewards are all equal: no within-group signal for RL.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from fractions import Fraction
from math import comb
from typing import NamedTuple

from pydantic import BaseModel, Field

from environment.protocol import exact_reward
from validate.core.records import (
    AGENT_STATUSES,
    HARNESS_ERROR,
    INFRASTRUCTURE_ERROR,
    SCORER_ERROR,
    UNSUPPORTED_EXECUTION_CONTRACT,
)

LOST_REASONS = {
    INFRASTRUCTURE_ERROR: "lost to infrastructure after its retries",
    HARNESS_ERROR: "harness error",
    SCORER_ERROR: "verifier (scorer) error",
    UNSUPPORTED_EXECUTION_CONTRACT: "unsupported execution contract",
}
GREEDY_PHASE = "eval-greedy"
SAMPLED_PHASE = "eval"


class Sample(NamedTuple):
    """What the metrics need of one final attempt."""

    phase: str
    task_id: str
    family: str
    sample: int
    status: str
    reward: float | None
    #: The reward's exact text where its float misreads it (`Attempt.reward_decimal`).
    reward_decimal: str | None = None


def is_valid(status: str) -> bool:
    return status in AGENT_STATUSES


def lost_reason(status: str) -> str | None:
    """Why a sample does not count, or None for a valid one."""
    return None if is_valid(status) else LOST_REASONS.get(status, f"status {status}")


def solved(status: str, reward: float | None, threshold: float, decimal: str | None = None) -> bool:
    """The one "solved" rule: a valid attempt whose reward reaches the pass threshold (a
    missing or NaN reward never does), compared as the numbers they were written as
    (`decimal`: the reward's exact text where its float misreads it; `exact_reward`)."""
    return is_valid(status) and reward is not None and reward == reward \
        and exact_reward(reward, decimal) >= exact_reward(threshold)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c solved: 1 − C(n−c, k)/C(n, k); needs n ≥ k."""
    _check(n, c, k)
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k (all k of k draws solved): C(c, k)/C(n, k); needs n ≥ k."""
    _check(n, c, k)
    return float(Fraction(comb(c, k), comb(n, k)))


def _check(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 ≤ c ≤ n and 1 ≤ k ≤ n; got n={n}, c={c}, k={k}")


class TaskEval(BaseModel):
    """One task of the sampled pass."""

    task_id: str = Field(description="The task.")
    family: str = Field(description="Its family.")
    n_valid: int = Field(description="Valid samples.")
    n_lost: int = Field(description="Samples lost (not the model's doing), or missing.")
    lost: list[str] = Field(default_factory=list, description="The reason of each lost sample, sorted.")
    solved: int = Field(description="Valid samples whose reward reached the threshold.")
    rewards: list[float | None] = Field(description="Each sample's reward by sample number (None: "
                                                    "lost or missing).")
    eligible: bool = Field(description="At least k valid samples: counted in pass@k and zero variance.")
    excluded_reason: str | None = Field(default=None, description="Why not eligible.")
    pass_at_k: float | None = Field(default=None, description="Unbiased pass@k (eligible only).")
    pass_hat_k: float | None = Field(default=None, description="Unbiased pass^k (eligible only).")
    accuracy: float | None = Field(default=None, description="solved / n_valid.")
    mean_reward: float | None = Field(default=None, description="Mean reward of the valid samples.")
    best_reward: float | None = Field(default=None,
                                      description="Highest reward of the valid samples (best of k).")
    reward_std: float | None = Field(default=None, description="Population standard deviation of the valid "
                                                               "samples' rewards: the group's RL signal.")
    zero_variance: bool | None = Field(default=None, description="All k rewards equal (eligible only).")


def task_eval(task_id: str, family: str, samples: Sequence[Sample], k: int, threshold: float) -> TaskEval:
    by_number = {s.sample: s for s in samples}
    rewards: list[float | None] = []
    lost: list[str] = []
    valid = []
    for i in range(k):
        s = by_number.get(i)
        why = "missing (never ran)" if s is None else lost_reason(s.status)
        if why is None:
            valid.append(s)
            rewards.append(s.reward if s.reward is not None else 0.0)
        else:
            lost.append(why)
            rewards.append(None)
    n, c = len(valid), sum(solved(s.status, s.reward, threshold, s.reward_decimal) for s in valid)
    out = dict(task_id=task_id, family=family, n_valid=n, n_lost=k - n, lost=sorted(lost), solved=c,
               rewards=rewards, accuracy=c / n if n else None,
               mean_reward=statistics.fmean(r for r in rewards if r is not None) if n else None,
               best_reward=max((r for r in rewards if r is not None), default=None),
               reward_std=statistics.pstdev(r for r in rewards if r is not None) if n else None)
    if n < k:
        reasons = ", ".join(f"{lost.count(why)} {why}" for why in sorted(set(lost)))
        return TaskEval(**out, eligible=False, excluded_reason=f"{n}/{k} valid samples ({reasons})")
    kept = [r for r in rewards if r is not None]
    return TaskEval(**out, eligible=True, pass_at_k=pass_at_k(n, c, k), pass_hat_k=pass_hat_k(n, c, k),
                    zero_variance=len(set(kept)) == 1)


class Rate(BaseModel):
    """A fraction with its numerator and denominator."""

    value: float | None = Field(description="numerator / denominator (None when the denominator is 0).")
    numerator: float = Field(description="Count (or sum) over the counted items.")
    denominator: int = Field(description="How many items were counted.")


def rate(num: float, den: int) -> Rate:
    return Rate(value=num / den if den else None, numerator=num, denominator=den)


class GreedyMetrics(BaseModel):
    tasks: int = Field(description="Tasks in the frozen set.")
    valid: int = Field(description="Tasks whose greedy sample is valid.")
    lost: dict[str, int] = Field(description="Tasks whose greedy sample was lost, by reason.")
    solved: int = Field(description="Valid greedy samples that reached the threshold.")
    pass_at_1: Rate = Field(description="solved / valid.")
    pass_at_1_all: Rate = Field(description="solved / all tasks (lost counted as unsolved): a lower bound.")
    mean_reward: Rate = Field(description="Mean reward over valid greedy samples.")


class SampledMetrics(BaseModel):
    k: int = Field(description="Samples per task.")
    tasks: int = Field(description="Tasks in the frozen set.")
    eligible: int = Field(description="Tasks with k valid samples.")
    excluded: list[tuple[str, str]] = Field(description="(task, reason) of each task left out of pass@k.")
    samples_lost: dict[str, int] = Field(description="Lost samples over all tasks, by reason.")
    pass_at_k: Rate = Field(description="Mean unbiased pass@k over eligible tasks.")
    pass_hat_k: Rate = Field(description="Mean pass^k (all k solved) over eligible tasks.")
    mean_accuracy: Rate = Field(description="Mean sample accuracy c/n over eligible tasks.")
    headroom: float | None = Field(description="pass@k − mean accuracy: exploration headroom.")
    mean_reward: Rate = Field(description="Mean reward over the eligible tasks' samples.")
    best_reward: Rate = Field(description="Mean best-of-k reward over eligible tasks: pass@k's analogue for "
                                          "the reward itself.")
    reward_std: Rate = Field(description="Mean within-task reward standard deviation over eligible tasks.")
    zero_variance: int = Field(description="Eligible tasks whose k rewards are all equal.")
    zero_variance_solved: int = Field(description="... all solved.")
    zero_variance_failed: int = Field(description="... all unsolved.")
    zero_variance_tasks: list[str] = Field(description="Those tasks, sorted.")


def greedy_metrics(samples: Iterable[Sample], task_ids: Sequence[str], threshold: float) -> GreedyMetrics:
    final = {s.task_id: s for s in samples if s.phase == GREEDY_PHASE and s.sample == 0}
    lost: dict[str, int] = {}
    valid = []
    for tid in task_ids:
        s = final.get(tid)
        why = "missing (never ran)" if s is None else lost_reason(s.status)
        if why is None:
            valid.append(s)
        else:
            lost[why] = lost.get(why, 0) + 1
    c = sum(solved(s.status, s.reward, threshold, s.reward_decimal) for s in valid)
    return GreedyMetrics(tasks=len(task_ids), valid=len(valid), lost=dict(sorted(lost.items())), solved=c,
                         pass_at_1=rate(c, len(valid)), pass_at_1_all=rate(c, len(task_ids)),
                         mean_reward=rate(sum(s.reward or 0.0 for s in valid), len(valid)))


def sampled_metrics(tasks: Sequence[TaskEval], k: int) -> SampledMetrics:
    ok = [t for t in tasks if t.eligible]
    lost: dict[str, int] = {}
    for t in tasks:
        for why in t.lost:
            lost[why] = lost.get(why, 0) + 1
    zero = sorted(t.task_id for t in ok if t.zero_variance)
    p_k = rate(sum(t.pass_at_k for t in ok), len(ok))
    acc = rate(sum(t.accuracy for t in ok), len(ok))
    return SampledMetrics(
        k=k, tasks=len(tasks), eligible=len(ok), excluded=sorted((t.task_id, t.excluded_reason) for t in tasks
                                                                 if not t.eligible),
        samples_lost=dict(sorted(lost.items())), pass_at_k=p_k,
        pass_hat_k=rate(sum(t.pass_hat_k for t in ok), len(ok)), mean_accuracy=acc,
        headroom=None if p_k.value is None else p_k.value - acc.value,
        mean_reward=rate(sum(t.mean_reward for t in ok), len(ok)),
        best_reward=rate(sum(t.best_reward for t in ok), len(ok)),
        reward_std=rate(sum(t.reward_std for t in ok), len(ok)), zero_variance=len(zero),
        zero_variance_solved=sum(1 for t in ok if t.zero_variance and t.solved == t.n_valid),
        zero_variance_failed=sum(1 for t in ok if t.zero_variance and t.solved == 0),
        zero_variance_tasks=zero)


class FamilyRow(BaseModel):
    family: str = Field(description="The family.")
    tasks: int = Field(description="Tasks of the family.")
    greedy_pass_at_1: Rate = Field(description="Greedy solved / valid.")
    greedy_mean_reward: Rate = Field(description="Mean greedy reward over valid samples.")
    pass_at_k: Rate = Field(description="Mean pass@k over eligible tasks.")
    mean_accuracy: Rate = Field(description="Mean sample accuracy over eligible tasks.")
    mean_reward: Rate = Field(description="Mean sampled reward over eligible tasks.")


def family_rows(greedy: Sequence[Sample], tasks: Sequence[TaskEval], threshold: float) -> list[FamilyRow]:
    families = sorted({t.family for t in tasks} | {s.family for s in greedy})
    out = []
    for f in families:
        g = [s for s in greedy if s.family == f and is_valid(s.status)]
        mine = [t for t in tasks if t.family == f]
        ok = [t for t in mine if t.eligible]
        out.append(FamilyRow(
            family=f, tasks=len({t.task_id for t in mine} | {s.task_id for s in greedy if s.family == f}),
            greedy_pass_at_1=rate(sum(solved(s.status, s.reward, threshold, s.reward_decimal) for s in g),
                                  len(g)),
            greedy_mean_reward=rate(sum(s.reward or 0.0 for s in g), len(g)),
            pass_at_k=rate(sum(t.pass_at_k for t in ok), len(ok)),
            mean_accuracy=rate(sum(t.accuracy for t in ok), len(ok)),
            mean_reward=rate(sum(t.mean_reward for t in ok), len(ok))))
    return out


def final_attempts(rows: Iterable) -> list:
    """The final attempt of each (phase, task, sample) among `rows` (attempts with phase,
    task_id, sample, attempt): its highest try, in key order. The one selection of final
    attempts; it agrees with `validate.core.records.Attempt.superseded` as the journal sets it,
    but reads only the try numbers, so a stored flag is never trusted."""
    best: dict[tuple[str, str, int], object] = {}
    for r in rows:
        key = (r.phase, r.task_id, int(r.sample))
        if key not in best or r.attempt > best[key].attempt:
            best[key] = r
    return [best[k] for k in sorted(best)]


def samples_of(final: Iterable, family_of: dict[str, str]) -> list[Sample]:
    """The `Sample` of each of `final` (see `final_attempts`); a NaN reward reads as None."""
    return [Sample(r.phase, r.task_id, family_of.get(r.task_id, "?"), int(r.sample), r.status,
                   None if r.reward is None or r.reward != r.reward else float(r.reward),
                   _decimal(r)) for r in final]


def _decimal(row) -> str | None:
    """A row's ``reward_decimal`` (None where its evidence has no such column, or a NaN there)."""
    value = getattr(row, "reward_decimal", None)
    return value if isinstance(value, str) else None
