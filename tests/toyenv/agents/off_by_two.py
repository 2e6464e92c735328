"""Toy control: the sum of the numbers plus two."""
from agentlib import lines, reply

reply(str(sum(int(x) for x in lines("numbers.txt")) + 2))
