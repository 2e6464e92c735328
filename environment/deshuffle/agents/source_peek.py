"""Source-peek control, the standing leak test: it has this environment's whole source
(mounted at /agent/source) and the agent view, and tries to derive the answer from them
without solving the task.

Its attacks are the two that worked against an earlier version of this harness:

1. **Replay.** A task id naming idx and seed (``deshuffle:<idx>:<seed>``) let an agent replay
   the generator's random stream, which was seeded from exactly those, and read off the
   true order. It replays the old stream whenever the id names them.
2. **Commitment.** A task hash shown to the agent committed to the gold unsalted, so trying
   candidate answers against it found the paper boundaries. It verifies every candidate it
   has against every sha256 in the view.

It answers only what an attack derived; when none applies it leaves no reply. The harness
now shows only an opaque id (no idx, no seed, no hash), and the shuffle is seeded from the
papers' true-order text (see the source's ``generate`` docstring), so it must score 0.
"""
import hashlib
import os
import random
import re

from agentlib import AGENT_DIR, dumps, task
from deshufflelib import answer, labels

view = task()
order = labels()
source = os.path.join(AGENT_DIR, "source", "generate.py")
assert os.path.exists(source), "the source is mounted"


def replay_k1(idx, seed, m):
    """The old generator: one stream from (seed, idx) for the paper count, then the shuffle."""
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


candidates = []
named = re.fullmatch(r"deshuffle:(\d+):(\d+)", view["id"])
if named and view["meta"].get("n_papers", 1) == 1:
    candidates.append(replay_k1(int(named.group(1)), int(named.group(2)), len(order)))
commitments = set(re.findall(r"[0-9a-f]{64}", dumps(view)))
verified = [c for c in candidates
            if not commitments or any(hashlib.sha256(dumps([c]).encode()).hexdigest() == h for h in commitments)]
if verified:
    answer(verified[0])
