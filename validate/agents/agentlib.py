"""What every agent program shares, whatever its environment: where things are, the task's
public view, the answer key (for agents that see it) and how to reply. Stdlib only.

Mounted beside every agent as ``$AGENT_DIR/agentlib.py``; an environment's own helpers are
further ``support`` files beside it.

JSON goes through ``_json``, the C engine the ``json`` package itself runs on, and not
through ``json``: importing ``json`` pulls in ``re``, ``enum`` and ``collections`` and, in the
sandbox image's Python, costs ~11 ms per agent start, a third of a whole bwrap attempt
(docs/performance.md). The output is byte-identical to ``json.dumps``; where ``_json`` is
missing, ``json`` is used.
"""
import os

WORKSPACE = os.environ.get("WORKSPACE", "/workspace")
AGENT_DIR = os.environ.get("AGENT_DIR", "/agent")
ANSWER_KEY_DIR = os.environ.get("ANSWER_KEY_DIR", "/answer_key")

try:
    import _json
except ImportError:  # a Python without the C engine
    import json

    loads, dumps = json.loads, json.dumps
else:

    class _Decoding:
        """What the C scanner reads off a `json.JSONDecoder`: its defaults."""

        strict = True
        object_hook = object_pairs_hook = None
        parse_float = parse_constant = float
        parse_int = int

    def _refuse(obj):
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    _scan = _json.make_scanner(_Decoding)
    # json.dumps' defaults: no circular check, ", " and ": ", ASCII-escaped strings, NaN allowed.
    _encode = _json.make_encoder(None, _refuse, _json.encode_basestring_ascii, None, ": ", ", ", False, False,
                                 True)

    def loads(text):
        text = text.strip(" \t\n\r")
        try:
            obj, end = _scan(text, 0)
        except StopIteration:
            raise ValueError("not JSON") from None
        if end != len(text):
            raise ValueError(f"extra data after JSON at {end}")
        return obj

    def dumps(obj):
        return "".join(_encode(obj, 0))


def _read(path):
    with open(path) as fh:
        return loads(fh.read())


def task():
    """``{"id", "prompt", "meta"}`` of the task at hand. ``id`` is opaque: it names this task
    for seeding an agent's own randomness, and says nothing about how the task was made."""
    return _read(os.path.join(AGENT_DIR, "task.json"))


def answer_key():
    """The gold answer (JSON), for agents that see the answer key (the oracle, the probes)."""
    return _read(os.path.join(ANSWER_KEY_DIR, "answer.json"))


def read(name):
    """The bytes of a workspace file."""
    with open(os.path.join(WORKSPACE, name), "rb") as fh:
        return fh.read()


def lines(name):
    """A workspace text file's lines, split on ``\\n`` only (a paragraph may hold U+2028)."""
    text = read(name).decode("utf-8")
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n") if text else []


def reply(text):
    """Write the reply: ``text`` (a str) to ``/workspace/reply.txt``."""
    with open(os.path.join(WORKSPACE, "reply.txt"), "w", encoding="utf-8") as fh:
        fh.write(text)
