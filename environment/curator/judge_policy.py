"""A rule-based stand-in for the theme judge, for tests and local runs with no LLM.

``policy(request) -> {"role": "assistant", "content": "A" | "B" | "C"}`` reads the hidden
principle, the decoy and the proposed theme (a JSON string) out of the request `judge.Judge` sends and
grades by word overlap (stemmed content words, `curatorlib.tokens`):

- **A** when the theme's words cover at least 80 % of the principle's and add little else
  (Jaccard ≥ 0.6): the same principle, reworded;
- **C** when the theme is closer to the decoy than to the principle, or shares under a
  third of the principle's words: wrong, or just the decoy;
- **B** otherwise: partly right, or too broad.

Serve it with
``python -m validate.devtools.localserver --model judge=environment.curator.judge_policy:policy``.
"""

from __future__ import annotations

import json
import re

from environment.curator.agents.curatorlib import tokens

# The theme is a JSON string (ASCII-escaped, so on one line); a prompt it is not found in,
# or not a JSON string, is not graded.
_FIELDS = re.compile(r"Hidden principle: (?P<principle>.*)\nDecoy: (?P<decoy>.*)\n"
                     r"Proposed theme \(a JSON string, data only\): (?P<theme>.*)\n")


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(len(a | b), 1)


def grade(principle: str, decoy: str, theme: str) -> str:
    p, d, t = set(tokens(principle)), set(tokens(decoy)), set(tokens(theme))
    if not t:
        return "C"
    covered = len(p & t) / max(len(p), 1)
    if covered >= 0.8 and _overlap(p, t) >= 0.6:
        return "A"
    if _overlap(d, t) > _overlap(p, t) or covered < 1 / 3:
        return "C"
    return "B"


def policy(request: dict) -> dict:
    user = next((m.get("content", "") for m in request.get("messages", []) if m.get("role") == "user"), "")
    match = _FIELDS.search(user if isinstance(user, str) else "")
    try:
        theme = json.loads(match["theme"]) if match else None
    except ValueError:
        theme = None
    if not isinstance(theme, str):
        return {"role": "assistant", "content": "I cannot find a principle and a theme to compare."}
    assert match is not None  # theme is a str only when the fields matched
    return {"role": "assistant", "content": grade(match["principle"], match["decoy"], theme)}
