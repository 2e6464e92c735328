"""Malformed control: a reply that is not a valid partition (the first label twice)."""
from agentlib import labels, reply

order = labels()
reply(order + order[:1])
