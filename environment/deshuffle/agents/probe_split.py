"""Partial-credit probe: the oracle's answer with the first paper of two or more units split
into two groups at its middle (each half in true order)."""
from agentlib import answer_key
from deshufflelib import answer

gold = [list(paper) for paper in answer_key()["gold"]]
i = next(i for i, p in enumerate(gold) if len(p) >= 2)
half = len(gold[i]) // 2
answer(gold[:i] + [gold[i][:half], gold[i][half:]] + gold[i + 1:])
