"""Identity control: the labels in displayed order, as one group."""
from agentlib import labels, reply

reply(labels())
