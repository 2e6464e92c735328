"""Reply parsing: the last ``\\boxed{...}`` as a label partition. Never raises.

Rules:

- The reply may be ``str`` or ``bytes``; bytes must be valid UTF-8.
- Size cap: a reply longer than `MAX_REPLY_CHARS` characters (4 MiB) is rejected before any
  scanning, so parsing time is bounded (linear in at most 4 Mi characters).
- The answer is the content of the **last** ``\\boxed{`` whose braces balance; if that last
  box is unbalanced the reply is invalid (earlier boxes are not consulted).
- The content must be JSON: a flat list of ints (one group) or a list of non-empty lists of
  ints (groups). Bools, floats, strings, nulls and deeper nesting are invalid. The labels
  must be exactly ``1..M``, each once.
"""

from __future__ import annotations

import json

MAX_REPLY_CHARS = 4 * 1024 * 1024
_BOX = "\\boxed{"

Partition = list[list[int]]


def extract_boxed(reply: str) -> str | None:
    """Content of the last ``\\boxed{...}``, or None when absent or unbalanced."""
    start = reply.rfind(_BOX)
    if start < 0:
        return None
    i = start + len(_BOX)
    depth = 1
    # str.find hops between braces in C; the loop runs once per brace, not per character.
    while True:
        o = reply.find("{", i)
        c = reply.find("}", i)
        if c < 0:
            return None
        if 0 <= o < c:
            depth += 1
            i = o + 1
            continue
        depth -= 1
        if depth == 0:
            return reply[start + len(_BOX):c]
        i = c + 1


def _is_label(x: object) -> bool:
    return type(x) is int  # excludes bool, a subclass of int


def parse_partition(reply: str | bytes, n_labels: int) -> Partition | None:
    """The predicted groups (lists of labels in predicted order), or None if invalid."""
    if isinstance(reply, (bytes, bytearray)):
        if len(reply) > 4 * MAX_REPLY_CHARS:
            return None
        try:
            reply = bytes(reply).decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(reply, str) or len(reply) > MAX_REPLY_CHARS:
        return None
    body = extract_boxed(reply)
    if body is None:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or not value:
        return None
    if all(_is_label(x) for x in value):
        groups = [value]
    elif all(isinstance(g, list) and g and all(_is_label(x) for x in g) for g in value):
        groups = value
    else:
        return None
    seen = bytearray(n_labels + 1)
    count = 0
    for g in groups:
        for x in g:
            if x < 1 or x > n_labels or seen[x]:
                return None
            seen[x] = 1
            count += 1
    if count != n_labels:
        return None
    return groups
