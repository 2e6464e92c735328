"""Random control told the true count: that many ids drawn uniformly, seeded from the opaque
task id. It reads only the intruder count from the answer key, nothing else."""
import random

from agentlib import answer_key, loads, read, reply, task
from curatorlib import COLLECTION_FILE, format_reply

items = loads(read(COLLECTION_FILE).decode("utf-8"))
k = len(answer_key()["intruders"])
rng = random.Random(task()["id"])
reply(format_reply(rng.sample(sorted(it["id"] for it in items), k), "unknown"))
