"""Reading a reply and scoring it: exact, case-sensitive, binary. Never raises for a reply.

The reply is the text the agent leaves in ``reply.txt``: exactly one JSON object
``{"rows": [...]}`` whose only key is ``rows``, a list of strings (surrounding whitespace
is ignored). Anything else — not UTF-8, not JSON, nested too deep, another key, a key twice
in any object, a non-string row, larger than `MAX_REPLY_BYTES` — does not parse and scores 0.
A repeated key is refused rather than resolved: JSON leaves its meaning open and Python's
reader keeps the last, so ``{"rows":["unknown"],"rows":["X"]}`` would be one answer to this
scorer and another to a reader keeping the first (a hedge that must not earn the reward). A parsed
reply scores 1.0 iff its rows equal the gold rows exactly: same strings, same case, same
order, no Unicode normalisation. ``Unknown`` and ``none`` are therefore as wrong as any
other name where ``unknown`` is expected.
"""

from __future__ import annotations

import json

METRIC_NAMES = ("parsed_ok", "exact_match")
#: Larger replies are not read: the longest gold answer is well under 1 KiB.
MAX_REPLY_BYTES = 64 * 1024


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """json's object hook: refuse an object that names a key twice (at any depth)."""
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _DuplicateKey("a key appears twice in one object")
    return dict(pairs)


def parse_reply(reply: bytes | str) -> tuple[str, ...] | None:
    """The reply's rows, or None when it is not exactly ``{"rows": [str, ...]}``."""
    if isinstance(reply, str):
        try:
            reply = reply.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates
            return None
    if len(reply) > MAX_REPLY_BYTES:
        return None
    try:
        value = json.loads(reply.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or list(value) != ["rows"] or not isinstance(value["rows"], list):
        return None
    rows = value["rows"]
    if not all(isinstance(r, str) for r in rows):
        return None
    return tuple(rows)


def score_reply(reply: bytes | str, gold: tuple[str, ...]) -> tuple[float, dict[str, float]]:
    """``(reward, {"parsed_ok", "exact_match"})``. A reply that is neither bytes nor str is
    a harness fault (the read-back failed), not an answer: it raises TypeError rather than
    scoring 0, so a broken read-back is never blamed on the model."""
    if not isinstance(reply, bytes | str):
        raise TypeError(f"reply: expected the reply's bytes, got {type(reply).__name__}; "
                        f"a reply that could not be read back is an infrastructure error, not a score")
    rows = parse_reply(reply)
    exact = float(rows is not None and rows == tuple(gold))
    return exact, {"parsed_ok": float(rows is not None), "exact_match": exact}
