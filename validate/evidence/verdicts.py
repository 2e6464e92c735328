"""Verdicts as pure functions: a task's attempts in, one task verdict out; a run's facts in,
one dataset verdict out. No I/O, so `validate audit` re-derives both from the evidence.

A task is **compatible** iff at least one control the contract names can test it (is not
frozen out of it) and, in this run, the oracle and every such control have a final attempt,
the oracle passes, every control stays under its ceiling, no blocking finding applies, and
there was no exception (under the contract's exception rule). It is
**excluded** with exactly one reason, the first that applies of `REASON_ORDER`, when the
evidence already decides it, and **incomplete** (neither) when an agent the contract names
never ran and nothing else decided it.

Oracle repeats (the contract's ``oracle_repeats``, N): the oracle is played N times per task,
as samples 0..N-1, and every repeat must pass. A mix (some pass, some fail) is a flaky
verifier, ``invalid_task_or_verifier`` with the counts; all failing is
``oracle_fails_on_valid_task``; with one repeat every verdict is what it always was.

No reference solution: a task the environment froze the oracle out of (a Harbor task without
``solution/solve.sh``) cannot be oracle-certified. Its controls still run; when every one
rejects it is ``excluded`` / ``no_reference_solution`` (runtime-tested only, counted apart). A
control that passes, a verifier error or a blocking finding makes it
``invalid_task_or_verifier`` instead: that is a fault of the task, which a missing reference
does not excuse.

Tampering and sabotage (task directories): a tampering control (`Rule.tampers`) that passes
makes the task ``invalid_task_or_verifier`` naming what it planted — the reward can be had
without doing the task. A control whose verifier gave no reward (it hung, failed, found no
shell) is that control's own rejection — its sabotage — when the oracle's every repeat and
every baseline control (`Rule.baseline`, nop) verified cleanly on the task; a verifier that
fails after the oracle and nop alike stays the task's defect. An oracle whose trusted verifier
did not pass but passed when replayed in its own container (`Outcome.shared_reward`) needs
the system changes it made outside its work paths: ``needs_system_changes``, never compatible
(oracle-certified in its own container, never hack-resistant). `Decision.oracle_certified`
says whether the oracle certified the task whatever the tampering controls did (the claim's N;
its compatible tasks are the hack-resistant H).

Exception rules: ``strict`` (the default) excludes a task with any infrastructure or harness
exception in the run, superseded ones included; ``retry`` (declared at freeze) looks at each
agent's final attempt only, and the verdict records that the task passed only after a retry.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field

from environment.protocol import Finding, exact_reward
from validate.core.records import (
    AGENT_STATUSES,
    COMPATIBLE,
    CONTROL,
    EXCEPTION_STATUSES,
    EXCLUDED,
    INCOMPLETE,
    INFRASTRUCTURE_FAILURE,
    INVALID_TASK_OR_VERIFIER,
    NEEDS_SYSTEM_CHANGES,
    NO_NEGATIVE_CONTROL,
    NO_REFERENCE_SOLUTION,
    OK,
    ORACLE,
    ORACLE_FAILS_ON_VALID_TASK,
    PROBE,
    SCORER_ERROR,
    UNSUPPORTED_CONTRACT,
    UNSUPPORTED_EXECUTION_CONTRACT,
    Reason,
    Role,
    Status,
    Verdict,
)


class Rule(NamedTuple):
    """What the contract expects of one agent."""

    role: Role
    ceiling: float
    #: ``task``: the ceiling holds on every task; ``mean``: on the control's mean over the run.
    scope: str = "task"
    #: A tampering control (`AgentSpec.tampers`): its pass makes the task hackable.
    tampers: bool = False
    #: A control that changes nothing (`AgentSpec.baseline`): with the oracle, the witness that
    #: the task's verifier runs cleanly when nothing is sabotaged.
    baseline: bool = False


class Outcome(NamedTuple):
    """What a verdict needs of an attempt (an `Attempt` has these attributes); small enough
    to keep one per attempt of a whole pool."""

    agent: str
    attempt: int
    status: Status
    reward: float | None
    error_class: str | None
    error_message: str | None
    #: Which repeat of (task, agent) it is: the oracle's repeats (``oracle_repeats``) are samples.
    sample: int = 0
    #: The reward's exact text where its float misreads it (`Attempt.reward_decimal`): what is compared.
    reward_decimal: str | None = None
    #: A trial's reward from the verifier replayed in the agent's own container (`Attempt.shared_reward`).
    shared_reward: float | None = None
    #: The paths a trial's agent changed that its verifier may have seen (`Attempt.planted`).
    planted: str | None = None

    @classmethod
    def of(cls, a) -> Outcome:
        # The few names (agents, statuses, error classes) shared, not one string per attempt.
        return cls(sys.intern(a.agent), a.attempt, sys.intern(a.status), a.reward,
                   None if a.error_class is None else sys.intern(a.error_class), a.error_message, a.sample,
                   a.reward_decimal, getattr(a, "shared_reward", None), getattr(a, "planted", None))

    @property
    def shown(self) -> str:
        """The reward as words give it: its exact text where the float misreads it."""
        return self.reward_decimal or str(self.reward)


def outcomes_of(attempts: Iterable) -> Iterator[tuple[str, str, Outcome]]:
    """(phase, task id, outcome) of each attempt, as `validate.evidence.journal.Journal.outcomes`
    gives them."""
    for a in attempts:
        yield a.phase, a.task_id, Outcome.of(a)


#: Each task's outcomes in some phases, for some task ids, in their order (``[]`` for a task
#: with none): what a run's verdicts are decided from. `Journal.outcomes_by_task` is one;
#: `by_task` makes one of (phase, task id, outcome) triples.
TaskOutcomes = Callable[[Collection[str], Iterable[str]], Iterator[list[Outcome]]]


def by_task(attempts: Iterable[tuple[str, str, Outcome]]) -> TaskOutcomes:
    """`TaskOutcomes` of (phase, task id, outcome) triples (as `outcomes_of` gives them), read
    once per call and all held, grouped by task, before the first task's are given."""
    def grouped(phases: Collection[str], task_ids: Iterable[str]) -> Iterator[list[Outcome]]:
        held: dict[str, list[Outcome]] = {}
        for phase, task_id, outcome in attempts:
            if phase in phases:
                held.setdefault(task_id, []).append(outcome)
        for task_id in task_ids:
            yield held.pop(task_id, [])
    return grouped


def as_expected(rule: Rule, status: Status, reward: float | None, pass_threshold: float,
                decimal: str | None = None) -> bool:
    """The oracle passes; a control stays under its ceiling; a probe lands strictly between 0
    and the pass threshold (the pilot also compares it with the controls). The reward is
    compared as the number it was written as (`decimal`, its exact text, where the float
    misreads it), the threshold and ceiling as theirs (`environment.protocol.exact_reward`)."""
    if reward is not None and reward != reward:  # NaN: reaches nothing and stays under nothing
        return False
    got = None if reward is None else exact_reward(reward, decimal)
    if rule.role == ORACLE:
        return status == OK and got is not None and got >= exact_reward(pass_threshold)
    if rule.role == PROBE:
        return status == OK and got is not None and 0 < got < exact_reward(pass_threshold)
    return status in AGENT_STATUSES and (got if got is not None else 0) < exact_reward(rule.ceiling)


class Decision(NamedTuple):
    verdict: Verdict
    reason: Reason | None
    missing: list[str]
    detail: str
    oracle_reward: float | None
    max_control_reward: float | None
    max_control_agent: str | None
    margin: float | None
    retried: bool
    #: The oracle passed (in its own container, for ``needs_system_changes``) and every control
    #: but the tampering ones rejected, nothing else wrong: what the claim's N counts.
    oracle_certified: bool = False


def _final(attempts: Iterable[Outcome], rules: dict[str, Rule],
           oracle_repeats: int) -> tuple[list[Outcome], dict[tuple[str, int], Outcome]]:
    """Every attempt that counts, and the final (latest) try of each (agent, sample). The
    oracle counts on its first `oracle_repeats` samples, every other agent on sample 0 only
    (a run draws no further samples of them)."""
    every = [a for a in attempts if a.sample < (oracle_repeats if rules[a.agent].role == ORACLE else 1)]
    final: dict[tuple[str, int], Outcome] = {}
    for a in every:
        key = (a.agent, a.sample)
        if key not in final or a.attempt > final[key].attempt:
            final[key] = a
    return every, final  # in the attempts' order, as the details list them


def no_control_can_test(required: Sequence[str], rules: dict[str, Rule]) -> str | None:
    """Why no negative control can test a task, or None. `rules` are the contract's agents;
    `required` the oracle and the controls not frozen out of this task. A rule set without any
    control is an oracle-only judgement (the pool's freeze step), not a contract: a contract
    naming none is refused when it is frozen and when it is read (`validate.contract.manifest`)."""
    named = sorted(n for n, r in rules.items() if r.role == CONTROL)
    if not named or any(rules[n].role == CONTROL for n in required if n in rules):
        return None
    return (f"no negative control can test this task: every control the contract names ({', '.join(named)}) "
            "is frozen out of it, so nothing shows that a wrong answer fails here")


def _oracle_repeats(oracle: list[Outcome], rules: dict[str, Rule], pass_threshold: float,
                    oracle_repeats: int) -> tuple[str | None, str | None]:
    """(a flaky verifier's detail, an oracle failure's detail) from the oracle's final try of
    each repeat that ran; both None when every repeat that ran passed. A mix of passes and
    fails is the verifier's (or the task's) nondeterminism, never the oracle's failure."""
    passed = [as_expected(rules[a.agent], a.status, a.reward, pass_threshold, a.reward_decimal)
              for a in oracle]
    if not oracle or all(passed):
        return None, None
    ran = f"{len(oracle)} repeats" + (f" ({oracle_repeats - len(oracle)} not run yet)"
                                      if len(oracle) < oracle_repeats else "")
    if any(passed):
        return f"flaky: the oracle passed {sum(passed)} of {ran}", None
    first = oracle[0]
    detail = f"oracle status {first.status}, reward {first.shown} < {pass_threshold}"
    return None, detail + (f"; it passed 0 of {ran}" if oracle_repeats > 1 else "")


def decide(attempts: Iterable[Outcome], required: Sequence[str], rules: dict[str, Rule],
           pass_threshold: float, exception_rule: str, findings: Sequence[Finding], oracle_repeats: int = 1,
           no_reference: str | None = None) -> Decision:
    """One task's verdict from all its attempts in the run (superseded included). `required`:
    the oracle and the controls the contract names that apply to this task; an oracle not in
    it was frozen out of the task (`no_reference`: the environment's reason), which is then
    runtime-tested only. `oracle_repeats`: the oracle's samples, each of which must pass."""
    every, final = _final(attempts, rules, oracle_repeats)
    notes = [f.detail for f in findings if not f.blocking]
    oracle_named = next((n for n, r in rules.items() if r.role == ORACLE), None)
    certifies = oracle_named is not None and oracle_named in required
    oracle = sorted((a for a in final.values() if rules[a.agent].role == ORACLE), key=lambda a: a.sample) \
        if certifies else []
    controls = [a for a in final.values() if rules[a.agent].role == CONTROL and a.reward is not None]
    top = max(controls, key=lambda a: (a.reward, a.agent), default=None)
    rewards = [a.reward for a in oracle if a.reward is not None]
    o_reward = min(rewards) if rewards else None  # the worst repeat: what every repeat reached
    margin = o_reward - top.reward if o_reward is not None and top is not None else None

    def verdict(kind: Verdict, reason: Reason | None, detail: str, missing: Sequence[str] = (),
                retried: bool = False, certified: bool = False) -> Decision:
        return Decision(kind, reason, list(missing), "; ".join([detail, *notes]), o_reward,
                        top.reward if top else None, top.agent if top else None, margin, retried, certified)

    pool = every if exception_rule == "strict" else list(final.values())
    exceptions = [a for a in pool if a.status in EXCEPTION_STATUSES]
    if exceptions:
        parts = [f"{_who(a, oracle_repeats, rules)} try {a.attempt}: {a.status}: {a.error_class}: "
                 f"{a.error_message}"
                 for a in exceptions]
        if any(a is not final[(a.agent, a.sample)] for a in exceptions):
            parts.append("strict exception rule: an exception excludes the task even when a retry passed")
        return verdict(EXCLUDED, INFRASTRUCTURE_FAILURE, "; ".join(parts))
    unsupported = [a for a in final.values() if a.status == UNSUPPORTED_EXECUTION_CONTRACT]
    if unsupported:
        return verdict(EXCLUDED, UNSUPPORTED_CONTRACT, unsupported[0].error_message or "")
    flaky, fails = _oracle_repeats(oracle, rules, pass_threshold, oracle_repeats)
    needs = _needs_system(oracle, pass_threshold) if fails else None
    sabotage = _sabotaged(final, oracle, rules, required, certifies)
    notes += [f"control {a.agent} left the verifier without a reward ({a.error_message}): its own sabotage, "
              f"counted as its rejection (the oracle and {', '.join(sabotage[a.agent])} verified cleanly)"
              for a in final.values() if a.agent in sabotage]
    others, tampered = _invalid(final, rules, pass_threshold, findings, notes, oracle_repeats, sabotage)
    invalid = others + ([flaky] if flaky else []) + tampered
    # the oracle certified it whatever the tampering controls did (the claim's N)
    certified = (
        certifies
        and not flaky
        and (not fails or needs is not None)
        and not others
        and not _undecided(
            final, every, required, rules, certifies, no_reference, oracle_repeats, verdict
        ).missing
    )
    if invalid:
        return verdict(EXCLUDED, INVALID_TASK_OR_VERIFIER, "; ".join(invalid), certified=certified)
    if needs is not None:
        return verdict(EXCLUDED, NEEDS_SYSTEM_CHANGES, needs, certified=certified)
    if fails:
        return verdict(EXCLUDED, ORACLE_FAILS_ON_VALID_TASK, fails)
    return _undecided(final, every, required, rules, certifies, no_reference, oracle_repeats, verdict)


def _who(a: Outcome, oracle_repeats: int, rules: dict[str, Rule]) -> str:
    """An attempt's agent, and its repeat where the oracle has several."""
    if oracle_repeats > 1 and rules[a.agent].role == ORACLE:
        return f"{a.agent} repeat {a.sample + 1}"
    return a.agent


def _invalid(final: dict[tuple[str, int], Outcome], rules: dict[str, Rule], pass_threshold: float,
             findings: Sequence[Finding], notes: list[str], oracle_repeats: int,
             sabotage: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """Why the task or its verifier is invalid whatever the oracle did: (blocking findings, a
    scorer (verifier) error that is no control's sabotage, a control at or over its ceiling
    (a chance-level one: a note); the tampering controls that passed). The caller names the
    first list first: a task that nop passes is named for nop, whatever the tampering
    controls then also got."""
    tampered, invalid = [], [f.detail for f in findings if f.blocking]
    invalid += [f"{_who(a, oracle_repeats, rules)}: scorer raised {a.error_class}: {a.error_message}"
                for a in final.values() if a.status == SCORER_ERROR and a.agent not in sabotage]
    for a in final.values():
        rule = rules[a.agent]
        if rule.role == CONTROL and a.status in AGENT_STATUSES \
                and not as_expected(rule, a.status, a.reward, pass_threshold, a.reward_decimal):
            hit = f"control {a.agent} passed (reward {a.reward:.4f} ≥ ceiling {rule.ceiling:.4f})"
            if rule.scope == "mean":
                notes.append(f"{hit}: a chance-level control, judged on its mean over the run")
            elif rule.tampers:
                tampered.append(f"{hit}: a tampering control — the reward can be had without doing the task; "
                                f"it planted {a.planted or 'nothing the harness saw'}")
            else:
                invalid.append(hit)
    return invalid, tampered


def _sabotaged(final: dict[tuple[str, int], Outcome], oracle: list[Outcome], rules: dict[str, Rule],
               required: Sequence[str], certifies: bool) -> dict[str, list[str]]:
    """The controls whose verifier gave no reward (a verifier error) while the oracle's every
    repeat and every baseline control the task requires verified cleanly (a usable reward):
    each control's name → the baselines that witness it. None without such witnesses."""
    baselines = sorted(n for n in required if n in rules and rules[n].baseline)
    clean = lambda a: a is not None and a.status in AGENT_STATUSES and a.reward is not None  # noqa: E731
    if not certifies or not oracle or not baselines or not all(clean(a) for a in oracle) \
            or not all(clean(final.get((n, 0))) for n in baselines):
        return {}
    return {a.agent: baselines for a in final.values()
            if rules[a.agent].role == CONTROL and not rules[a.agent].baseline and a.status == SCORER_ERROR
            and a.error_class == "VerifierError"}


def _needs_system(oracle: list[Outcome], pass_threshold: float) -> str | None:
    """When every oracle repeat failed its trusted verifier yet passed replayed in its own
    container: why the task needs the agent's system changes (None otherwise)."""
    if not oracle or not all(a.shared_reward is not None and a.shared_reward >= pass_threshold
                             for a in oracle):
        return None
    first = oracle[0]
    return (
        f"the reference solution fails its verifier in a fresh container of the task's image (reward "
        f"{first.reward}) and passes it in its own container (reward {first.shared_reward}): the verifier "
        f"needs what the solution changed outside the task's work paths, so no tampering control can be "
        f"shown to fail it — not hack-resistant (validate it with --verifier-mode shared to certify it "
        f"without that claim)"
    )


def _undecided(final, every, required, rules, certifies, no_reference, oracle_repeats, verdict) -> Decision:
    """The verdict once nothing the run found excludes the task: no control can test it, the
    oracle cannot certify it (runtime-tested only), evidence is missing, or compatible."""
    untestable = no_control_can_test(required, rules)
    why = no_reference or "the oracle is frozen out of this task"
    if untestable and not certifies:  # nothing can run: the task's own missing reference is the reason
        return verdict(EXCLUDED, NO_REFERENCE_SOLUTION, f"no reference solution ({why}), and {untestable}")
    if untestable:
        return verdict(EXCLUDED, NO_NEGATIVE_CONTROL, untestable)
    ran = {agent for agent, _ in final}
    # one order, whatever the dict order of `required`
    missing = sorted(name for name in required if name not in ran)
    if certifies:
        short = sum(1 for agent, _ in final if rules[agent].role == ORACLE) < oracle_repeats
        oracle = next(n for n, r in rules.items() if r.role == ORACLE)
        if short and oracle not in missing:
            missing = sorted([*missing, oracle])
    if missing:
        what = ", ".join(f"{n} ({oracle_repeats} repeats)" if oracle_repeats > 1 and rules[n].role == ORACLE
                         else n
                         for n in missing)
        return verdict(INCOMPLETE, None, f"no attempt in this run for {what}", missing)
    if not certifies:
        return verdict(EXCLUDED, NO_REFERENCE_SOLUTION,
                       f"no reference solution ({why}): runtime-tested only — every control rejected, the "
                       "oracle was never played")
    retried = any(a.status in EXCEPTION_STATUSES for a in every)
    passed = "oracle passed" + (f" all {oracle_repeats} repeats" if oracle_repeats > 1 else "")
    return verdict(COMPATIBLE, None, f"{passed}; every control rejected"
                   + (" (after an infrastructure retry)" if retried else ""), retried=retried, certified=True)


# --- the dataset verdict ---------------------------------------------------------------

#: Every criterion a phase can be held to, in the order reports list them.
CRITERIA: dict[str, str] = {
    "complete": "every task has a final verdict (no incomplete task; the run was not interrupted)",
    "every_task_compatible": "every sampled task is compatible (a control that passes fails the pilot)",
    "minimum": "compatible tasks reach the contract's minimum count",
    "one_reason": "every excluded task has exactly one reason in the exclusion ledger",
    "patches": "the code that ran is a commit, or its patch is stored and documented",
    "dataset_findings": "no blocking finding over the dataset as a whole",
    "probes": "every partial-credit probe scored strictly between the controls and the oracle",
    "chance_controls": "every chance-level control's mean reward over the run stays under its ceiling",
    "smoke": "the fresh-materialisation smoke test passed",
}


class RunFacts(BaseModel):
    """What the dataset verdict is decided from (all counted from the evidence)."""

    tasks: int
    compatible: int
    excluded: int
    incomplete: int
    interrupted: bool = False
    min_task_count: int
    excluded_without_one_reason: int = 0
    patch: Literal["none", "documented", "undocumented"] = "none"
    blocking_dataset_findings: list[str] = Field(default_factory=list)
    probes_total: int = 0
    probes_ok: int = 0
    smoke: Literal["passed", "failed", "not run"] = "not run"
    #: Each chance-level control: [its mean final reward over the run's tasks, its ceiling].
    chance_controls: dict[str, tuple[float, float]] = Field(default_factory=dict)
    #: A note on why controls never ran (a pool below its minimum), for the report.
    note: str = ""


class Criterion(BaseModel):
    name: str
    status: Literal["met", "failed", "missing"]
    detail: str


class DatasetVerdict(BaseModel):
    verdict: Literal["PASS", "FAIL", "INCOMPLETE"] = Field(
        description="PASS: every required criterion met; FAIL: one failed; INCOMPLETE: evidence "
                    "missing, none failed.")
    evidence: Literal["complete", "INCOMPLETE"] = Field(description="Whether any required "
                                                                    "evidence is missing.")
    criteria: list[Criterion]

    @property
    def headline(self) -> str:
        missing = [c.detail for c in self.criteria if c.status == "missing"]
        tail = (f" — evidence INCOMPLETE: {'; '.join(missing)}" if missing and self.verdict != "INCOMPLETE"
                else "")
        if self.verdict == "INCOMPLETE":
            tail = f": {'; '.join(missing)}"
        failed = [c.detail for c in self.criteria if c.status == "failed"]
        return f"Dataset verdict: {self.verdict}" + (f" ({'; '.join(failed)})" if failed else "") + tail


def _criterion(name: str, f: RunFacts) -> Criterion:
    def c(status: str, detail: str) -> Criterion:
        return Criterion(name=name, status=status, detail=detail)

    if name == "complete":
        if f.incomplete or f.interrupted:
            why = "the run was interrupted; " if f.interrupted else ""
            return c("missing", f"{why}{f.incomplete}/{f.tasks} tasks "
                                f"incomplete{(' (' + f.note + ')') if f.note else ''}")
        return c("met", f"{f.tasks}/{f.tasks} tasks have a final verdict")
    if name == "every_task_compatible":
        if f.excluded:
            return c("failed", f"{f.excluded}/{f.tasks} sampled tasks excluded")
        return c("missing" if f.incomplete else "met", f"{f.compatible}/{f.tasks} sampled tasks compatible")
    if name == "minimum":
        if f.compatible >= f.min_task_count:
            return c("met", f"{f.compatible} compatible ≥ minimum {f.min_task_count}")
        if f.compatible + f.incomplete >= f.min_task_count:
            return c("missing", f"{f.compatible} compatible so far, minimum {f.min_task_count}")
        return c("failed", f"{f.compatible} compatible < minimum {f.min_task_count}")
    if name == "one_reason":
        bad = f.excluded_without_one_reason
        return c("failed" if bad else "met", f"{bad} excluded task(s) without exactly one reason" if bad
                 else f"{f.excluded} excluded, one reason each")
    if name == "patches":
        return c("failed" if f.patch == "undocumented" else "met",
                 {"none": "no patch: the code is a commit",
                  "documented": "the patch is stored and documented",
                  "undocumented": "the code had uncommitted changes that are not stored"}[f.patch])
    if name == "dataset_findings":
        bad = f.blocking_dataset_findings
        return c("failed" if bad else "met", "; ".join(bad) if bad else "no blocking dataset finding")
    if name == "probes":
        if f.probes_total == 0:
            return c("met", "no probe applies")
        return c("met" if f.probes_ok == f.probes_total else "failed",
                 f"{f.probes_ok}/{f.probes_total} probes strictly between the controls and the oracle")
    if name == "chance_controls":
        means = sorted(f.chance_controls.items())
        over = [f"{n} mean {m:.4f} ≥ {top:.4f}" for n, (m, top) in means if m >= top]
        shown = "; ".join(f"{n} mean {m:.4f} < {top:.4f}" for n, (m, top) in means)
        return c("failed", "; ".join(over)) if over else c("met", shown or "no chance-level control")
    if name == "smoke":
        return c({"passed": "met", "failed": "failed", "not run": "missing"}[f.smoke],
                 f"smoke test {f.smoke}")
    raise ValueError(f"unknown criterion {name!r}")


def dataset_verdict(facts: RunFacts, required: Sequence[str]) -> DatasetVerdict:
    """FAIL if any required criterion failed; else INCOMPLETE if any is missing; else PASS."""
    criteria = [_criterion(name, facts) for name in CRITERIA if name in required]
    statuses = {c.status for c in criteria}
    verdict = "FAIL" if "failed" in statuses else "INCOMPLETE" if "missing" in statuses else "PASS"
    return DatasetVerdict(verdict=verdict, evidence="INCOMPLETE" if "missing" in statuses else "complete",
                          criteria=criteria)
