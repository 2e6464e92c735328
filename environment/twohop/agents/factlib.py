"""What the fact-reading controls share: the facts of ``api_description.txt`` as maps, the
question parsed off the prompt's first line, and the reply's JSON shape. Stdlib only.

An independent reading of the workspace (it does not import the environment): if the file
or the prompt wording drifts from what these programs expect, their tests fail.
"""
from agentlib import dumps, read, reply, task

FACTS_FILE = "api_description.txt"
MARKER = "## Facts\n"
UNKNOWN = "unknown"
PHRASES = (
    ("works_for", " works for "),
    ("formerly_worked_for", " formerly worked for "),
    ("lives_in", " lives in "),
    ("headquartered_in", " is headquartered in "),
    ("located_in", " is located in "),
)
# Longest prefix first: the country question's prefix extends the city one.
QUESTIONS = (
    ("country_employees", "Who works for an organisation headquartered in a city located in ", "?"),
    ("city_employees", "Who works for an organisation headquartered in ", "?"),
    ("employer_country", "In which country is the city where the organisation that ", " works for is headquartered?"),
    ("employer_city", "In which city is the organisation that ", " works for headquartered?"),
)


def facts():
    """``{relation: {subject: object}}`` from the workspace file."""
    out = {rel: {} for rel, _ in PHRASES}
    text = read(FACTS_FILE).decode("utf-8").partition(MARKER)[2]
    for line in text.split("\n"):
        if not line.endswith("."):
            continue
        for rel, phrase in PHRASES:
            subject, sep, obj = line[:-1].partition(phrase)
            if sep:
                out[rel][subject] = obj
                break
    return out


def question():
    """``(kind, subject)`` of the task's question, or (None, None) for an unknown wording."""
    first = task()["prompt"].split("\n", 1)[0]
    for kind, prefix, suffix in QUESTIONS:
        if first.startswith(prefix) and first.endswith(suffix):
            return kind, first[len(prefix):len(first) - len(suffix)]
    return None, None


def modal(mapping):
    """The most frequent value of ``mapping`` (ties: the smallest), or None."""
    counts = {}
    for v in mapping.values():
        counts[v] = counts.get(v, 0) + 1
    return min(counts, key=lambda v: (-counts[v], v)) if counts else None


def answer(rows):
    reply(dumps({"rows": list(rows) or [UNKNOWN]}))
