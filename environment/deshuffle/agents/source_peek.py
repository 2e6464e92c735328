"""Source-peek control, the standing leak test: it has this environment's whole source
(mounted at /agent/source) and the agent view, and tries to derive the answer from them
without solving the task.

Its attacks, each one that worked against an earlier version of this environment:

1. **Replay check.** The shuffle is keyed by (task secret, seed, idx, true-order text), so
   with the source a guessed order is checked by replaying it (`replaylib`). From a heuristic
   answer it tries every order within two moves, against every guess of the key's other
   inputs: secrets — none (the replayable generator) and every hex string its view holds
   (and the secret the harness derives from a 32-hex salt); seed 0; idx 0..63; within a
   budget of replays (`HASHED_BYTES`). Against a secretless generator this search, from the
   heuristic baseline's answer, found the gold of one task in 60 (tests/test_deshuffle_secret.py
   shows it does with the secret). Its start is the baseline itself when the sandbox can
   import it (it needs numpy), else a crude stdlib order; one-paper tasks only.
2. **Old replay.** A task id naming idx and seed (``deshuffle:<idx>:<seed>``) let an agent
   replay a stream seeded from exactly those.
3. **Commitment.** A task hash shown to the agent committed to the gold unsalted; every
   candidate is checked against every sha256 in the view.

It answers only what an attack confirmed; otherwise it leaves no reply and says on stderr
how many replays it tried. The harness shows only an opaque id and never the secret, so it
must score 0.
"""
import hashlib
import os
import random
import re
import sys

from agentlib import AGENT_DIR, WORKSPACE, dumps, task
from deshufflelib import PARAGRAPHS, answer, labels
from replaylib import search

SOURCE = os.path.join(AGENT_DIR, "source")
IDX_GUESSES = range(64)
#: Replays per task: bytes hashed over the task's text (about 0.2-0.5 s whatever the paper,
#: since it is played on every task of every pool), within 500..10,000 replays.
HASHED_BYTES = 50_000_000
HEX = re.compile(r"(?<![0-9a-f])([0-9a-f]{64}|[0-9a-f]{32})(?![0-9a-f])")
CITATION = re.compile(r"\[(\d{1,3})")

view = task()
order = labels()
assert os.path.exists(os.path.join(SOURCE, "generate.py")), "the source is mounted"


def unit_texts():
    """Label → the unit's JSON text exactly as the generator hashed it."""
    out = {}
    with open(os.path.join(WORKSPACE, PARAGRAPHS), "rb") as fh:
        for line in fh.read().split(b"\n"):
            if line:
                head, _, rest = line.partition(b', "text": ')
                out[int(head.split(b":")[1])] = rest[:-1]
    return out


def view_text():
    """Everything readable in the view: task.json, the workspace, the source tree."""
    chunks = [dumps(view)]
    for root in (WORKSPACE, SOURCE):
        for folder, _, files in os.walk(root):
            for name in sorted(files):
                with open(os.path.join(folder, name), "rb") as fh:
                    chunks.append(fh.read().decode("utf-8", "replace"))
    return "\n".join(chunks)


def secret_guesses(text):
    found = sorted(set(HEX.findall(text)))
    derived = [hashlib.sha256(f"task-secret\n{s}".encode()).hexdigest() for s in found if len(s) == 32]
    return ["", *found, *derived]


def heuristic(texts):
    """The baseline's order where it imports, else by each paragraph's first citation number."""
    try:
        sys.path.insert(0, SOURCE)
        from baseline import solve

        return solve([(label, texts[label].decode()) for label in order], 1)[0]
    except ImportError:
        first = {label: int(m.group(1)) if (m := CITATION.search(texts[label].decode())) else 10**6
                 for label in order}
        return sorted(order, key=lambda label: (first[label], label))


def replay_k1(idx, seed, m):
    """The oldest generator: one stream from (seed, idx) for the paper count, then the shuffle."""
    digest = hashlib.sha256(f"deshuffle-papers:{seed}:{idx}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    rng.random()  # the paper count draw
    units = list(range(m))
    for i in range(m - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        units[i], units[j] = units[j], units[i]
    label_of = [0] * m
    for label, unit in enumerate(units, 1):
        label_of[unit] = label
    return label_of


def main():
    if view["meta"].get("n_papers", 1) != 1:
        print("source-peek: several papers; the grouping is a further guess, not tried", file=sys.stderr)
        return
    texts = unit_texts()
    candidates = []
    named = re.fullmatch(r"deshuffle:(\d+):(\d+)", view["id"])
    if named:
        candidates.append(replay_k1(int(named.group(1)), int(named.group(2)), len(order)))
    text = view_text()
    commitments = set(HEX.findall(dumps(view)))
    candidates = [c for c in candidates if any(hashlib.sha256(dumps([c]).encode()).hexdigest() == h
                                               for h in commitments) or not commitments]
    guesses = [(s, 0, i) for s in secret_guesses(text) for i in IDX_GUESSES]
    budget = max(500, min(10_000, HASHED_BYTES // sum(len(t) + 1 for t in texts.values())))
    found, tried = search(heuristic(texts), texts, guesses, moves=2, budget=budget)
    if found is not None:
        candidates.insert(0, found)
    print(f"source-peek: {tried} replays ({len(guesses)} key guesses), "
          f"{'confirmed an order' if candidates else 'no order confirmed'}", file=sys.stderr)
    if candidates:
        answer(candidates[0])


main()
