"""Failure classes (`validate.eval.classes`): each rule gives its class, the first that applies
wins, a solved attempt gets none, and `uncertain` is exactly what no rule covers — checked
over every combination of the facts the rules read."""

from __future__ import annotations

import itertools
from typing import get_args

import pytest

from validate.eval.agent import Termination
from validate.eval.classes import CLASSES, NO_RULE, RULES, Facts, classify, rule_table


def facts(**kw) -> Facts:
    base = dict(status="ok", reward=0.0, solved=False, termination="answer", parsed=1.0, tool_calls=1,
                malformed_tool_calls=0, model_s=1.0, tool_s=0.1)
    return Facts(**{**base, **kw})


@pytest.mark.parametrize("kw,expected", [
    (dict(status="infrastructure_error", reward=None, termination=None),
     ("infrastructure", "infrastructure-error")),
    (dict(status="unsupported_execution_contract", reward=None, termination=None),
     ("infrastructure", "unsupported-profile")),
    (dict(status="scorer_error", reward=None), ("invalid_task_or_verifier", "verifier-raised")),
    (dict(status="harness_error", reward=None), ("harness", "harness-error")),
    (dict(reward=None), ("harness", "unscored")),
    (dict(termination="max_tokens", parsed=0.0), ("capability", "answer-cut")),
    (dict(reward=0.4), ("capability", "wrong-answer")),
    (dict(parsed=None, reward=0.4), ("capability", "wrong-answer")),
    (dict(parsed=0.0), ("capability", "unparseable-answer")),
    (dict(status="no_reply", termination="empty_answer"), ("capability", "no-answer")),
    (dict(status="no_reply", termination="max_turns", tool_calls=3, malformed_tool_calls=1),
     ("capability", "out-of-turns")),
    (dict(status="no_reply", termination="context_length"), ("capability", "context-exceeded")),
    (dict(status="exit_nonzero", termination="sandbox_ended"), ("capability", "sandbox-ended")),
    (dict(status="timeout", termination="timeout", tool_s=5.0, model_s=1.0),
     ("capability", "timeout-in-tools")),
    # what no rule covers is uncertain, never a guess:
    (dict(status="timeout", termination="timeout", tool_s=0.5, model_s=9.0), ("uncertain", "no-rule")),
    # nothing measured on either side (a hung endpoint used to land here as 0 >= 0), or a tie:
    (dict(status="timeout", termination="timeout", tool_s=0.0, model_s=0.0), ("uncertain", "no-rule")),
    (dict(status="timeout", termination="timeout", tool_s=2.0, model_s=2.0), ("uncertain", "no-rule")),
    (dict(status="no_reply", termination="max_turns", tool_calls=4, malformed_tool_calls=4),
     ("uncertain", "no-rule")),
    (dict(parsed=None, reward=0.0), ("uncertain", "no-rule")),
    # a task directory: the task's own verifier scored what the model left when it stopped
    (dict(verified=True, parsed=None, reward=0.0), ("capability", "verifier-rejected")),
    (dict(verified=True, parsed=None, reward=0.5, termination="empty_answer"),
     ("capability", "verifier-rejected")),
    (dict(verified=True, parsed=None, termination="max_turns", tool_calls=8), ("capability", "out-of-turns")),
    (dict(verified=True, parsed=None, status="timeout", termination="timeout", tool_s=30.0),
     ("capability", "timeout-in-tools")),
    (dict(verified=True, status="scorer_error", reward=None),
     ("invalid_task_or_verifier", "verifier-raised")),
])
def test_each_rule_gives_its_class(kw, expected):
    assert classify(facts(**kw)) == expected


def test_a_solved_attempt_has_no_class():
    assert classify(facts(solved=True, reward=1.0)) == (None, None)


def test_an_infrastructure_status_wins_over_everything_the_conversation_says():
    assert classify(facts(status="infrastructure_error", termination="answer", parsed=1.0)) == \
        ("infrastructure", "infrastructure-error")


def test_every_combination_gets_exactly_the_first_applying_rule():
    statuses = ["ok", "no_reply", "timeout", "exit_nonzero", "infrastructure_error", "harness_error",
                "scorer_error", "unsupported_execution_contract"]
    terminations = [None, *get_args(Termination)]
    seen = set()
    for status, term, parsed, reward, calls, time_split, verified in itertools.product(
            statuses, terminations, [None, 0.0, 1.0], [None, 0.0, 0.5], [(0, 0), (2, 2), (3, 1)],
            [(1.0, 2.0), (2.0, 1.0)], [False, True]):
        f = Facts(status, reward, False, term, parsed, calls[0], calls[1], *time_split, verified)
        cls, rule = classify(f)
        first = next((r for r in RULES if r.applies(f)), NO_RULE)
        assert (cls, rule) == (first.failure_class, first.id)
        assert cls in CLASSES
        seen.add(rule)
    assert seen == {r.id for r in (*RULES, NO_RULE)}, "a rule no combination reaches"


def test_the_task_directory_rules_are_listed_only_for_task_directories():
    assert "verifier-rejected" not in [r[0] for r in rule_table()]
    assert [r[0] for r in rule_table(True)] == [r.id for r in (*RULES, NO_RULE)]
    assert classify(facts(parsed=None, reward=0.0)) == ("uncertain", "no-rule")  # no verifier: no such rule


def test_the_rule_table_is_ordered_and_unique():
    table = rule_table(True)
    assert [r[0] for r in table][-1] == "no-rule"
    assert len({r[0] for r in table}) == len(table)
    assert {r[1] for r in table} == set(CLASSES)


@pytest.mark.parametrize("env_name, config", [("twohop-env", {}), ("curator", {}),
                                              ("deshuffle-papers", {"max_papers": 2})])
def test_the_metric_that_says_a_reply_parsed_is_declared_by_the_taskset(env_name, config):
    """The failure rules tell a malformed answer from a wrong one by the metric the taskset
    declares (`parse_metric`), never by a metric's name: curator's is ``format_ok``."""
    from tests.conftest import CORPUS_PATH, HINTS
    from validate.core import environments

    env = environments.get(env_name)
    if env_name.startswith("deshuffle"):
        config = {**config, "corpus": str(CORPUS_PATH)}
    taskset = env.load(env.Config.model_validate(config), HINTS)
    assert taskset.parse_metric in taskset.metric_names
    assert (env_name != "curator") or taskset.parse_metric == "format_ok"

