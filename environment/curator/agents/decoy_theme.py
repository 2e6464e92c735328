"""Decoy-theme control: a well-formed reply that believes the decoy. The theme is the decoy
itself; the flagged items are members (the decoy explains every item, so whatever a decoy
believer flags is not an intruder), as many as there are intruders, seeded from the id."""
import random

from agentlib import answer_key, reply, task
from curatorlib import format_reply

key = answer_key()
members = sorted(it["id"] for it in key["items"] if not it["is_intruder"])
rng = random.Random(task()["id"])
reply(format_reply(rng.sample(members, len(key["intruders"])), key["decoy"]))
