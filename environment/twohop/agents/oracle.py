"""Oracle: the gold rows from the read-only answer key, in the reply's exact shape."""
from agentlib import answer_key, dumps, reply

reply(dumps({"rows": answer_key()["rows"]}))
