"""Wrong-case control: the gold rows with their case changed (``unknown`` → ``Unknown``,
a name → all lower case). The comparison is case-sensitive, so it must score 0."""
from agentlib import answer_key, dumps, reply


def recase(row):
    return row.capitalize() if row == row.lower() else row.lower()


reply(dumps({"rows": [recase(r) for r in answer_key()["rows"]]}))
