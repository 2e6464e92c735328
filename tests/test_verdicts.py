"""The verdict functions are pure: every reason, its precedence, incomplete evidence, both
exception rules, and the dataset verdict from the protocol's criteria."""

from __future__ import annotations

import itertools

import pytest

from environment.protocol import Finding
from validate.evidence.verdicts import CRITERIA, Outcome, Rule, RunFacts, dataset_verdict, decide

RULES = {"oracle": Rule("oracle", 1.0), "empty": Rule("control", 1.0), "shuffled": Rule("control", 0.5),
         "probe": Rule("probe", 1.0), "random": Rule("control", 0.3, "mean")}
REQUIRED = ["oracle", "empty", "shuffled"]


def o(agent, status="ok", reward=None, attempt=1, error=None):
    if reward is None and status in ("ok", "no_reply", "exit_nonzero", "timeout", "oom"):
        reward = 1.0 if agent == "oracle" else 0.0
    return Outcome(agent, attempt, status, reward, error and "E", error)


def d(attempts, findings=(), rule="strict", required=REQUIRED):
    return decide(attempts, required, RULES, 1.0, rule, list(findings))


def test_compatible_needs_every_named_agent_in_the_run():
    full = [o("oracle"), o("empty"), o("shuffled", reward=0.3)]
    v = d(full)
    assert (v.verdict, v.reason, v.missing) == ("compatible", None, [])
    assert v.margin == pytest.approx(0.7) and v.max_control_agent == "shuffled"
    for drop in range(3):
        part = full[:drop] + full[drop + 1:]
        v = d(part)
        assert v.verdict == "incomplete" and v.reason is None and v.missing == [REQUIRED[drop]]


def test_only_the_oracle_ran_is_incomplete_not_compatible():
    v = d([o("oracle")])
    assert v.verdict == "incomplete" and v.missing == ["empty", "shuffled"]
    assert "no attempt in this run for empty, shuffled" in v.detail


def test_what_is_missing_has_one_order_whatever_the_order_of_required():
    """The run judges with the contract it froze, the audit with the one it reads back (keys
    sorted): the same task must give the same `missing` and detail either way."""
    a, b = d([o("oracle")], required=["oracle", "shuffled", "empty"]), d([o("oracle")], required=REQUIRED)
    assert (a.missing, a.detail) == (b.missing, b.detail) == (["empty", "shuffled"], b.detail)


def test_an_oracle_failure_decides_even_without_controls():
    v = d([o("oracle", reward=0.4)])
    assert (v.verdict, v.reason) == ("excluded", "oracle_fails_on_valid_task")


def test_a_control_passing_decides_even_when_others_are_missing():
    v = d([o("oracle"), o("shuffled", reward=0.6)])  # ceiling 0.5
    assert (v.verdict, v.reason) == ("excluded", "invalid_task_or_verifier")
    assert "control shuffled passed (reward 0.6000 ≥ ceiling 0.5000)" in v.detail


def test_strict_rule_counts_superseded_exceptions():
    tries = [o("oracle", "infrastructure_error", None, 1, "daemon gone"), o("oracle", attempt=2),
             o("empty"), o("shuffled", reward=0.1)]
    strict = d(tries)
    assert (strict.verdict, strict.reason) == ("excluded", "infrastructure_failure")
    assert "strict exception rule" in strict.detail and "daemon gone" in strict.detail
    retry = d(tries, rule="retry")
    assert (retry.verdict, retry.retried) == ("compatible", True)
    assert "after an infrastructure retry" in retry.detail
    clean = d([o("oracle"), o("empty"), o("shuffled", reward=0.1)], rule="retry")
    assert not clean.retried


def test_harness_errors_are_exceptions_too():
    v = d([o("oracle"), o("empty", "harness_error", None, 1, "RecursionError"), o("shuffled")], rule="retry")
    assert v.reason == "infrastructure_failure" and "harness_error" in v.detail


def test_reason_precedence_is_total():
    """Every combination of the four causes gives exactly the first reason in order."""
    causes = {
        "infrastructure_failure": o("empty", "infrastructure_error", None, 1, "x"),
        "unsupported_execution_contract": o("shuffled", "unsupported_execution_contract", None),
        "invalid_task_or_verifier": Finding(kind="k", blocking=True, detail="bad"),
        "oracle_fails_on_valid_task": o("oracle", reward=0.2),
    }
    order = list(causes)
    for n in range(1, 5):
        for combo in itertools.combinations(order, n):
            attempts = {"oracle": o("oracle"), "empty": o("empty"), "shuffled": o("shuffled")}
            findings = []
            for c in combo:
                if isinstance(causes[c], Finding):
                    findings.append(causes[c])
                else:
                    attempts[causes[c].agent] = causes[c]
            v = d(list(attempts.values()), findings)
            assert v.reason == combo[0], (combo, v)


def test_non_blocking_findings_are_notes_and_probes_are_not_required():
    v = d([o("oracle"), o("empty"), o("shuffled", reward=0.2), o("probe", reward=0.5)],
          [Finding(kind="n", blocking=False, detail="a note")])
    assert v.verdict == "compatible" and v.detail.endswith("; a note")


def test_a_control_with_no_reply_or_a_crash_is_rejected_but_scorer_error_is_invalid():
    v = d([o("oracle"), o("empty", "no_reply"), o("shuffled", "exit_nonzero", reward=0.2)])
    assert v.verdict == "compatible"
    v = d([o("oracle"), o("empty", "scorer_error", None, 1, "boom"), o("shuffled")])
    assert v.reason == "invalid_task_or_verifier" and "scorer raised" in v.detail


# --- the dataset verdict ---------------------------------------------------------------

POOL = ("complete", "minimum", "one_reason", "patches", "dataset_findings", "smoke")


def facts(**kw):
    base = dict(tasks=10, compatible=10, excluded=0, incomplete=0, min_task_count=9, smoke="passed")
    return RunFacts(**{**base, **kw})


def test_pass_only_when_every_required_criterion_is_met():
    v = dataset_verdict(facts(), POOL)
    assert v.verdict == "PASS" and v.evidence == "complete" and [c.name for c in v.criteria] == list(POOL)
    assert v.headline == "Dataset verdict: PASS"


@pytest.mark.parametrize("change, verdict, criterion", [
    (dict(smoke="not run"), "INCOMPLETE", "smoke"),
    (dict(smoke="failed"), "FAIL", "smoke"),
    (dict(interrupted=True), "INCOMPLETE", "complete"),
    (dict(compatible=8, incomplete=2), "INCOMPLETE", "complete"),
    (dict(compatible=8, excluded=2), "FAIL", "minimum"),
    (dict(excluded=1, compatible=9, excluded_without_one_reason=1), "FAIL", "one_reason"),
    (dict(patch="undocumented"), "FAIL", "patches"),
    (dict(blocking_dataset_findings=["modal answer covers 6/11"]), "FAIL", "dataset_findings"),
])
def test_each_criterion_decides(change, verdict, criterion):
    v = dataset_verdict(facts(**change), POOL)
    assert v.verdict == verdict
    assert next(c for c in v.criteria if c.name == criterion).status != "met"


def test_a_pool_below_its_minimum_fails_and_says_its_evidence_is_incomplete():
    f = facts(compatible=0, excluded=7, incomplete=3, smoke="not run", note="controls never ran")
    v = dataset_verdict(f, POOL)
    assert v.verdict == "FAIL" and v.evidence == "INCOMPLETE"
    assert "INCOMPLETE" in v.headline and "controls never ran" in v.headline


def test_a_run_is_not_held_to_criteria_it_does_not_require():
    v = dataset_verdict(facts(smoke="not run"), ("complete", "minimum"))
    assert v.verdict == "PASS" and {c.name for c in v.criteria} == {"complete", "minimum"}
    assert set(CRITERIA) >= set(POOL)


def test_a_chance_level_control_hitting_one_task_is_a_note_not_an_exclusion():
    v = d([o("oracle"), o("empty"), o("shuffled", reward=0.1), o("random", reward=1.0)],
          required=[*REQUIRED, "random"])
    assert v.verdict == "compatible" and "a chance-level control, judged on its mean" in v.detail
    assert v.max_control_agent == "random" and v.margin == 0.0


def test_a_control_that_cannot_test_a_task_is_not_required_for_it():
    v = d([o("oracle"), o("empty")], required=["oracle", "empty"])
    assert v.verdict == "compatible"


def test_chance_controls_fail_the_dataset_on_their_mean():
    required = ("complete", "chance_controls")
    assert dataset_verdict(facts(chance_controls={"random": (0.12, 0.3)}), required).verdict == "PASS"
    v = dataset_verdict(facts(chance_controls={"random": (0.42, 0.3)}), required)
    assert v.verdict == "FAIL" and "random mean 0.4200 ≥ 0.3000" in v.headline


# --- tampering, sabotage and the trusted verifier (task directories) ---------------------------

TRIAL_RULES = {"oracle": Rule("oracle", 1.0), "nop": Rule("control", 1.0, baseline=True),
               "reader": Rule("control", 1.0), "tamper": Rule("control", 1.0, tampers=True)}
TRIAL_REQUIRED = ["oracle", "nop", "reader", "tamper"]


def t(agent, status="ok", reward=None, error=None, shared=None, planted=None):
    if reward is None and status == "ok":
        reward = 1.0 if agent == "oracle" else 0.0
    return Outcome(agent, 1, status, reward, error and "VerifierError", error, 0, None, shared, planted)


def td(attempts):
    return decide(attempts, TRIAL_REQUIRED, TRIAL_RULES, 1.0, "strict", [])


def test_a_tampering_control_that_passes_makes_the_task_hackable_naming_what_it_planted():
    v = td([t("oracle"), t("nop"), t("reader"), t("tamper", reward=1.0, planted="/app/conftest.py")])
    assert (v.verdict, v.reason, v.oracle_certified) == ("excluded", "invalid_task_or_verifier", True)
    assert "control tamper passed" in v.detail and "tampering control" in v.detail
    assert "it planted /app/conftest.py" in v.detail
    # another control's pass is a defect of the task itself: not oracle-certified
    v = td([t("oracle"), t("nop"), t("reader", reward=1.0), t("tamper", reward=1.0, planted="/x")])
    assert (v.reason, v.oracle_certified) == ("invalid_task_or_verifier", False)
    # and it is named first: a task nop passes is named for nop, not for what tampering then got
    v = td([t("oracle"), t("tamper", reward=1.0, planted="/x"), t("nop", reward=1.0), t("reader")])
    assert v.detail.startswith("control nop passed") and "control tamper passed" in v.detail, v.detail
    v = td([t("oracle"), t("nop"), t("reader"), t("tamper")])
    assert (v.verdict, v.oracle_certified) == ("compatible", True)


def test_a_verifier_a_control_broke_is_its_own_rejection_when_the_oracle_and_nop_verified_cleanly():
    broken = t("tamper", "scorer_error", None, error="timeout: test.sh ran past its 60 s timeout")
    v = td([t("oracle"), t("nop"), t("reader"), broken])
    assert (v.verdict, v.reason) == ("compatible", None), v.detail
    assert "control tamper left the verifier without a reward" in v.detail and "its own sabotage" in v.detail
    # nop's verifier failed too: the verifier is the task's defect
    v = td([t("oracle"), t("nop", "scorer_error", None, error="timeout"), t("reader"), broken])
    assert (v.verdict, v.reason) == ("excluded", "invalid_task_or_verifier")
    assert "tamper: scorer raised" in v.detail
    # the oracle's failed: no witness either
    v = td([t("oracle", "scorer_error", None, error="missing"), t("nop"), t("reader"), broken])
    assert v.reason == "invalid_task_or_verifier" and "tamper: scorer raised" in v.detail


def test_an_oracle_that_passes_only_in_its_own_container_needs_system_changes():
    v = td([t("oracle", reward=0.0, shared=1.0), t("nop"), t("reader"), t("tamper")])
    assert (v.verdict, v.reason, v.oracle_certified) == ("excluded", "needs_system_changes", True)
    assert "passes it in its own container (reward 1.0)" in v.detail
    v = td([t("oracle", reward=0.0, shared=0.0), t("nop"), t("reader"), t("tamper")])
    assert (v.reason, v.oracle_certified) == ("oracle_fails_on_valid_task", False)
    v = td([t("oracle", reward=0.0), t("nop"), t("reader"), t("tamper")])  # never replayed
    assert v.reason == "oracle_fails_on_valid_task"
@pytest.mark.parametrize("decimal,threshold,passes", [
    ("0.99999999999999999999", 1.0, False),  # its nearest float is 1.0
    ("1.0", 1.0, True),
    ("0.69999999999999999", 0.7, False),  # the float 0.7 is below it; the contract's 0.7 is above it
    ("0.70000000000000001", 0.7, True),
    ("1E-400", 0.0, True),  # its nearest float is 0.0, and it is above 0
])
def test_a_reward_is_held_to_the_threshold_as_the_number_it_was_written_as(decimal, threshold, passes):
    from decimal import Decimal

    from validate.evidence.verdicts import as_expected

    f = float(Decimal(decimal))
    assert as_expected(Rule("oracle", 1.0), "ok", f, threshold, decimal) is passes
    oracle = Outcome("oracle", 1, "ok", f, None, None, 0, decimal)
    v = decide([oracle, o("empty"), o("shuffled", reward=0.0)], REQUIRED, RULES, threshold, "strict", [])
    assert (v.verdict == "compatible") is passes
    if not passes:
        assert v.reason == "oracle_fails_on_valid_task" and f"reward {decimal} < {threshold}" in v.detail


def test_a_control_a_hair_under_its_ceiling_stays_under_it():
    from validate.evidence.verdicts import as_expected

    assert as_expected(Rule("control", 0.5), "ok", 0.5, 1.0, "0.49999999999999999999")
    assert not as_expected(Rule("control", 0.5), "ok", 0.5, 1.0)
    # Floats alone compare exactly as they always did.
    assert [as_expected(Rule("oracle", 1.0), "ok", r, 0.7) for r in (0.7, 0.6999999999999999)] == [
        True,
        False,
    ]


def test_a_nan_reward_or_a_reward_text_that_is_no_number_never_raises():
    """Evidence edited by hand: a NaN reward is as expected of no agent (as a float compare said);
    a reward_decimal that is no finite number is not read (the audit names it), never a raise."""
    from validate.evidence.verdicts import as_expected

    nan = float("nan")
    assert [as_expected(Rule(role, 1.0), "ok", nan, 1.0) for role in ("oracle", "control", "probe")] == [
        False
    ] * 3
    assert as_expected(Rule("oracle", 1.0), "ok", 1.0, 1.0, "not a number")
    assert as_expected(Rule("oracle", 1.0), "ok", 1.0, 1.0, "NaN")
