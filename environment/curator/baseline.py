"""A scripted *recall* baseline for curator — a policy with an error model, not a model, not a solver.

Curator cannot be solved from the task's files alone: finding the items that do not share
a principle takes knowledge of the items (who painted *The Goldfinch*). A model brings that
knowledge from pretraining; this policy brings it from a *memory*: the published theme
specs (`environment/curator/specs/*.json`), of which it reads only each theme's principle,
decoy and member titles — never the intruder lists, the task's answer key or the ``why`` of an
intruder. So it stands in for a model that has memorised the published dataset (a
contaminated model): its figures say how the harness measures a policy with a known error
model, never how hard curator is. It is served behind the local OpenAI-compatible endpoint
(`validate.localserver`) under `MODEL_NAME`; the sha256 of this file is the "model
revision" of the eval contracts that use it (the memory is pinned by the dataset revision).

What it does (`policy`, stateless: each request is answered from the conversation so far):

- it picks one *behaviour* per sample (`behaviour`): usually ``solve`` (read
  ``collection.json`` with ``cat``, then answer in the two tags), sometimes one of the
  realistic mistakes of `MISTAKES`: a malformed tool call it recovers from, only malformed
  calls, ``grep`` until the turns run out, an empty final message, the answer in its own
  words instead of the tags, a rambling answer longer than max_tokens, ``tail -f`` until the
  attempt's time is up, or ``kill 1`` (the job ``%1`` meant) that ends its own sandbox;
- it recalls the theme whose member titles cover most of the collection's, and flags the items
  it does not remember as members; each item is misjudged with probability `item_error`
  (temperature and the theme's tier: subtle themes are misjudged more);
- it names the remembered principle, sometimes the decoy instead, sometimes a vague half of
  the principle. One blind spot is systematic: on a subtle theme whose decoy shares more words
  with the items' text than the principle does, it always names the decoy, and is sure of it:
  it answers those tasks as at temperature 0 whatever the seed (a peaked distribution), so
  they are never solved and their k rewards are equal.

Randomness: one ``random.Random`` per decision, seeded with sha256 of the request's ``seed``,
its temperature, the collection and the decision's name (no ``hash()``).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from functools import lru_cache
from pathlib import Path

MODEL_NAME = "scripted-recall-baseline-curator"
COLLECTION_FILE = "collection.json"
READ = f"cat {COLLECTION_FILE}"
SPECS_DIR = Path(__file__).resolve().parent / "specs"
TIER_FACTOR = {"obvious": 0.5, "moderate": 1.0, "subtle": 2.0}
MISTAKES = {"malformed_then_solve": 4, "malformed_only": 1, "explore_forever": 2, "empty_reply": 2,
            "own_words": 3, "ramble": 1, "tail_forever": 1, "kill_all": 1}
_ITEM = re.compile(r"^([A-Z])\. (.+?): ", re.MULTILINE)
_WORD = re.compile(r"[a-z]{4,}")


@lru_cache(maxsize=1)
def memory() -> tuple[dict, ...]:
    """What the policy "knows": each theme's principle, decoy, tier and member titles."""
    out = []
    for path in sorted(SPECS_DIR.glob("*.json")):
        spec = json.loads(path.read_text(encoding="utf-8"))
        out.append({"principle": spec["principle"], "decoy": spec["decoy"], "tier": spec["difficulty"],
                    "members": frozenset(m["title"] for m in spec["members"])})
    return tuple(out)


def temperature_of(request: dict) -> float:
    t = request.get("temperature")
    return 1.0 if t is None else float(t)


def rng_for(request: dict, key: str, decision: str) -> random.Random:
    text = f"{request.get('seed') or 0}\n{temperature_of(request)!r}\n{key}\n{decision}"
    return random.Random(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big"))


def item_error(temperature: float, tier: str) -> float:
    return (0.004 + 0.016 * temperature) * TIER_FACTOR.get(tier, 1.0)


def mistake_rate(temperature: float) -> float:
    return 0.05 + 0.12 * temperature


def behaviour(request: dict, key: str) -> str:
    rng = rng_for(request, key, "behaviour")
    if rng.random() >= mistake_rate(temperature_of(request)):
        return "solve"
    names = sorted(MISTAKES)
    return rng.choices(names, weights=[MISTAKES[n] for n in names])[0]


def parse_items(text: str) -> dict[str, str]:
    """id → title: from ``collection.json`` as ``cat`` prints it, else from the prompt's list."""
    try:
        items = json.loads(text.strip().split("\n")[0])
        return {it["id"]: it["title"] for it in items if isinstance(it, dict)}
    except (ValueError, TypeError, KeyError):
        return dict(_ITEM.findall(text))


def recall(titles: list[str]) -> dict | None:
    """The remembered theme whose members cover most of these titles."""
    scored = [(len(t["members"] & set(titles)), t["principle"], t) for t in memory()]
    best = max(scored, key=lambda s: (s[0], s[1]), default=None)
    return best[2] if best and best[0] else None


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def decoy_pull(theme: dict, items_text: str) -> bool:
    """The blind spot: a subtle theme whose decoy shares more words with the items than its principle."""
    seen = _words(items_text)
    return theme["tier"] == "subtle" and len(_words(theme["decoy"]) & seen) > len(_words(theme["principle"]) & seen)


def judge_items(request: dict, items: dict[str, str], items_text: str) -> tuple[list[str], str]:
    """(the ids flagged as intruders, the stated theme) with the error model."""
    theme = recall(list(items.values()))
    if theme is None:
        return [], "Items that share a common theme."
    key = items_text[:2000]
    rng, error = rng_for(request, key, "items"), item_error(temperature_of(request), theme["tier"])
    flagged = [i for i, title in sorted(items.items()) if (title not in theme["members"]) != (rng.random() < error)]
    t = temperature_of(request)
    draw = rng_for(request, key, "theme").random()
    if decoy_pull(theme, items_text) or draw < 0.02 + 0.04 * t:
        return flagged, theme["decoy"]
    if draw < 0.04 + 0.08 * t:
        words = theme["principle"].split()
        return flagged, " ".join(words[:max(2, len(words) // 2)])
    return flagged, theme["principle"]


def tags(flagged: list[str], theme: str) -> str:
    return f"<intruders>{', '.join(flagged)}</intruders>\n<theme>{theme}</theme>"


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def call(command: str | None, turn: int, raw: str | None = None) -> dict:
    args = raw if raw is not None else json.dumps({"command": command})
    return {"content": None, "tool_calls": [{"id": f"call_{turn}", "type": "function",
                                             "function": {"name": "bash", "arguments": args}}]}


def ramble(items: dict[str, str], flagged: list[str], theme: str) -> str:
    notes = [f"Item {i}, {title}: does it share the principle with the others? I weigh it against each of them."
             for i, title in sorted(items.items())]
    return "Let me think it through. " + " ".join(notes * 40) + "\n" + tags(flagged, theme)


def policy(request: dict) -> dict:
    """The local server's policy: the next assistant message of the conversation so far."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    user = next((_text(m) for m in messages if m.get("role") == "user"), "")
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    tools = [_text(m) for m in messages if m.get("role") == "tool"]
    key = user[-2000:]
    listed = user.partition("The collection:")[2]
    theme = recall(list(parse_items(listed).values()))
    if theme is not None and decoy_pull(theme, listed):
        # Sure of the wrong theme: a peaked distribution answers as at temperature 0 whatever
        # the seed, so every sample of such a task is the same conversation.
        request = {**request, "seed": 0, "temperature": 0.0}
    mode = behaviour(request, key)
    read = next((t for t in reversed(tools) if t.lstrip().startswith("[{")), None)
    if mode == "malformed_only":
        return call(None, turn, raw=READ)
    if mode == "malformed_then_solve" and turn == 0:
        return call(None, turn, raw=json.dumps({"cmd": READ}))
    if mode == "tail_forever":
        return call(f"tail -f {COLLECTION_FILE}", turn)
    if mode == "explore_forever":
        return call(f"grep -o '\"id\":\"[A-Z]\"' {COLLECTION_FILE} | sed -n {turn + 1}p", turn)
    if read is None:
        return call(READ, turn)
    if mode == "kill_all":
        return call("kill 1", turn)  # meant job %1; PID 1 is the sandbox's own init
    items = parse_items(read) or parse_items(user)
    flagged, theme = judge_items(request, items, listed)
    if mode == "empty_reply":
        return {"content": ""}
    if mode == "own_words":
        return {"content": f"The odd ones out are {' and '.join(flagged) or 'none'}; the rest are: {theme}"}
    if mode == "ramble":
        return {"content": ramble(items, flagged, theme)}
    return {"content": tags(flagged, theme)}
