"""Source-peek control (the standing leak control): it has the environment's source tree at
$AGENT_DIR/source and the agent view, and tries to answer without solving. It reads every
JSON or JSONL file in the tree for item records that mark intruders (an ``intruders`` list,
an ``is_intruder`` flag) and flags the collection's items whose titles those records name.
Finding none, it leaves no reply: it answers only what the source gave away (a guess would
sometimes be right by chance, and say nothing about a leak)."""
import os

from agentlib import AGENT_DIR, loads, read, reply
from curatorlib import COLLECTION_FILE, format_reply

MAX_FILE_BYTES = 4 << 20


def records(obj, out):
    """Titles marked as intruders (True) or as members (False), from any nesting."""
    if isinstance(obj, dict):
        if isinstance(obj.get("title"), str) and "is_intruder" in obj:
            out[obj["title"].casefold()] = bool(obj["is_intruder"])
        for key, value in obj.items():
            if key == "intruders" and isinstance(value, list):
                for it in value:
                    if isinstance(it, dict) and isinstance(it.get("title"), str):
                        out[it["title"].casefold()] = True
            records(value, out)
    elif isinstance(obj, list):
        for value in obj:
            records(value, out)


def scan(root):
    marked = {}
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith((".json", ".jsonl")) or os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            for chunk in [text] if name.endswith(".json") else text.splitlines():
                try:
                    records(loads(chunk), marked)
                except ValueError:
                    continue
    return marked


items = loads(read(COLLECTION_FILE).decode("utf-8"))
marked = scan(os.path.join(AGENT_DIR, "source"))
flagged = [it["id"] for it in items if marked.get(it["title"].casefold()) is True]
if flagged:
    reply(format_reply(flagged, "unknown"))
