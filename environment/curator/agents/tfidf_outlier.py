"""TF-IDF odd-one-out control told the true count: the k items least similar in wording to
the rest (the validator's own baseline). It reads only the count from the answer key."""
from agentlib import answer_key, loads, read, reply
from curatorlib import COLLECTION_FILE, format_reply, tfidf_outliers

items = loads(read(COLLECTION_FILE).decode("utf-8"))
reply(format_reply(tfidf_outliers(items, len(answer_key()["intruders"])), "unknown"))
