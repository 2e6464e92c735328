"""The oracle, two seconds late: long enough to be killed from outside mid-run."""
import time

from agentlib import answer_key
from deshufflelib import answer

time.sleep(2)
gold = answer_key()["gold"]
answer(gold[0] if len(gold) == 1 else gold)
