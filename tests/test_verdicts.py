"""The verdict function: pure, one reason per excluded task, in the documented precedence."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from validate.contract import Expectations
from validate.findings import Finding
from validate.records import REASON_ORDER, Attempt
from validate.verdicts import decide, outcome_as_expected

EXP = Expectations(control_max_reward=dict.fromkeys(["empty", "shuffled", "identity", "reversed"]))
AGENTS = ["oracle", "empty", "shuffled", "identity", "reversed"]


def att(agent, status="ok", reward=None):
    if reward is None:
        reward = 1.0 if agent == "oracle" else 0.1
    return Attempt(run_id="r", phase="p", task_id="t", idx=0, task_hash="h", agent=agent,
                   expect="pass" if agent == "oracle" else "reject", attempt=1, status=status,
                   reward=None if status in ("infrastructure_error", "unsupported_execution_contract", "scorer_error") else reward,
                   as_expected=outcome_as_expected(agent, status, reward, EXP),
                   started_at=datetime.now(UTC), workspace_sha256="w", backend="b", image_digest="d",
                   error_class="E", error_message="boom")


BLOCKING = Finding(kind="single_unit_paper", blocking=True, detail="a paper has one unit")
NOTE = Finding(kind="duplicate_units", blocking=False, detail="two units share a text")

# Each fault hits its own agent, and gives this reason on its own.
FAULTS = {
    "infra": ("infrastructure_failure", att("reversed", "infrastructure_error")),
    "unsupported": ("unsupported_execution_contract", att("empty", "unsupported_execution_contract")),
    "control_passes": ("invalid_task_or_verifier", att("shuffled", reward=1.0)),
    "scorer": ("invalid_task_or_verifier", att("identity", "scorer_error")),
    "oracle_low": ("oracle_fails_on_valid_task", att("oracle", reward=0.9)),
}


def good():
    return [att("oracle"), att("empty", reward=0.0), att("shuffled"), att("identity"), att("reversed")]


def test_all_good_is_compatible_and_notes_are_kept():
    assert decide(good(), AGENTS, EXP, [])[0] is None
    reason, detail = decide(good(), AGENTS, EXP, [NOTE])
    assert reason is None and "two units share a text" in detail


@pytest.mark.parametrize("combo", [c for n in range(1, 4) for c in itertools.combinations(FAULTS, n)])
def test_precedence_over_every_combination(combo):
    faulty = {FAULTS[f][1].agent: FAULTS[f][1] for f in combo}
    attempts = [faulty.get(a.agent, a) for a in good()]
    expected = min((FAULTS[f][0] for f in combo), key=REASON_ORDER.index)
    assert decide(attempts, AGENTS, EXP, [])[0] == expected


def test_missing_attempt_is_infrastructure():
    reason, detail = decide(good()[:4], AGENTS, EXP, [])
    assert reason == "infrastructure_failure" and "no attempt recorded for reversed" in detail


def test_blocking_finding_makes_the_task_invalid_even_when_agents_behave():
    reason, detail = decide(good(), AGENTS, EXP, [BLOCKING])
    assert reason == "invalid_task_or_verifier" and "one unit" in detail


def test_oracle_must_exit_cleanly_and_reach_the_threshold():
    assert not outcome_as_expected("oracle", "timeout", 1.0, EXP)
    assert not outcome_as_expected("oracle", "ok", 0.999, EXP)
    assert outcome_as_expected("oracle", "ok", 1.0, EXP)
    assert outcome_as_expected("empty", "timeout", 0.0, EXP)       # an agent's failure is still a rejection
    assert not outcome_as_expected("empty", "scorer_error", None, EXP)
    ceiling = Expectations(control_max_reward={"identity": 0.5})
    assert not outcome_as_expected("identity", "ok", 0.5, ceiling)
    assert outcome_as_expected("identity", "ok", 0.49, ceiling)


def test_a_controls_only_run_is_judged_on_its_controls():
    controls = good()[1:]
    assert decide(controls, AGENTS[1:], EXP, [])[0] is None
    passing = FAULTS["control_passes"][1]
    with_pass = [passing if a.agent == passing.agent else a for a in controls]
    assert decide(with_pass, AGENTS[1:], EXP, [])[0] == "invalid_task_or_verifier"
