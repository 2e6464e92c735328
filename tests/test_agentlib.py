"""agentlib's JSON (the stdlib's C engine, without importing `json`) is `json`'s, byte for byte."""

from __future__ import annotations

import json
import math
import types

import pytest
from hypothesis import given, strategies as st

from validate.agents import agentlib_source

# The very bytes mounted into every sandbox as /agent/agentlib.py.
agentlib = types.ModuleType("agentlib")
exec(compile(agentlib_source(), "agentlib.py", "exec"), agentlib.__dict__)

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=30,
)


def same(a, b) -> bool:
    """Equal, with NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def test_the_c_engine_is_in_use():
    assert agentlib.loads is not json.loads and agentlib.dumps is not json.dumps


@given(values)
def test_dumps_is_json_dumps(value):
    assert agentlib.dumps(value) == json.dumps(value)


@given(values, st.sampled_from(["", " ", "\n", "\r\n", "\t "]))
def test_loads_is_json_loads(value, pad):
    text = pad + json.dumps(value) + pad
    assert same(agentlib.loads(text), json.loads(text))


@pytest.mark.parametrize("text", ["", "[1,", "[1] 2", "{'a': 1}", "nul"])
def test_loads_refuses_what_json_refuses(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        agentlib.loads(text)


def test_dumps_refuses_what_json_refuses():
    with pytest.raises(TypeError):
        agentlib.dumps({1, 2})
