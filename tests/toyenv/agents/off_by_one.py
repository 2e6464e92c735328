"""Toy probe: the answer key's sum plus one."""
from agentlib import answer_key, reply

reply(str(answer_key()["sum"] + 1))
