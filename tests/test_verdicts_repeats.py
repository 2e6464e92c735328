"""The verdict's two newer questions, as pure functions: a task without a reference solution
(the oracle frozen out of it) is runtime-tested only — ``no_reference_solution`` when every
control rejects, ``invalid_task_or_verifier`` when one passes — and the oracle's repeats
(``oracle_repeats``): every one must pass, a mix is a flaky verifier with its counts, all
failing is the oracle's failure; plus the claim that counts the first apart."""

from __future__ import annotations

import itertools
import random

import pytest

from environment.protocol import Finding
from validate.core.records import REASON_ORDER
from validate.evidence.verdicts import Outcome, Rule, decide

RULES = {"oracle": Rule("oracle", 1.0), "nop": Rule("control", 1.0), "reader": Rule("control", 1.0)}
BOTH = ["oracle", "nop", "reader"]
NO_ORACLE = ["nop", "reader"]  # `Expectations.required` of a task whose skip names the oracle
WHY = "no solution/solve.sh: the task ships no reference solution"


def o(agent, reward=None, sample=0, attempt=1, status="ok"):
    if reward is None and status != "scorer_error":
        reward = 1.0 if agent == "oracle" else 0.0
    error = "VerifierError" if status == "scorer_error" else None
    return Outcome(agent, attempt, status, reward, error, error and "reward.txt: missing", sample)


def d(attempts, required=BOTH, repeats=1, findings=()):
    return decide(attempts, required, RULES, 1.0, "strict", list(findings), oracle_repeats=repeats,
                  no_reference=None if "oracle" in required else WHY)


# --- no reference solution -----------------------------------------------------------------

def test_the_reason_sits_after_the_run_s_findings_and_before_the_contract_s_own():
    order = list(REASON_ORDER)
    assert order.index("oracle_fails_on_valid_task") < order.index("no_reference_solution") \
        < order.index("no_negative_control")
    assert order.index("invalid_task_or_verifier") < order.index("no_reference_solution")


def test_every_control_rejecting_is_runtime_tested_only_never_compatible():
    v = d([o("nop"), o("reader")], required=NO_ORACLE)
    assert (v.verdict, v.reason, v.missing) == ("excluded", "no_reference_solution", [])
    assert "runtime-tested only" in v.detail and WHY in v.detail
    assert v.oracle_reward is None and v.margin is None and v.max_control_reward == 0.0


def test_a_control_that_passes_wins_over_the_missing_reference():
    v = d([o("nop"), o("reader", reward=1.0)], required=NO_ORACLE)
    assert (v.verdict, v.reason) == ("excluded", "invalid_task_or_verifier")
    assert "control reader passed" in v.detail
    v = d([o("nop", status="scorer_error"), o("reader")], required=NO_ORACLE)  # a verifier error too
    assert (v.verdict, v.reason) == ("excluded", "invalid_task_or_verifier")
    v = d([o("nop"), o("reader")], required=NO_ORACLE,
          findings=[Finding(kind="k", blocking=True, detail="broken")])
    assert (v.verdict, v.reason, v.detail) == ("excluded", "invalid_task_or_verifier", "broken")


def test_controls_not_all_run_yet_is_incomplete_not_a_verdict():
    """A control still to run could pass (invalid): the missing reference alone decides nothing."""
    v = d([o("nop")], required=NO_ORACLE)
    assert (v.verdict, v.reason, v.missing) == ("incomplete", None, ["reader"])


def test_an_oracle_attempt_on_a_task_it_is_frozen_out_of_is_not_read():
    v = d([o("oracle", reward=0.0), o("nop"), o("reader")], required=NO_ORACLE)
    assert (v.verdict, v.reason, v.oracle_reward) == ("excluded", "no_reference_solution", None)


def test_with_every_control_frozen_out_too_the_missing_reference_is_the_reason():
    v = d([], required=[])
    assert (v.verdict, v.reason) == ("excluded", "no_reference_solution")


# --- oracle repeats --------------------------------------------------------------------------

def test_one_repeat_decides_exactly_as_before():
    v = d([o("oracle"), o("nop"), o("reader")])
    assert (v.verdict, v.detail) == ("compatible", "oracle passed; every control rejected")
    v = d([o("oracle", reward=0.0), o("nop"), o("reader")])
    assert (v.reason, v.detail) == ("oracle_fails_on_valid_task", "oracle status ok, reward 0.0 < 1.0")
    # a sample the contract does not ask for is not read
    v = d([o("oracle"), o("oracle", reward=0.0, sample=1), o("nop"), o("reader")])
    assert v.verdict == "compatible"


@pytest.mark.parametrize("outcomes", list(itertools.product([0.0, 1.0], repeat=3)))
def test_three_repeats_every_mix_of_pass_and_fail(outcomes):
    attempts = [o("oracle", reward=r, sample=i) for i, r in enumerate(outcomes)] + [o("nop"), o("reader")]
    v = d(attempts, repeats=3)
    k = int(sum(outcomes))
    if k == 3:
        assert (v.verdict, v.detail) == ("compatible", "oracle passed all 3 repeats; every control rejected")
    elif k == 0:
        assert (v.verdict, v.reason) == ("excluded", "oracle_fails_on_valid_task")
        assert "passed 0 of 3 repeats" in v.detail
    else:
        assert (v.verdict, v.reason) == ("excluded", "invalid_task_or_verifier")
        assert v.detail == f"flaky: the oracle passed {k} of 3 repeats"
    assert v.oracle_reward == min(outcomes)  # the worst repeat


def test_missing_repeats_are_missing_evidence_and_only_they():
    v = d([o("oracle", sample=0), o("oracle", sample=2), o("nop"), o("reader")], repeats=3)
    assert (v.verdict, v.missing) == ("incomplete", ["oracle"]) and "oracle (3 repeats)" in v.detail
    # a mix already seen decides, whatever the repeats still to run would show
    v = d([o("oracle", sample=0), o("oracle", reward=0.0, sample=1)], repeats=3)
    assert (v.reason, v.detail) == ("invalid_task_or_verifier",
                                    "flaky: the oracle passed 1 of 2 repeats (1 not run yet)")


def test_each_repeat_is_judged_on_its_final_try():
    retried = [o("oracle", sample=1, attempt=1, status="infrastructure_error"),
               o("oracle", sample=1, attempt=2)]
    attempts = [o("oracle", sample=0), *retried, o("nop"), o("reader")]
    assert d(attempts, repeats=2).reason == "infrastructure_failure"  # strict: the exception excludes
    v = decide(attempts, BOTH, RULES, 1.0, "retry", [], oracle_repeats=2)
    assert (v.verdict, v.retried) == ("compatible", True)
    assert "oracle repeat 2 try 1" in d(attempts, repeats=2).detail


def test_a_verifier_error_on_one_repeat_is_the_verifier_s():
    v = d([o("oracle", sample=0), o("oracle", sample=1, status="scorer_error"), o("nop"), o("reader")],
          repeats=2)
    assert v.reason == "invalid_task_or_verifier" and "oracle repeat 2: scorer raised" in v.detail


def test_a_coin_flip_verifier_is_classed_flaky_at_five_repeats_with_probability_15_16():
    """The sample task flaky-test fails each verifier run with probability 1/2: at 5 repeats
    the verdict is flaky unless all five agree (2/32 = 1/16)."""
    rng = random.Random(20261202)
    trials = 4000
    flaky = 0
    for _ in range(trials):
        attempts = [o("oracle", reward=float(rng.random() < 0.5), sample=i) for i in range(5)]
        v = d([*attempts, o("nop"), o("reader")], repeats=5)
        flaky += v.reason == "invalid_task_or_verifier" and v.detail.startswith("flaky")
    assert abs(flaky / trials - 15 / 16) < 0.02


# --- resume: only the missing repeats are played again ----------------------------------------

def test_a_resume_plays_only_the_repeats_not_yet_final():
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from validate.core.records import Attempt
    from validate.run.context import Play
    from validate.run.runner import pending
    from validate.sandbox import Limits

    manifest = SimpleNamespace(
        sha256="sha256:x", expectations=SimpleNamespace(oracle_repeats=4),
        execution=SimpleNamespace(limits=Limits()),
        tasks=[SimpleNamespace(idx=0, skip={}), SimpleNamespace(idx=1, skip={"oracle": WHY})])
    agents = [SimpleNamespace(name="oracle", role="oracle"), SimpleNamespace(name="nop", role="control")]

    def row(idx, agent, sample, status="ok", attempt=1):
        return Attempt(run_id="r", phase="run", task_id=f"t{idx}", idx=idx, task_hash="h", agent=agent,
                       role="oracle" if agent == "oracle" else "control", sample=sample, attempt=attempt,
                       status=status, started_at=datetime.now(UTC), workspace_sha256="w", backend="docker",
                       image_digest="d")

    done = [row(0, "oracle", 0), row(0, "oracle", 2, status="infrastructure_error"), row(0, "nop", 0)]
    play = Play("run", manifest, None, [0, 1], agents, kind=None)
    got = sorted((s.idx, s.agent, s.sample, s.attempt) for s in pending(done, play))
    assert got == [(0, "oracle", 1, 1), (0, "oracle", 2, 2), (0, "oracle", 3, 1), (1, "nop", 0, 1)]
    # the model's plays
    evaluated = Play("run", manifest, None, [0], agents, kind=None, samples=2, skips=False)
    assert evaluated.samples_of(agents[0]) == 2
