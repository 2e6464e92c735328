"""The reference solver: a question executed over a set of facts gives the answer rows and
the chains of facts that prove them. Every ``expected_output`` is computed here, and the
checks (`checks`) re-run it over ablated and substituted fact sets.

Stdlib only (see `universe`).

Four kinds of question, each a walk along functional relations:

- ``employer_city`` (person): works_for → headquartered_in — 2 hops;
- ``employer_country`` (person): works_for → headquartered_in → located_in — 3 hops;
- ``city_employees`` (city): the people whose employer is headquartered there — 2 hops,
  walked backwards;
- ``country_employees`` (country): the people whose employer's city lies there — 3 hops,
  one chain per person.

A missing link makes the answer underivable: the rows are ``["unknown"]`` and there is no
chain. People are listed in ascending code-point order of their full names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from environment.twohop.universe import FORMERLY, HQ, LIVES_IN, LOCATED, WORKS_FOR, Fact

UNKNOWN = "unknown"

#: Question kind → hops of every chain that proves an answer.
HOPS = {"employer_city": 2, "employer_country": 3, "city_employees": 2, "country_employees": 3}


class Question(NamedTuple):
    kind: str
    subject: str


@dataclass(frozen=True)
class Resolution:
    """Answer rows, the chains proving them (hop order from the question's subject), and the
    links found before a chain broke (empty unless the answer is unknown)."""

    rows: tuple[str, ...]
    chains: tuple[tuple[Fact, ...], ...]
    partial: tuple[Fact, ...] = ()

    @property
    def derivable(self) -> bool:
        return self.rows != (UNKNOWN,)


class Index:
    """Facts as functional maps (subject → fact) per relation."""

    def __init__(self, facts) -> None:
        self.by: dict[str, dict[str, Fact]] = {r: {} for r in (WORKS_FOR, FORMERLY, LIVES_IN, HQ, LOCATED)}
        for f in facts:
            self.by[f.relation][f.subject] = f

    def walk(self, start: str, relations) -> tuple[tuple[Fact, ...], bool]:
        """Follow ``relations`` from ``start``: (the links found, whether all were)."""
        links: list[Fact] = []
        here = start
        for rel in relations:
            f = self.by[rel].get(here)
            if f is None:
                return tuple(links), False
            links.append(f)
            here = f.object
        return tuple(links), True


_FORWARD = {"employer_city": (WORKS_FOR, HQ), "employer_country": (WORKS_FOR, HQ, LOCATED)}
_BACKWARD = {"city_employees": (WORKS_FOR, HQ), "country_employees": (WORKS_FOR, HQ, LOCATED)}


def resolve(facts, question: Question, first: str = WORKS_FOR) -> Resolution:
    """Execute ``question`` over ``facts``. ``first`` replaces the first relation of a
    forward walk (`shortcut` and the distractor check use it)."""
    index = facts if isinstance(facts, Index) else Index(facts)
    if question.kind in _FORWARD:
        relations = (first, *_FORWARD[question.kind][1:])
        links, whole = index.walk(question.subject, relations)
        if not whole:
            return Resolution((UNKNOWN,), (), links)
        return Resolution((links[-1].object,), (links,))
    if question.kind in _BACKWARD:
        chains = []
        for person in sorted(index.by[WORKS_FOR]):
            links, whole = index.walk(person, _BACKWARD[question.kind])
            if whole and links[-1].object == question.subject:
                chains.append(tuple(reversed(links)))
        if not chains:
            return Resolution((UNKNOWN,), ())
        return Resolution(tuple(c[-1].subject for c in chains), tuple(chains))
    raise ValueError(f"question kind: {question.kind!r} is not one of {', '.join(HOPS)}")


def shortcut(facts, question: Question) -> Resolution:
    """The one-hop answer that skips the employer: a person's own home city stands in for
    their employer's (and for a city or country question, the people living there)."""
    index = facts if isinstance(facts, Index) else Index(facts)
    if question.kind == "employer_city":
        f = index.by[LIVES_IN].get(question.subject)
        return Resolution((f.object,) if f else (UNKNOWN,), ((f,),) if f else ())
    if question.kind == "employer_country":
        links, whole = index.walk(question.subject, (LIVES_IN, LOCATED))
        return Resolution((links[-1].object,) if whole else (UNKNOWN,), (links,) if whole else ())
    relations = (LIVES_IN,) if question.kind == "city_employees" else (LIVES_IN, LOCATED)
    people = [p for p in sorted(index.by[LIVES_IN])
              if (w := index.walk(p, relations))[1] and w[0][-1].object == question.subject]
    return Resolution(tuple(people) or (UNKNOWN,), ())
