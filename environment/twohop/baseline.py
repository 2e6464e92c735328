"""A scripted baseline for twohop-env — a policy with an error model, not a model and not an LLM.

It is served behind the local OpenAI-compatible endpoint (`validate.localserver`) under
`MODEL_NAME`, so that an evaluation of twohop can be run end to end with real variance on a
machine with no LLM. It sees only what a model sees: the conversation (the question is the
user message's first line) and what its own ``bash`` calls print — the workspace's
``api_description.txt``. Never the gold rows, the answer key or the environment's solver.

What it does (`policy`, stateless: each request is answered from the conversation so far):

- it picks one *behaviour* per sample (`behaviour`): usually ``solve`` (read the facts with
  ``cat``, then answer), sometimes one of the realistic mistakes of `MISTAKES` — a malformed
  tool call it recovers from, only malformed calls, exploring with ``grep`` until the turns run
  out, an empty final message, the JSON wrapped in prose, a rambling answer longer than
  max_tokens, ``tail -f`` (a command that never ends) until the attempt's time is up, or ``kill 1``
  (the job ``%1`` meant, PID 1 hit) that ends its own sandbox;
- it follows each hop of the question over the facts it read (`Resolver`), and each hop goes
  wrong with probability `hop_error(temperature)` (3 % at temperature 0, 8 % at 1): the
  former employer for the current one (the distractor), a look-alike city or country; a
  missing headquarters is guessed with three times that probability instead of ``unknown``.
  With the same probability a list of people loses a member, gains a resident of the place
  (the one-hop shortcut: where a person lives, not where the employer is) or is sorted by
  surname instead of by full name. One blind spot is systematic, as a model's prior is: when
  a city has no recorded country it does not answer ``unknown`` but the country most cities
  lie in; so those questions are never solved.

Randomness: one ``random.Random`` per decision, seeded with sha256 of the request's ``seed``,
its temperature, the question and the decision's name (no ``hash()``): the same request gets
the same answer in any process, and each turn of a sample re-derives the same plan.
The sha256 of this file is the "model revision" of the eval contracts that use it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re

MODEL_NAME = "scripted-baseline-twohop"
FACTS_FILE = "api_description.txt"
UNKNOWN = "unknown"
READ = f"cat {FACTS_FILE}"
#: Relation → the phrase between subject and object in a fact line of the workspace file.
PHRASES = {"works_for": " works for ", "formerly": " formerly worked for ", "lives_in": " lives in ",
           "hq": " is headquartered in ", "located": " is located in "}
QUESTIONS = {
    "employer_city": r"In which city is the organisation that (.+) works for headquartered\?",
    "employer_country": r"In which country is the city where the organisation that (.+) works for is headquartered\?",
    # Tried in this order: the city question's pattern also matches the country question's text.
    "country_employees": r"Who works for an organisation headquartered in a city located in (.+)\?",
    "city_employees": r"Who works for an organisation headquartered in (.+)\?",
}
#: Mistakes of a whole sample and their weights (relative; see `behaviour`).
MISTAKES = {"malformed_then_solve": 4, "malformed_only": 1, "explore_forever": 2, "empty_reply": 2,
            "prose_wrapped": 3, "ramble": 1, "tail_forever": 1, "kill_all": 1}


def rng_for(request: dict, question: str, decision: str) -> random.Random:
    """The generator of one decision of one sample: sha256 of seed, temperature, question, name."""
    key = f"{request.get('seed') or 0}\n{temperature_of(request)!r}\n{question}\n{decision}"
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def temperature_of(request: dict) -> float:
    """As in the OpenAI API: absent means 1."""
    t = request.get("temperature")
    return 1.0 if t is None else float(t)


def hop_error(temperature: float) -> float:
    return 0.03 + 0.05 * temperature


def mistake_rate(temperature: float) -> float:
    return 0.05 + 0.12 * temperature


def behaviour(request: dict, question: str) -> str:
    """``solve`` or one of `MISTAKES`, drawn once per sample."""
    rng = rng_for(request, question, "behaviour")
    if rng.random() >= mistake_rate(temperature_of(request)):
        return "solve"
    names = sorted(MISTAKES)
    return rng.choices(names, weights=[MISTAKES[n] for n in names])[0]


class Resolver:
    """The facts read from the tool's output, walked hop by hop with the error model."""

    def __init__(self, text: str, rng: random.Random, error: float) -> None:
        self.by: dict[str, dict[str, str]] = {r: {} for r in PHRASES}
        for line in text.split("\n"):
            line = line.strip()
            for rel, phrase in PHRASES.items():
                subject, sep, obj = line.removesuffix(".").partition(phrase)
                if line.endswith(".") and sep and subject and obj and phrase not in obj:
                    self.by[rel][subject] = obj
                    break
        self.rng, self.error = rng, error
        self.cities = sorted(set(self.by["hq"].values()) | set(self.by["located"]) | set(self.by["lives_in"].values()))
        self.countries = sorted(set(self.by["located"].values()))

    def _lookalike(self, right: str, pool: list[str]) -> str:
        """A wrong entity of the same kind, one sharing the first letter if there is one."""
        others = [x for x in pool if x != right] or [right]
        near = [x for x in others if x[:1] == right[:1]]
        return self.rng.choice(near or others)

    def employer(self, person: str) -> str | None:
        right = self.by["works_for"].get(person)
        if right is not None and self.rng.random() < self.error:
            return self.by["formerly"].get(person) or self._lookalike(right, sorted(self.by["hq"]))
        return right

    def city(self, org: str | None) -> str | None:
        right = self.by["hq"].get(org) if org else None
        if right is None and org and self.rng.random() < 3 * self.error:
            return self.rng.choice(self.cities)  # a guess instead of "unknown"
        if right is not None and self.rng.random() < self.error:
            return self._lookalike(right, self.cities)
        return right

    def country(self, city: str | None) -> str | None:
        right = self.by["located"].get(city) if city else None
        if right is None and city and self.countries:  # the blind spot: every city lies somewhere
            counts = {c: list(self.by["located"].values()).count(c) for c in self.countries}
            return max(self.countries, key=lambda c: (counts[c], c))
        if right is not None and self.rng.random() < self.error:
            return self._lookalike(right, self.countries)
        return right

    def _works_in(self, person: str, kind: str, place: str) -> bool:
        city = self.by["hq"].get(self.by["works_for"].get(person, ""))
        return (city if kind == "city_employees" else self.by["located"].get(city or "")) == place

    def _lives_in(self, person: str, kind: str, place: str) -> bool:
        city = self.by["lives_in"].get(person)
        return (city if kind == "city_employees" else self.by["located"].get(city or "")) == place

    def answer(self, kind: str, subject: str) -> list[str]:
        if kind in ("employer_city", "employer_country"):
            place = self.city(self.employer(subject))
            if kind == "employer_country":
                place = self.country(place)
            return [place or UNKNOWN]
        people = [p for p in sorted(self.by["works_for"]) if self._works_in(p, kind, subject)]
        # Each listed person is missed with the hop error; a resident of the place (the
        # one-hop shortcut: where they live, not where their employer is) slips in with it.
        people = [p for p in people if self.rng.random() >= self.error]
        residents = [p for p in sorted(self.by["lives_in"]) if p not in people and self._lives_in(p, kind, subject)]
        if residents and self.rng.random() < self.error:
            people = sorted([*people, self.rng.choice(residents)])
        if len(people) > 1 and self.rng.random() < self.error:
            people.sort(key=lambda p: (p.split()[-1], p))  # by surname: a plausible misreading of the rule
        return people or [UNKNOWN]


def parse_question(text: str) -> tuple[str, str] | None:
    first = text.strip().split("\n", 1)[0]
    for kind, pattern in QUESTIONS.items():
        m = re.fullmatch(pattern, first)
        if m:
            return kind, m.group(1)
    return None


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def call(command: str | None, turn: int, raw: str | None = None) -> dict:
    """An assistant message with one bash call (`raw`: arguments exactly as given, malformed)."""
    args = raw if raw is not None else json.dumps({"command": command})
    return {"content": None, "tool_calls": [{"id": f"call_{turn}", "type": "function",
                                             "function": {"name": "bash", "arguments": args}}]}


def reply(rows: list[str]) -> str:
    return json.dumps({"rows": rows}, ensure_ascii=False)


def solved_rows(request: dict, question: tuple[str, str], facts: str) -> list[str]:
    t = temperature_of(request)
    return Resolver(facts, rng_for(request, question[1], "hops"), hop_error(t)).answer(*question)


def ramble(facts: str, rows: list[str]) -> str:
    """Every fact line weighed twice, aloud, then the answer: far past max_tokens."""
    lines = [x for x in facts.split("\n") if x.endswith(".")]
    notes = [f"Checking the fact '{x}' against the question: it may matter for the chain, so I note it."
             for x in lines]
    return "Let me reason step by step. " + " ".join(notes * 3) + " So the answer is " + reply(rows)


def policy(request: dict) -> dict:
    """The local server's policy: the next assistant message of the conversation so far."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    user = next((_text(m) for m in messages if m.get("role") == "user"), "")
    question = parse_question(user)
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    tools = [_text(m) for m in messages if m.get("role") == "tool"]
    if question is None:
        return {"content": reply([UNKNOWN])}
    mode = behaviour(request, question[1])
    facts = next((t for t in reversed(tools) if "## Facts" in t), None)
    if mode == "malformed_only":
        return call(None, turn, raw=f"{READ}")  # a bare command, not a JSON object
    if mode == "malformed_then_solve" and turn == 0:
        return call(None, turn, raw=json.dumps({"cmd": READ}))
    if mode == "tail_forever":
        return call(f"tail -f {FACTS_FILE}", turn)
    if mode == "explore_forever":
        return call(f"grep -n {json.dumps(question[1])} {FACTS_FILE} | head -{turn + 1}", turn)
    if facts is None:
        return call(READ, turn)
    if mode == "kill_all":
        return call("kill 1", turn)  # meant job %1; PID 1 is the sandbox's own init
    rows = solved_rows(request, question, facts)
    if mode == "empty_reply":
        return {"content": ""}
    if mode == "prose_wrapped":
        return {"content": f"The answer is {reply(rows)}."}
    if mode == "ramble":
        return {"content": ramble(facts, rows)}
    return {"content": reply(rows)}
