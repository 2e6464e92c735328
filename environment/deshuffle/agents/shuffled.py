"""Shuffled control: a random permutation, and for k > 1 a random grouping into k groups,
seeded from the task's opaque id. Tests that chance does not pass."""
import random

from agentlib import task
from deshufflelib import answer, labels

t = task()
order = labels()
rng = random.Random(t["id"])
rng.shuffle(order)
k = t["meta"].get("n_papers", 1)
cuts = sorted(rng.sample(range(1, len(order)), k - 1)) if k > 1 else []
groups = [order[a:b] for a, b in zip([0] + cuts, cuts + [len(order)])]
answer(groups[0] if k == 1 else groups)
