"""The reply parser: bytes in, a `ParsedReply` out, never an exception.

The asked format is exactly ``<intruders>D, K</intruders>`` then ``<theme>…</theme>``
(whitespace around and between the two tags allowed). Parsing is lenient about everything
but the ids, strict about ``format_ok``:

- ``intruders``: the ids in the last ``<intruders>`` tag (case-insensitive tags), split on
  commas, semicolons and whitespace, upper-cased. Any token that is not a single letter
  makes the tag unreadable (``None``, scored 0). Ids outside the collection stay in the set
  and count as wrong guesses. An empty tag is the empty set.
- ``theme``: the text of the last ``<theme>`` tag, stripped; ``None`` when absent or empty.
- ``format_ok``: the whole reply is exactly the two tags in order, with at least one id,
  every id in the collection, no id twice, and a non-empty theme.

Replies over `MAX_REPLY_BYTES` are not read (unformatted, no ids).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import NamedTuple

MAX_REPLY_BYTES = 64 * 1024

_INTRUDERS = re.compile(r"<intruders>(.*?)</intruders>", re.IGNORECASE | re.DOTALL)
_THEME = re.compile(r"<theme>(.*?)</theme>", re.IGNORECASE | re.DOTALL)
_EXACT = re.compile(r"\A\s*<intruders>([^<]*)</intruders>\s*<theme>([^<]*)</theme>\s*\Z")
_SPLIT = re.compile(r"[\s,;]+")


class ParsedReply(NamedTuple):
    intruders: frozenset[str] | None
    theme: str | None
    format_ok: bool


def _ids(text: str) -> tuple[list[str], bool]:
    """(ids in order, all tokens were single letters)."""
    toks = [t for t in _SPLIT.split(text.strip()) if t]
    ok = all(len(t) == 1 and t.isascii() and t.isalpha() for t in toks)
    return [t.upper() for t in toks], ok


def parse_reply(reply: bytes | str | None, valid_ids: Collection[str]) -> ParsedReply:
    if reply is None:
        return ParsedReply(None, None, False)
    if isinstance(reply, bytes):
        if len(reply) > MAX_REPLY_BYTES:
            return ParsedReply(None, None, False)
        text = reply.decode("utf-8", errors="replace")
    else:
        if len(reply) > MAX_REPLY_BYTES:
            return ParsedReply(None, None, False)
        text = reply
    tags = _INTRUDERS.findall(text)
    intruders: frozenset[str] | None = None
    if tags:
        ids, readable = _ids(tags[-1])
        intruders = frozenset(ids) if readable else None
    themes = _THEME.findall(text)
    theme = themes[-1].strip() if themes else None
    theme = theme or None
    exact = _EXACT.match(text)
    format_ok = False
    if exact:
        ids, readable = _ids(exact.group(1))
        format_ok = (readable and bool(ids) and len(set(ids)) == len(ids)
                     and all(i in valid_ids for i in ids) and bool(exact.group(2).strip()))
    return ParsedReply(intruders, theme, format_ok)
