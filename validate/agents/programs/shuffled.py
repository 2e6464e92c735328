"""Shuffled control: a random permutation, and for k > 1 a random grouping into k groups,
seeded from the task hash."""
import random

from agentlib import labels, reply, task

t = task()
order = labels()
rng = random.Random(int(t["hash"].split(":")[1][:16], 16))
rng.shuffle(order)
k = t["meta"].get("n_papers", 1)
cuts = sorted(rng.sample(range(1, len(order)), k - 1)) if k > 1 else []
groups = [order[a:b] for a, b in zip([0] + cuts, cuts + [len(order)])]
reply(groups[0] if k == 1 else groups)
