"""Reversed control: the labels in reverse displayed order, as one group."""
from agentlib import labels, reply

reply(labels()[::-1])
