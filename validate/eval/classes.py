"""Failure classes as a pure function: every failed attempt gets exactly one, from a rule.

The classes are the protocol's: ``infrastructure``, ``invalid_task_or_verifier``,
``harness``, ``capability`` (a genuine failure of the model under the frozen setup) and
``uncertain``. `RULES` is an ordered table; the first rule whose condition holds gives the
class, and its id is recorded beside the class in the evidence, so a reader sees *why*.
``uncertain`` is what is left when no rule applies (rule id ``no-rule``): the harness does
not guess. A solved attempt gets no class.

What the rules read (`Facts`) is the attempt's status and reward, the agent's termination
(`validate.eval.agent.Termination`), whether the scorer parsed the answer (the
metric the taskset declares as its ``parse_metric``, when it has one), the tool calls, and where the time
went. Nothing the model wrote is read as an instruction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple, get_args

from validate.core.records import (
    HARNESS_ERROR,
    INFRASTRUCTURE_ERROR,
    OK,
    SCORER_ERROR,
    UNSUPPORTED_EXECUTION_CONTRACT,
)

FailureClass = Literal["infrastructure", "invalid_task_or_verifier", "harness", "capability", "uncertain"]
CLASSES: tuple[str, ...] = get_args(FailureClass)


class Facts(NamedTuple):
    status: str
    reward: float | None
    solved: bool
    termination: str | None
    #: The scorer's metric the taskset declares as its ``parse_metric``: 1.0 parsed, 0.0 not,
    #: None when the environment has none.
    parsed: float | None
    tool_calls: int
    malformed_tool_calls: int
    model_s: float
    tool_s: float
    #: A task-directory sample: the task's own verifier scored the container the model left
    #: (`validate.kinds.task_shell`), so there is no answer to read, only the state it left.
    verified: bool = False


class Rule(NamedTuple):
    id: str
    failure_class: FailureClass
    description: str
    applies: Callable[[Facts], bool]


def _answered(f: Facts) -> bool:
    return f.status == OK and f.termination in ("answer", "max_tokens")


RULES: tuple[Rule, ...] = (
    Rule("infrastructure-error", "infrastructure",
         "the sandbox, the model endpoint or a scorer dependency failed after its retries",
         lambda f: f.status == INFRASTRUCTURE_ERROR),
    Rule("unsupported-profile", "infrastructure", "the backend cannot honour the task's execution contract",
         lambda f: f.status == UNSUPPORTED_EXECUTION_CONTRACT),
    Rule("verifier-raised", "invalid_task_or_verifier", "the environment's scorer raised on the reply",
         lambda f: f.status == SCORER_ERROR),
    Rule("harness-error", "harness", "the harness failed handling the attempt (or the endpoint refused a "
                                     "request the harness built)", lambda f: f.status == HARNESS_ERROR),
    Rule("unscored", "harness", "a valid attempt carries no reward", lambda f: f.reward is None),
    Rule("verifier-rejected", "capability", "the model stopped working on a task directory and the task's "
         "own verifier scored what it left below the threshold",
         lambda f: (f.verified and f.status == OK
                    and f.termination in ("answer", "empty_answer", "max_tokens"))),
    Rule("answer-cut", "capability", "the final answer was cut at max_tokens and does not pass",
         lambda f: _answered(f) and f.termination == "max_tokens"),
    Rule("wrong-answer", "capability", "the model answered in the required format and the answer is wrong",
         lambda f: _answered(f) and (f.parsed == 1.0 or (f.parsed is None and (f.reward or 0.0) > 0.0))),
    Rule("unparseable-answer", "capability", "the model answered, but not in the format the prompt asks for",
         lambda f: _answered(f) and f.parsed == 0.0),
    Rule("no-answer", "capability", "the model ended the conversation without an answer",
         lambda f: f.termination == "empty_answer"),
    Rule("out-of-turns", "capability", "max_turns ran out while the model was still working its tools",
         lambda f: f.termination == "max_turns" and f.tool_calls > f.malformed_tool_calls),
    Rule("context-exceeded", "capability", "the conversation outgrew the model's context",
         lambda f: f.termination == "context_length"),
    Rule("sandbox-ended", "capability", "a command of the model ended its own sandbox before the deadline",
         lambda f: f.termination == "sandbox_ended"),
    # Strictly more time in tools than in model calls, and some: with no time measured on
    # either side (0 >= 0) nothing says the model spent it, so no rule applies.
    Rule("timeout-in-tools", "capability",
         "the attempt's time ran out, mostly spent in the model's own commands",
         lambda f: f.termination == "timeout" and f.tool_s > f.model_s and f.tool_s > 0),
)
NO_RULE = Rule("no-rule", "uncertain", "no rule applies", lambda f: True)


def classify(f: Facts) -> tuple[FailureClass | None, str | None]:
    """(failure class, rule id) of an attempt; (None, None) when it was solved."""
    if f.solved:
        return None, None
    for rule in RULES:
        if rule.applies(f):
            return rule.failure_class, rule.id
    return NO_RULE.failure_class, NO_RULE.id


#: Rules that only a task-directory sample (`Facts.verified`) can meet.
TASK_DIR_RULES = frozenset({"verifier-rejected"})


def rule_table(task_dirs: bool = False) -> list[tuple[str, str, str]]:
    """(rule id, class, description) of every rule in order, ``no-rule`` last: for reports.
    The task-directory rules are listed only for an eval of task directories (`task_dirs`):
    elsewhere they can never apply."""
    return [(r.id, r.failure_class, r.description) for r in (*RULES, NO_RULE)
            if task_dirs or r.id not in TASK_DIR_RULES]
