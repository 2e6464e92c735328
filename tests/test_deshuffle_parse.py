"""Parser: hostile and malformed replies give parsed_ok = 0, never an exception, in bounded time."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings, strategies as st

from environment.deshuffle import MAX_REPLY_CHARS, analyze_ordering, parse_partition
from environment.deshuffle.parse import extract_boxed

GOLD = [[1, 2, 3], [4, 5]]


@pytest.mark.parametrize("reply", [
    "",
    "no box at all [[1,2,3],[4,5]]",
    "\\boxed{[[1,2,3],[4,5]]",                 # unbalanced
    "\\boxed{not json}",
    "\\boxed{[[1,2,3],[4]]}",                  # label 5 missing
    "\\boxed{[[1,2,3],[4,5,5]]}",              # duplicated
    "\\boxed{[[1,2,3],[4,5,6]]}",              # unknown label
    "\\boxed{[[1,2,3],[4,0,5]]}",
    "\\boxed{[[1,2,3.0],[4,5]]}",              # float
    "\\boxed{[[1,2,\"3\"],[4,5]]}",            # string
    "\\boxed{[[1,2,true],[4,5]]}",             # bool
    "\\boxed{[[1,2,3],[4,5],[]]}",             # empty group
    "\\boxed{[[1,2,[3]],[4,5]]}",              # wrong nesting
    "\\boxed{[1,2,3,[4,5]]}",                  # mixed nesting
    "\\boxed{{\"a\": 1}}",
    "\\boxed{[]}",
    "\\boxed{null}",
    "\\boxed{[[1,2,3],[4," + "9" * 5000 + "]]}",  # huge int
    "\\boxed{[[1,2,3],[4,5]]} then \\boxed{[1]}",  # the last box counts
])
def test_invalid_replies_score_zero(reply):
    reward, m = analyze_ordering(reply, GOLD)
    assert reward == 0.0 and set(m.values()) == {0.0}


def test_the_last_box_wins():
    reply = "\\boxed{[1]} no wait: \\boxed{[[4,5],[1,2,3]]}"
    assert analyze_ordering(reply, GOLD)[0] == 1.0


def test_nested_braces_balance():
    assert extract_boxed("\\boxed{a{b}c}") == "a{b}c"
    assert extract_boxed("\\boxed{a{b}c") is None


def test_deep_nesting_and_huge_replies_are_bounded():
    cases = [
        "\\boxed{" + "[" * 10_000 + "]" * 10_000 + "}",
        "\\boxed{" + "{" * 10_000 + "}" * 10_000 + "}",
        "x" * (50 * 1024 * 1024),
        "\\boxed{[" + "1," * (MAX_REPLY_CHARS // 2) + "1]}",
        b"\\boxed{[[1,2,3],[4,5]]}\xff\xfe",
        b"\x80" * 1000,
    ]
    for reply in cases:
        t0 = time.perf_counter()
        reward, m = analyze_ordering(reply, GOLD)
        assert reward == 0.0 and m["parsed_ok"] == 0.0
        assert time.perf_counter() - t0 < 5.0  # a hang guard, not a speed goal


def test_utf8_bytes_are_accepted():
    assert analyze_ordering("\\boxed{[[1,2,3],[4,5]]} ✓".encode(), GOLD)[0] == 1.0


def _valid(value, n: int) -> bool:
    if not isinstance(value, list) or not value:
        return False
    groups = [value] if all(type(x) is int for x in value) else value
    if not all(isinstance(g, list) and g and all(type(x) is int for x in g) for g in groups):
        return False
    flat = [x for g in groups for x in g]
    return sorted(flat) == list(range(1, n + 1))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 8) | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda children: st.lists(children, max_size=6),
    max_leaves=20,
)


@settings(max_examples=1500, deadline=None)
@given(json_values)
def test_property_parsed_ok_exactly_when_valid_partition(value):
    reply = f"\\boxed{{{json.dumps(value)}}}"
    assert (parse_partition(reply, 5) is not None) == _valid(value, 5)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.text(), st.binary()))
def test_property_arbitrary_text_never_raises(reply):
    reward, m = analyze_ordering(reply, GOLD)
    assert 0.0 <= reward <= 1.0
