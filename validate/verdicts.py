"""Attempts in, one verdict out: a pure function with one reason per excluded task.

A task is **compatible** iff the oracle passes (status ok, reward ≥ threshold), every
control is rejected (reward under its ceiling, with no harness-side error), no attempt had
an infrastructure exception, and no blocking finding applies. Otherwise exactly one
reason, the first that applies of: infrastructure_failure, unsupported_execution_contract,
invalid_task_or_verifier, oracle_fails_on_valid_task.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from validate.contract import Expectations
from validate.findings import Finding
from validate.records import AGENT_STATUSES, Attempt


class Outcome(NamedTuple):
    """What a verdict needs of an attempt (an `Attempt` has the same attributes); small
    enough to keep one per (task, agent) for a whole pool."""

    agent: str
    status: str
    reward: float | None
    as_expected: bool
    error_class: str | None
    error_message: str | None
    phase: str

    @classmethod
    def of(cls, a: Attempt) -> Outcome:
        return cls(a.agent, a.status, a.reward, a.as_expected, a.error_class, a.error_message, a.phase)


def outcome_as_expected(agent: str, status: str, reward: float | None, exp: Expectations,
                        expect: str = "reject") -> bool:
    """The oracle passes; a control stays under its ceiling; a probe lands strictly between
    0 and the oracle's threshold (the pilot also compares it with the controls)."""
    if agent == "oracle":
        return status == "ok" and reward is not None and reward >= exp.oracle_min_reward
    if expect == "partial":
        return status == "ok" and reward is not None and 0.0 < reward < exp.oracle_min_reward
    return status in AGENT_STATUSES and (reward or 0.0) < exp.ceiling(agent)


def decide(final: Iterable[Attempt | Outcome], agents: list[str], exp: Expectations,
           findings: list[Finding]) -> tuple[str | None, str]:
    """``(reason or None, detail)`` from each agent's final (non-superseded) attempt."""
    by_agent = {a.agent: a for a in final}
    notes = [f.detail for f in findings if not f.blocking]

    def verdict(reason: str | None, detail: str) -> tuple[str | None, str]:
        return reason, "; ".join([detail, *notes]) if notes else detail

    missing = [a for a in agents if a not in by_agent]
    infra = [a for a in by_agent.values() if a.status == "infrastructure_error"]
    if missing or infra:
        parts = [f"no attempt recorded for {', '.join(missing)}"] if missing else []
        parts += [f"{a.agent}: {a.error_class}: {a.error_message}" for a in infra]
        return verdict("infrastructure_failure", "; ".join(parts))
    unsupported = [a for a in by_agent.values() if a.status == "unsupported_execution_contract"]
    if unsupported:
        return verdict("unsupported_execution_contract", unsupported[0].error_message or "")
    invalid = [f.detail for f in findings if f.blocking]
    invalid += [f"{a.agent}: scorer raised {a.error_class}: {a.error_message}"
                for a in by_agent.values() if a.status == "scorer_error"]
    invalid += [f"control {a.agent} passed (reward {a.reward:.4f} ≥ ceiling {exp.ceiling(a.agent):.4f})"
                for a in by_agent.values()
                if a.agent != "oracle" and a.status in AGENT_STATUSES and not a.as_expected]
    if invalid:
        return verdict("invalid_task_or_verifier", "; ".join(invalid))
    oracle = by_agent.get("oracle")
    if oracle is None:
        return verdict(None, "every control rejected (the oracle was not part of this run)")
    if not oracle.as_expected:
        return verdict("oracle_fails_on_valid_task",
                       f"oracle status {oracle.status}, reward {oracle.reward} < {exp.oracle_min_reward}")
    return verdict(None, "oracle passed; every control rejected")
