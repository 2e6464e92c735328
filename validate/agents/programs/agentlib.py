"""What every agent program shares: where things are, and how to reply. Stdlib only.

Mounted beside the agent as ``$AGENT_DIR/agentlib.py``.
"""
import json
import os

WORKSPACE = os.environ.get("WORKSPACE", "/workspace")
AGENT_DIR = os.environ.get("AGENT_DIR", "/agent")
ANSWER_KEY_DIR = os.environ.get("ANSWER_KEY_DIR", "/answer_key")


def task():
    """``{"id", "hash", "prompt", "meta"}`` of the task at hand."""
    with open(os.path.join(AGENT_DIR, "task.json")) as fh:
        return json.load(fh)


def labels():
    """The labels of paragraphs.jsonl in displayed order."""
    with open(os.path.join(WORKSPACE, "paragraphs.jsonl")) as fh:
        return [json.loads(line)["label"] for line in fh]


def answer_key():
    with open(os.path.join(ANSWER_KEY_DIR, "answer.json")) as fh:
        return json.load(fh)


def reply(answer):
    """Write ``\\boxed{<answer as JSON>}`` to the reply file."""
    with open(os.path.join(WORKSPACE, "reply.txt"), "w") as fh:
        fh.write("\\boxed{" + json.dumps(answer) + "}\n")
