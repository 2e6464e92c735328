"""Reward: 0.7 × Jaccard(predicted intruders, gold) + 0.3 × theme grade.

The theme grade comes from the judge (`judge.Judge`: A 1.0, B 0.5, C 0.0) when the
contract declares one, and is the intruder Jaccard itself when it does not, so the reward
is then exactly the Jaccard. A missing or empty theme is a C without asking the judge, and
so is one longer than `THEME_MAX_CHARS` or spread over lines: the theme is the agent's text
quoted into the judge's prompt, and a principle fits one short line, while a second line
("Grade: A") or a page of text is an attempt on the judge, not a theme. A line is what
Python's `str.splitlines` says it is, so every line boundary counts: ``\n``, ``\r``,
``\v``, ``\f``, ``\x1c``–``\x1e``, U+0085, U+2028, U+2029 (the judge sees the theme
JSON-escaped anyway; see `judge`).
Metrics, in `METRIC_NAMES` order: ``intruder_jaccard``, ``theme_score``, ``exact_match``
(the predicted set is the gold set), ``format_ok`` (see `parse`) and ``judged`` (1 when the
theme slot was graded in judged mode, 0 in the intruders-only mode).
"""

from __future__ import annotations

from collections.abc import Callable

from environment.protocol import Score

INTRUDER_WEIGHT, THEME_WEIGHT = 0.7, 0.3
GRADE_SCORES = {"A": 1.0, "B": 0.5, "C": 0.0}
THEME_MAX_CHARS = 300
METRIC_NAMES: tuple[str, ...] = ("intruder_jaccard", "theme_score", "exact_match", "format_ok", "judged")


def jaccard(predicted: frozenset[str] | None, gold: frozenset[str]) -> float:
    """|P ∩ G| / |P ∪ G|; an unreadable prediction (None) scores 0."""
    if not predicted:
        return 0.0
    return len(predicted & gold) / len(predicted | gold)


def one_line(text: str) -> bool:
    """No line boundary anywhere, by Python's own set (`str.splitlines`), a trailing one too."""
    return text.splitlines() == [text]


def combine(j: float, theme: float | None) -> float:
    """The reward from the intruder Jaccard and the theme score (None: intruders-only mode)."""
    if theme is None:
        return j
    return round(INTRUDER_WEIGHT * j + THEME_WEIGHT * theme, 12)


def score_parsed(predicted: frozenset[str] | None, theme: str | None, format_ok: bool, gold: frozenset[str],
                 grade: Callable[[str], str] | None) -> Score:
    """``grade`` (the theme → "A"/"B"/"C") is None in the intruders-only mode; it may raise
    `ScorerUnavailable`, which propagates: no reward is made up."""
    j = jaccard(predicted, gold)
    if grade is None:
        theme_score, judged = j, 0.0
        reward = combine(j, None)
    else:
        text = theme or ""  # None and "" alike are not graded
        gradable = bool(text) and len(text) <= THEME_MAX_CHARS and one_line(text)
        theme_score = GRADE_SCORES[grade(text)] if gradable else 0.0
        judged = 1.0
        reward = combine(j, theme_score)
    metrics = {"intruder_jaccard": j, "theme_score": theme_score, "exact_match": float(predicted == gold),
               "format_ok": float(format_ok), "judged": judged}
    return Score(reward=reward, metrics=metrics)
