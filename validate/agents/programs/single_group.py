"""Single-group control: every label in one group, written as a list of one list."""
from agentlib import labels, reply

reply([labels()])
