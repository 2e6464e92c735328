"""The 36-task dataset of one universe: which questions are asked, their prompts, the
``api_description`` (fact set and answer-format rules) and each ``expected_output``,
computed by executing `solver.resolve` over the facts.

Stdlib only (see `universe`): tasks are frozen dataclasses and rows plain dicts rather
than pydantic models for that reason. A row has the fields of the seed's hub dataset:
``task_id``, ``category``, ``prompt``, ``api_description``, ``expected_output``. The dataset's revision is
``sha256:`` of the canonical JSON of its rows in ``task_id`` order.

Selection (all from one seeded `Rng`, so a seed always gives the same bytes):

- twohop (10): people with no former employer; distractor (6): people with a former
  employer headquartered elsewhere; threehop (6): people whose chain reaches a country;
- broken (5): three people whose employer has no recorded headquarters, two whose
  employer's city has no recorded country — the answer is ``unknown``; their prompts are
  word for word those of twohop and threehop questions;
- reverse (4): cities hosting exactly one organisation with exactly one employee;
  aggregate (5): countries whose employees number two or more;
- a question is only taken if the one-hop shortcut (a person's home city standing in for
  the employer's) gives a different answer, and no city (country) answers more than two
  questions, so guessing the commonest answer scores badly;
- the scarcest categories are filled first (broken, distractor); a universe that cannot
  fill one is replaced by the seed's next attempt (`MAX_ATTEMPTS`), so every seed builds;
- the 36 questions are shuffled before numbering, so ``th-NNN`` says nothing of the
  category.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

from environment.twohop.solver import UNKNOWN, Index, Question, Resolution, resolve, shortcut
from environment.twohop.universe import FORMERLY, WORKS_FOR, Rng, Universe, build_universe, render_facts

#: The published dataset's universe seed.
DEFAULT_SEED = 0
FACTS_FILE = "api_description.txt"
REPLY_FILE = "reply.txt"
FACTS_MARKER = "## Facts"
CATEGORY_COUNTS = {"twohop": 10, "threehop": 6, "distractor": 6, "broken": 5, "aggregate": 5, "reverse": 4}
#: Most questions one answer (a city, a country) may answer within its kind.
ANSWER_CAP = 2
#: Broken questions whose chain stops at an organisation with no headquarters (the rest
#: stop at a city with no country).
BROKEN_CITY = 3
#: Universes tried per seed before giving up.
MAX_ATTEMPTS = 64

_QUESTIONS = {
    "employer_city": "In which city is the organisation that {} works for headquartered?",
    "employer_country": "In which country is the city where the organisation that {} works for "
                        "is headquartered?",
    "city_employees": "Who works for an organisation headquartered in {}?",
    "country_employees": "Who works for an organisation headquartered in a city located in {}?",
}
_PEOPLE_SHAPE = ("whose rows hold every such person's full name, sorted in ascending alphabetical order: "
                 '{"rows": ["<person>", ...]}')
_SHAPES = {
    "employer_city": 'whose rows hold the city\'s name: {"rows": ["<city>"]}',
    "employer_country": 'whose rows hold the country\'s name: {"rows": ["<country>"]}',
    "city_employees": _PEOPLE_SHAPE,
    "country_employees": _PEOPLE_SHAPE,
}
# The rules file is task content (every task hash covers it): its lines stay as agents read them.
_RULES = f"""# Facts and answer format

Every person, organisation, city and country below is invented. The facts are complete: what is not stated here is not known.

## Answer format

- Reply with exactly one JSON object and nothing else: {{"rows": [...]}}
- "rows" is a list of strings, each a name written exactly as in the facts; the comparison is exact and case-sensitive.
- A question about one entity has one row. A question asking who works somewhere has one row per person, sorted in ascending alphabetical (code-point) order of the full name.
- When the facts do not determine the answer, reply {{"rows": ["{UNKNOWN}"]}}: the word {UNKNOWN}, in lower case.

{FACTS_MARKER}

"""  # noqa: E501


def canonical_json(value: object) -> bytes:
    """The bytes of `environment.protocol.canonical_json` (sorted keys, no whitespace, UTF-8),
    restated because this module must import without pydantic, which the protocol needs."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prompt_for(question: Question) -> str:
    return (f"{_QUESTIONS[question.kind].format(question.subject)}\n\n"
            f"The file {FACTS_FILE} in your workspace holds the complete fact set and the answer-format "
            f"rules. Answer with one JSON object {_SHAPES[question.kind]}. If the facts do not determine the "
            f'answer, answer {{"rows": ["{UNKNOWN}"]}} (the word {UNKNOWN}, in lower case). Leave the JSON '
            f"object, and nothing else, in the file {REPLY_FILE} in your workspace.")


def api_description(universe: Universe) -> str:
    return _RULES + render_facts(universe.facts)


def facts_text(api_text: str) -> str:
    """The fact lines of an api_description (everything after the marker)."""
    return api_text.partition(FACTS_MARKER + "\n")[2]


@dataclass(frozen=True)
class BuiltTask:
    """One question of the dataset with its gold rows (host-side; `row` is the public record)."""

    task_id: str
    category: str
    question: Question
    prompt: str
    rows: tuple[str, ...]

    @property
    def expected_output(self) -> str:
        return canonical_json({"rows": list(self.rows)}).decode()

    def row(self, api_text: str) -> dict[str, str]:
        return {"task_id": self.task_id, "category": self.category, "prompt": self.prompt,
                "api_description": api_text, "expected_output": self.expected_output}


@dataclass(frozen=True)
class Dataset:
    universe: Universe
    tasks: tuple[BuiltTask, ...]
    api_description: str

    def rows(self) -> list[dict[str, str]]:
        return [t.row(self.api_description) for t in self.tasks]

    @property
    def revision(self) -> str:
        return "sha256:" + sha256_hex(canonical_json(self.rows()))


class BuildError(ValueError):
    """A seed whose universe cannot supply every category's questions."""


def _take(picks, category: str, kind: str, candidates, accept: Callable[[Question, Resolution], bool],
          key: Callable[[Question, Resolution], str], index: Index, count: int,
          cap: int = ANSWER_CAP) -> None:
    """Append the first ``count`` acceptable questions of ``candidates``: a subject is asked
    about once, ``key`` (an answer, an employer) recurs at most ``cap`` times within the
    kind, and the one-hop shortcut must answer differently."""
    uses: dict[str, int] = {}
    for _, q, r in picks:
        if q.kind == kind:
            uses[key(q, r)] = uses.get(key(q, r), 0) + 1
    subjects = {q.subject for _, q, _ in picks}
    taken = 0
    for subject in candidates:
        if taken == count:
            break
        q = Question(kind, subject)
        res = resolve(index, q)
        if subject in subjects or not accept(q, res) or uses.get(key(q, res), 0) >= cap:
            continue
        if shortcut(index, q).rows != res.rows:
            picks.append((category, q, res))
            uses[key(q, res)] = uses.get(key(q, res), 0) + 1
            subjects.add(subject)
            taken += 1
    if taken < count:
        raise BuildError(f"only {taken} of {count} {category} ({kind}) questions fit the universe")


def _select(universe: Universe, rng: Rng) -> list[tuple[str, Question, Resolution]]:
    index = Index(universe.facts)
    people = rng.shuffled(universe.people)
    former = index.by[FORMERLY]
    employer = {p: f.object for p, f in index.by[WORKS_FOR].items()}
    n = CATEGORY_COUNTS

    def answer(q: Question, r: Resolution) -> str:
        return r.rows[0] if len(r.rows) == 1 else q.subject

    def by_employer(q: Question, r: Resolution) -> str:
        return employer[q.subject]

    def misleads(q: Question, r: Resolution) -> bool:
        old = resolve(index, q, FORMERLY)
        return r.derivable and old.derivable and old.rows != r.rows

    picks: list[tuple[str, Question, Resolution]] = []
    # The scarcest first. Broken: the chain stops after the first hop (no HQ) or the second
    # (no country); each broken question has an organisation of its own.
    _take(picks, "broken", "employer_city", people, lambda q, r: not r.derivable and len(r.partial) == 1,
          by_employer, index, BROKEN_CITY, cap=1)
    _take(picks, "broken", "employer_country", people, lambda q, r: not r.derivable and len(r.partial) == 2,
          by_employer, index, n["broken"] - BROKEN_CITY, cap=1)
    # Then distractors: people with a misleading former employer are scarcer than others.
    _take(picks, "distractor", "employer_city", [p for p in people if p in former], misleads, answer, index,
          n["distractor"])
    _take(picks, "twohop", "employer_city", [p for p in people if p not in former],
          lambda q, r: r.derivable, answer, index, n["twohop"])
    _take(picks, "threehop", "employer_country", people, lambda q, r: r.derivable, answer, index,
          n["threehop"])
    _take(picks, "reverse", "city_employees", rng.shuffled(universe.cities),
          lambda q, r: r.derivable and len(r.rows) == 1, answer, index, n["reverse"])
    _take(picks, "aggregate", "country_employees", rng.shuffled(universe.countries),
          lambda q, r: len(r.rows) >= 2, answer, index, n["aggregate"])
    return picks


def build_dataset(seed: int = DEFAULT_SEED) -> Dataset:
    """The dataset of one universe seed, byte-identical in every process. A seed's universe
    is its first attempt that supplies every category (most seeds need one or two)."""
    for attempt in range(MAX_ATTEMPTS):
        universe = build_universe(seed, attempt)
        rng = Rng(f"twohop-env:questions:{seed}:{attempt}")
        try:
            picks = _select(universe, rng)
            break
        except BuildError as e:
            last = e
    else:
        raise BuildError(f"seed {seed}: no universe of {MAX_ATTEMPTS} attempts supplies every category "
                         f"(the last: {last}); choose another seed")
    tasks = tuple(BuiltTask(f"th-{i:03d}", category, q, prompt_for(q), res.rows)
                  for i, (category, q, res) in enumerate(rng.shuffled(picks)))
    return Dataset(universe, tasks, api_description(universe))
