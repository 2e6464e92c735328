"""twohop-env's scorer: exact and case-sensitive, binary, and it never raises for a reply."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from environment.twohop import TwohopConfig, TwohopEnvironment
from environment.twohop.score import MAX_REPLY_BYTES, parse_reply, score_reply

TASKSET = TwohopEnvironment().load(TwohopConfig())
TASKS = [TASKSET.task(i) for i in range(TASKSET.size)]
BROKEN = next(t for t in TASKS if t.family == "broken")
AGGREGATE = next(t for t in TASKS if t.family == "aggregate")
TWOHOP = next(t for t in TASKS if t.family == "twohop")


def score(task, reply):
    return TASKSET.score(task, reply)


def test_the_gold_scores_one_in_any_spacing_and_as_str():
    for t in TASKS:
        assert score(t, t.answer_key) == (1.0, {"parsed_ok": 1.0, "exact_match": 1.0}, None)
        spaced = "\n  " + json.dumps({"rows": list(t.rows)}, indent=2) + "\n"
        assert score(t, spaced.encode()).reward == 1.0
        assert score(t, spaced).reward == 1.0


def test_unknown_is_literal_and_lower_case():
    assert score(BROKEN, b'{"rows": ["unknown"]}').reward == 1.0
    for wrong in ("Unknown", "UNKNOWN", "none", "None", "", "unknown ", " unknown", "n/a"):
        result = score(BROKEN, json.dumps({"rows": [wrong]}).encode())
        assert result == (0.0, {"parsed_ok": 1.0, "exact_match": 0.0}, None), wrong
    assert score(BROKEN, b'{"rows": []}').reward == 0.0
    assert score(BROKEN, b'{"rows": ["unknown", "unknown"]}').reward == 0.0
    assert score(BROKEN, b"unknown").metrics["parsed_ok"] == 0.0


def test_case_order_and_completeness_all_count():
    rows = list(AGGREGATE.rows)
    assert score(AGGREGATE, json.dumps({"rows": rows})).reward == 1.0
    for wrong in ([r.lower() for r in rows], [r.upper() for r in rows], rows[::-1], rows[:-1],
                  rows + rows[-1:], [r + " " for r in rows]):
        assert score(AGGREGATE, json.dumps({"rows": wrong})).reward == 0.0
    city = TWOHOP.rows[0]
    for wrong in (city.lower(), city.swapcase(), city + ".", f"The city is {city}"):
        assert score(TWOHOP, json.dumps({"rows": [wrong]})).reward == 0.0


def test_any_other_shape_does_not_parse():
    city = TWOHOP.rows[0]
    for reply in (city, f'"{city}"', f'["{city}"]', f'{{"rows": "{city}"}}', f'{{"rows": [["{city}"]]}}',
                  f'{{"rows": ["{city}"], "why": "facts"}}', f'{{"Rows": ["{city}"]}}',
                  f'{{"rows": ["{city}", 1]}}', f'```json\n{{"rows": ["{city}"]}}\n```',
                  f'{{"rows": ["{city}"]}} {{"rows": []}}', "\ufeff" + f'{{"rows": ["{city}"]}}', ""):
        assert score(TWOHOP, reply.encode()) == (0.0, {"parsed_ok": 0.0, "exact_match": 0.0}, None), reply


def test_oversized_undecodable_and_deeply_nested_replies_score_zero():
    gold = TWOHOP.answer_key
    assert score(TWOHOP, gold + b" " * (MAX_REPLY_BYTES - len(gold))).reward == 1.0
    assert score(TWOHOP, gold + b" " * (MAX_REPLY_BYTES - len(gold) + 1)).reward == 0.0
    assert score(TWOHOP, b'{"rows": ["\xff"]}').reward == 0.0
    assert score(TWOHOP, b"[" * 60000 + b"]" * 60000).reward == 0.0
    assert score(TWOHOP, '{"rows": ["\ud800"]}').reward == 0.0
    assert score(TWOHOP, b'{"rows": [' + b"9" * 5000 + b"]}").reward == 0.0


def test_a_reply_that_was_not_read_back_is_not_scored():
    """A read-back failure is the harness's, never a 0 blamed on the model."""
    with pytest.raises(TypeError, match="infrastructure"):
        score(TWOHOP, None)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2048))
def test_garbage_bytes_never_raise(data):
    reward, metrics = score_reply(data, TWOHOP.rows)
    assert reward in (0.0, 1.0) and set(metrics) == {"parsed_ok", "exact_match"}
    assert reward == 0.0 or data.strip() and parse_reply(data) == TWOHOP.rows


@settings(max_examples=400, deadline=None)
@given(_json)
def test_arbitrary_json_never_raises_and_only_the_gold_scores(value):
    reply = json.dumps(value).encode()
    reward, metrics = score_reply(reply, AGGREGATE.rows)
    assert reward == float(value == {"rows": list(AGGREGATE.rows)})
    assert metrics["parsed_ok"] == float(isinstance(value, dict) and list(value) == ["rows"]
                                         and isinstance(value["rows"], list)
                                         and all(isinstance(r, str) for r in value["rows"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=6))
def test_any_rows_score_one_iff_they_equal_the_gold(rows):
    reward, _ = score_reply(json.dumps({"rows": rows}, ensure_ascii=False).encode(), TWOHOP.rows)
    assert reward == float(tuple(rows) == TWOHOP.rows)


def test_a_duplicate_key_is_malformed_not_the_last_one_scored():
    """Python's reader keeps the last duplicate: this reply would score 1.0 on a task whose
    answer is Mokirith while also saying `unknown`. A key twice, at any depth, does not parse."""
    task = next(t for t in TASKS if t.rows == ("Mokirith",))
    reply = b'{"rows":["unknown"],"rows":["Mokirith"]}'
    assert json.loads(reply) == {"rows": ["Mokirith"]}  # what a plain reader makes of it
    assert score(task, reply) == (0.0, {"parsed_ok": 0.0, "exact_match": 0.0}, None)
    assert score(task, reply.decode()) == (0.0, {"parsed_ok": 0.0, "exact_match": 0.0}, None)
    assert score(task, b'{"rows":["Mokirith"]}').reward == 1.0
    assert parse_reply(b'{"rows":["Mokirith"],"rows":["Mokirith"]}') is None  # even when both agree
    assert parse_reply(b'{"rows":[{"a":1,"a":2}]}') is None
    assert parse_reply(b'{"rows":["Mokirith"],"extra":{"k":1,"k":2}}') is None
