"""Description-length outlier control told the true count: the k descriptions farthest from
the median length (the validator's own baseline). It reads only the count from the key."""
from agentlib import answer_key, loads, read, reply
from curatorlib import COLLECTION_FILE, format_reply, length_outliers

items = loads(read(COLLECTION_FILE).decode("utf-8"))
reply(format_reply(length_outliers(items, len(answer_key()["intruders"])), "unknown"))
