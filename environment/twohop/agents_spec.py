"""The agents twohop-env declares: the oracle and one control per failure, and which
control passes are expected rather than defects.

The programs live in ``agents/`` (package data, not an importable package: they run in the
sandbox under ``python3 -S`` with the harness's ``agentlib.py`` and, where declared, the
support module ``factlib.py`` beside them).

Which control cannot test which task (`control_may_pass`, frozen into the contract through
`Environment.not_applicable`) is decided by the answer, not by the control's name: each
control whose reply the host can compute from the facts every task shares (`predicted`) is
frozen out of exactly the tasks whose gold rows equal that reply — it would pass by being
right, so it cannot show that a wrong answer fails there. At seed 0 that is

- ``always-unknown`` (fixed answer ``unknown``) on the ``broken`` category (5 of 36);
- ``modal-city`` (fixed answer: the city hosting the most organisations) on the tasks with
  that answer (the dataset checks keep every answer's share under 1/2; the
  ``modal_city_control`` dataset finding names those tasks — at seed 0, one of 36);
- ``plausible-entity`` (the solver's rows where the chain is whole, a fabrication where it
  breaks) on every category but ``broken``; its failure is judged on the 5 broken tasks.

The other controls read what the host does not stand in for (the answer key, the source, or
nothing at all) and must score 0 on every task. The agents' tests hold every program to its
prediction on every task.
"""

from __future__ import annotations

from pathlib import Path

from environment.protocol import AgentSpec, Role
from environment.twohop.solver import UNKNOWN, Question, resolve
from environment.twohop.universe import HQ, LIVES_IN, LOCATED, WORKS_FOR, Universe

AGENTS_DIR = Path(__file__).resolve().parent / "agents"
FACTLIB = AGENTS_DIR / "factlib.py"


def _spec(name: str, role: Role, tests: str, *, support: bool = False, **kw) -> AgentSpec:
    return AgentSpec(name=name, role=role, program=AGENTS_DIR / f"{name.replace('-', '_')}.py",
                     support=(FACTLIB,) if support else (), tests=tests, **kw)


def agent_specs() -> list[AgentSpec]:
    return [
        _spec("oracle", "oracle", "writes the gold rows read from the answer key", sees_answer_key=True),
        _spec("empty", "control", "no reply at all must score 0"),
        _spec("always-unknown", "control", "declining everything: `unknown` must score 0 where the facts "
                                           "determine an answer (it is right on the broken category)"),
        _spec("modal-city", "control", "ignoring the facts: always naming the city that hosts the most "
                                       "organisations must score under 1/2 overall (right only where that "
                                       "city is the answer)", support=True),
        _spec("one-hop", "control", "skipping the first hop: answering from the person's own home city "
                                    "instead of their employer's must score 0", support=True),
        _spec("plausible-entity", "control", "fabricating: naming a plausible entity where the chain breaks "
                                             "must score 0 on the broken category (it solves the rest)",
              support=True),
        _spec("wrong-case", "control", "the right answer in the wrong case must score 0 (the comparison is "
                                       "case-sensitive)", sees_answer_key=True),
        _spec("source-peek", "control", "the environment's whole source plus the agent view's id and meta, "
                                        "without the facts, must not identify the task's answer",
              sees_source=True),
    ]


def _maps(universe: Universe) -> dict[str, dict[str, str]]:
    """The facts as the agents' ``factlib.facts()`` reads them: ``{relation: {subject: object}}``."""
    out: dict[str, dict[str, str]] = {}
    for f in universe.facts:
        out.setdefault(f.relation, {})[f.subject] = f.object
    return out


def _modal(mapping: dict[str, str]) -> str | None:
    """``factlib.modal``: the most frequent value (ties: the smallest), or None."""
    counts: dict[str, int] = {}
    for v in mapping.values():
        counts[v] = counts.get(v, 0) + 1
    return min(counts, key=lambda v: (-counts[v], v)) if counts else None


def _plausible(universe: Universe, question: Question) -> tuple[str, ...]:
    """What ``plausible_entity.py`` replies: the chain where it is whole, else a plausible
    stand-in (the home city, its country, the commonest value), never a decline it can avoid."""
    m = _maps(universe)
    employer, hq, country, home = (m.get(r, {}) for r in (WORKS_FOR, HQ, LOCATED, LIVES_IN))
    kind, subject = question
    city = hq.get(employer.get(subject, ""))
    if kind == "employer_city":
        return (city or home.get(subject) or _modal(hq) or UNKNOWN,)
    if kind == "employer_country":
        return (country.get(city or "") or country.get(home.get(subject, "")) or _modal(country) or UNKNOWN,)
    place = (lambda c: c) if kind == "city_employees" else country.get
    rows = sorted(p for p, o in employer.items() if hq.get(o) and place(hq[o]) == subject)
    rows = rows or sorted(p for p, c in home.items() if place(c) == subject)
    return tuple(rows) or (UNKNOWN,)


def predicted(agent: str, universe: Universe, question: Question) -> tuple[tuple[str, ...], str] | None:
    """The rows control `agent` replies to `question` over `universe`, and in words why its
    pass there is right, where the host can compute them; None for a control whose reply
    depends on what the host does not model (the answer key, the source) or that replies
    nothing (which never parses, so never equals an answer)."""
    if agent == "always-unknown":  # a fixed answer
        return (UNKNOWN,), "the answer is `unknown`: declining is correct here"
    if agent == "modal-city":  # a fixed answer for the universe
        city = universe.modal_hq_city()
        return (city,), f"the answer is the modal headquarters city {city}"
    if agent == "plausible-entity":
        rows = _plausible(universe, question)
        if resolve(universe.facts, question).derivable:
            return rows, "the chain is whole, so this control solves it; it is judged where the chain breaks"
        return rows, f"the chain breaks and its fallback finds nothing either: it answers {list(rows)}"
    return None


def control_may_pass(agent: str, universe: Universe, question: Question, gold: tuple[str, ...]) -> str | None:
    """Why ``agent`` cannot test a task whose answer is ``gold``: its predicted reply is that
    answer (compared, never assumed from the name); None when it can test it."""
    guess = predicted(agent, universe, question)
    return guess[1] if guess is not None and guess[0] == tuple(gold) else None
