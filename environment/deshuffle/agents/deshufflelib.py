"""deshuffle-papers' own helpers for its agent programs (beside agentlib.py in /agent)."""
from agentlib import dumps, lines, loads, reply

PARAGRAPHS = "paragraphs.jsonl"


def labels():
    """The labels of paragraphs.jsonl in displayed order."""
    return [loads(line)["label"] for line in lines(PARAGRAPHS)]


def answer(partition):
    """Reply with ``\\boxed{<partition as JSON>}``."""
    reply("\\boxed{" + dumps(partition) + "}\n")
