"""The synthetic fact universe: invented people, organisations, cities and countries, the
facts between them, and the one text form agents read them in.

Stdlib only, like `solver` and `dataset`: the ``source-peek`` control imports these modules
from the mounted source inside a sandbox that has no third-party packages.

Names are composed from syllables by a seeded generator, so none is taken from the world
and no answer can come from pretraining. Every name is one or two capitalised words; no
word is a substring of another word, so a name never hides inside another in a prompt or
in the fact text.

Facts are ``(relation, subject, object)`` triples over five relations, every one functional
in its subject (a person has one employer, one home city, at most one former employer; an
organisation at most one headquarters; a city at most one country). Missing facts are
deliberate: some organisations have no recorded headquarters and some cities no recorded
country, which is what makes a chain break.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import NamedTuple

WORKS_FOR = "works_for"
FORMERLY = "formerly_worked_for"
LIVES_IN = "lives_in"
HQ = "headquartered_in"
LOCATED = "located_in"

#: Relation → the phrase between subject and object in the fact text (none contains another).
PHRASES = {
    WORKS_FOR: " works for ",
    FORMERLY: " formerly worked for ",
    LIVES_IN: " lives in ",
    HQ: " is headquartered in ",
    LOCATED: " is located in ",
}
#: Relation → (subject type, object type).
TYPES = {
    WORKS_FOR: ("person", "organisation"),
    FORMERLY: ("person", "organisation"),
    LIVES_IN: ("person", "city"),
    HQ: ("organisation", "city"),
    LOCATED: ("city", "country"),
}

# Sizes of the universe. Reserved ("singleton") cities host exactly one organisation with
# exactly one employee: they are what the reverse questions ask about.
N_COUNTRIES = 6
N_CITIES = 18
N_COUNTRYLESS = 2
N_ORGS = 26
N_HQLESS = 3
N_SINGLETON = 5
N_PEOPLE = 60
FORMER_SHARE = 0.35

_ONSETS = ("Br", "Dr", "Gl", "Kr", "Kv", "Q", "Sk", "Str", "Thr", "Vr", "Zh", "V", "T", "M", "L", "N", "R",
           "Z")
_INNER = ("b", "d", "g", "k", "l", "m", "n", "r", "s", "v", "z", "sk", "nd", "rv", "lm", "th")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou")
_CODAS = ("", "", "l", "n", "r", "s", "th", "x", "rn", "sk", "lm", "nd")
_ORG_KINDS = ("Foundry", "Collective", "Works", "Labs", "Trust", "Guild", "Systems", "Partners")


class Fact(NamedTuple):
    relation: str
    subject: str
    object: str

    def text(self) -> str:
        return f"{self.subject}{PHRASES[self.relation]}{self.object}."


class Rng:
    """Draws from `random.Random.random` only: the one stream Python keeps stable across
    versions. Integer draws are ``floor(random() * n)``."""

    def __init__(self, label: str) -> None:
        digest = hashlib.sha256(label.encode()).digest()
        self._r = random.Random(int.from_bytes(digest[:8], "big"))

    def below(self, n: int) -> int:
        return int(self._r.random() * n)

    def pick(self, items):
        return items[self.below(len(items))]

    def chance(self, p: float) -> bool:
        return self._r.random() < p

    def shuffled(self, items) -> list:
        out = list(items)
        for i in range(len(out) - 1, 0, -1):
            j = self.below(i + 1)
            out[i], out[j] = out[j], out[i]
        return out


class NameForge:
    """Unique invented words: no word equals, contains or is contained in another."""

    def __init__(self, rng: Rng) -> None:
        self._rng = rng
        self._words: list[str] = []

    def word(self) -> str:
        while True:
            r = self._rng
            w = r.pick(_ONSETS) + r.pick(_VOWELS)
            for _ in range(1 + r.below(2)):
                w += r.pick(_INNER) + r.pick(_VOWELS)
            w += r.pick(_CODAS)
            if not any(w.lower() in o.lower() or o.lower() in w.lower() for o in self._words):
                self._words.append(w)
                return w

    def person(self) -> str:
        return f"{self.word()} {self.word()}"

    def organisation(self) -> str:
        return f"{self.word()} {self._rng.pick(_ORG_KINDS)}"


@dataclass(frozen=True)
class Universe:
    """Entities by type (in generation order) and the facts, sorted by their text."""

    seed: int
    people: tuple[str, ...]
    organisations: tuple[str, ...]
    cities: tuple[str, ...]
    countries: tuple[str, ...]
    facts: tuple[Fact, ...]

    def of_type(self, kind: str) -> tuple[str, ...]:
        return {"person": self.people, "organisation": self.organisations,
                "city": self.cities, "country": self.countries}[kind]

    def with_facts(self, facts) -> Universe:
        """The same entities over other facts (sorted the same way)."""
        return Universe(self.seed, self.people, self.organisations, self.cities, self.countries,
                        tuple(sorted(facts, key=Fact.text)))

    def modal_hq_city(self) -> str:
        """The city hosting the most organisations (ties: the first in sorted order)."""
        counts: dict[str, int] = {}
        for f in self.facts:
            if f.relation == HQ:
                counts[f.object] = counts.get(f.object, 0) + 1
        return min(counts, key=lambda c: (-counts[c], c))


def build_universe(seed: int, attempt: int = 0) -> Universe:
    """The universe of one seed (and attempt, see `dataset.build_dataset`): the same bytes
    in every process and Python version."""
    rng = Rng(f"twohop-env:universe:{seed}:{attempt}")
    forge = NameForge(rng)
    countries = [forge.word() for _ in range(N_COUNTRIES)]
    cities = [forge.word() for _ in range(N_CITIES)]
    orgs = [forge.organisation() for _ in range(N_ORGS)]
    people = [forge.person() for _ in range(N_PEOPLE)]
    facts: list[Fact] = []
    # Cities: every country gets at least two; the last N_COUNTRYLESS have no country.
    countried = cities[:N_CITIES - N_COUNTRYLESS]
    for i, city in enumerate(countried):
        facts.append(Fact(LOCATED, city, countries[i % N_COUNTRIES]))
    # Organisations: HQ-less ones first, then one per reserved city, then the rest: one in
    # each other city (countryless ones included), the remainder drawn, so hubs form.
    reserved = rng.shuffled(countried)[:N_SINGLETON]
    open_cities = [c for c in cities if c not in reserved]
    hqless, singles, rest = (
        orgs[:N_HQLESS],
        orgs[N_HQLESS : N_HQLESS + N_SINGLETON],
        orgs[N_HQLESS + N_SINGLETON :],
    )
    facts += [Fact(HQ, o, c) for o, c in zip(singles, reserved, strict=True)]
    for i, org in enumerate(rest):
        city = open_cities[i] if i < len(open_cities) else rng.pick(open_cities)
        facts.append(Fact(HQ, org, city))
    # People: one employee per reserved organisation, two per HQ-less one, at least one per
    # other organisation, the rest anywhere but the reserved organisations.
    employers = list(singles) + [o for o in hqless for _ in range(2)] + list(rest)
    employers += [rng.pick(rest + hqless) for _ in range(N_PEOPLE - len(employers))]
    for person, org in zip(people, rng.shuffled(employers), strict=True):
        facts.append(Fact(WORKS_FOR, person, org))
        facts.append(Fact(LIVES_IN, person, rng.pick(cities)))
        if rng.chance(FORMER_SHARE):
            facts.append(Fact(FORMERLY, person, rng.pick([o for o in orgs if o != org])))
    return Universe(seed, tuple(people), tuple(orgs), tuple(cities), tuple(countries),
                    tuple(sorted(facts, key=Fact.text)))


def render_facts(facts) -> str:
    """The fact lines of the workspace file, one sentence a line, in the given order."""
    return "".join(f.text() + "\n" for f in facts)


def parse_facts(text: str) -> list[Fact]:
    """Every fact sentence of ``text`` (other lines are ignored)."""
    out = []
    for line in text.split("\n"):
        if not line.endswith("."):
            continue
        for relation, phrase in PHRASES.items():
            subject, sep, obj = line[:-1].partition(phrase)
            if sep and subject and obj and phrase not in obj:
                out.append(Fact(relation, subject, obj))
                break
    return out
