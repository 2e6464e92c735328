"""Oracle: the gold intruders and the hidden principle, read from the answer key."""
from agentlib import answer_key, reply
from curatorlib import format_reply

key = answer_key()
reply(format_reply(key["intruders"], key["principle"]))
