"""10,000 hostile manifests at the loader: each is refused with `ContractError` naming the file
(or, re-sealed and still valid, accepted); nothing else ever comes out."""

from __future__ import annotations

import copy
import json
import os
import random

import pytest

from environment.protocol import canonical_json, sha256_tag
from tests.conftest import make_manifest
from validate.contract.manifest import ContractError, parse_manifest

CASES = int(os.environ.get("FUZZ_MANIFESTS", "10000"))
ODD = [None, True, -1, 0, 2**63, -(2**70), 1e308, float("nan"), "", "x" * 5000, [], {}, [[[]]],
       {"a": {"b": {}}}, "sha256:" + "0" * 64, "../../etc/passwd", "\u2028", "\ud7ff", 10**400]


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            yield from _paths(v, (*prefix, i))


def _set(doc, path, value):
    target = doc
    for key in path[:-1]:
        target = target[key]
    if isinstance(target, dict) and value is _DELETE:
        target.pop(path[-1], None)
    elif isinstance(target, list) and value is _DELETE:
        target.pop(path[-1])
    else:
        target[path[-1]] = value


_DELETE = object()


def mutate(doc: dict, rng: random.Random) -> bytes:
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    kind = rng.random()
    if kind < 0.05:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    if kind < 0.08:
        return b"[" * rng.randrange(1000, 120_000)
    for _ in range(rng.randrange(1, 4)):
        path = rng.choice(paths)
        try:
            _set(doc, path, _DELETE if rng.random() < 0.2 else rng.choice(ODD))
        except (KeyError, IndexError, TypeError):
            continue
        paths = [p for p in _paths(doc) if p]
    if rng.random() < 0.5:  # a forger re-seals: the self-hash no longer catches it
        try:
            doc["sha256"] = sha256_tag(canonical_json({k: v for k, v in doc.items() if k != "sha256"}))
        except (ValueError, TypeError):
            pass
    try:
        return json.dumps(doc, allow_nan=True).encode()
    except (ValueError, TypeError):
        return b"{" + os.urandom(8) + b"}"


@pytest.mark.bwrap
def test_hostile_manifests_are_refused_with_a_named_error(sandboxes):
    base = json.loads(make_manifest(sandboxes("bwrap"), idx=[0, 1, 2], max_papers=2).to_json())
    rng = random.Random(20261130)
    outcomes = {"refused": 0, "accepted": 0}
    for i in range(CASES):
        data = mutate(base, rng)
        try:
            parse_manifest(data, f"case-{i}.json")
            outcomes["accepted"] += 1
        except ContractError as e:
            assert f"case-{i}.json" in str(e) and len(str(e)) < 6000, str(e)[:300]
            outcomes["refused"] += 1
    print(f"\n{CASES} manifests: {outcomes}")
    assert outcomes["refused"] > CASES * 0.9
