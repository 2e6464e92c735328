"""Partial-credit probe: half the intruder set right, with the true principle. With two
intruders it flags one of them; with one it flags the intruder and one member. Either way
the intruder Jaccard is 1/2."""
from agentlib import answer_key, reply
from curatorlib import format_reply

key = answer_key()
gold = sorted(key["intruders"])
if len(gold) >= 2:
    flagged = gold[:1]
else:
    flagged = gold + sorted(it["id"] for it in key["items"] if not it["is_intruder"])[:1]
reply(format_reply(flagged, key["principle"]))
