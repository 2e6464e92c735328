"""Curator's own helpers for its agent programs, stdlib only (mounted as ``/agent/curatorlib.py``).

The host imports this same module (``environment.curator.agents.curatorlib``): the dataset
validator's TF-IDF and length baselines and the sandboxed shortcut controls run one
implementation, so a baseline the validator measures is the control the harness plays.

Items come from the workspace's ``collection.json``: ``[{"id", "title", "description"}]``.
"""
import math
import re

COLLECTION_FILE = "collection.json"

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")
STOPWORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "been", "by", "for", "from", "has", "have", "in", "into", "is", "it", "its", "of", "on", "or", "that", "the", "their", "them", "they", "this", "to", "was", "were", "which", "with", "without", "not", "no", "than", "then", "so", "such", "can", "may", "also", "one", "two", "who", "whose", "what", "when", "where", "how", "all", "any", "each", "other", "some", "only", "own", "same", "very"])


def stem(word):
    """A deliberately light suffix stripper: enough to match plural and past forms of theme
    words ('symphonies' ~ 'symphony', 'played' ~ 'play'), never clever."""
    w = word.lower().replace("'", "")
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith(("ches", "shes", "sses", "xes", "zes")):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    if len(w) > 5 and w.endswith("ed"):
        return w[:-2]
    if len(w) > 6 and w.endswith("ing"):
        return w[:-3]
    return w


def tokens(text):
    """Lower-cased word stems of a text, stopwords and one-letter words dropped, in order."""
    out = []
    for m in _WORD.finditer(text.lower()):
        w = m.group(0)
        if len(w) > 1 and w not in STOPWORDS:
            out.append(stem(w))
    return out


def item_text(item):
    return item["title"] + " " + item["description"]


def tfidf_vectors(texts):
    """One sparse TF-IDF vector (dict stem -> weight, L2-normalised) per text; idf is the
    smoothed ``log((1 + n) / (1 + df)) + 1`` over these texts only."""
    docs = [tokens(t) for t in texts]
    n = len(docs)
    df = {}
    for doc in docs:
        for w in set(doc):
            df[w] = df.get(w, 0) + 1
    vectors = []
    for doc in docs:
        tf = {}
        for w in doc:
            tf[w] = tf.get(w, 0) + 1
        vec = {w: c * (math.log((1 + n) / (1 + df[w])) + 1) for w, c in tf.items()}
        norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
        vectors.append({w: v / norm for w, v in vec.items()})
    return vectors


def _cosine(a, b):
    if len(a) > len(b):
        a, b = b, a
    return sum(v * b.get(w, 0.0) for w, v in a.items())


def tfidf_outliers(items, k):
    """The k items least similar on average to the rest (ties: the earlier id)."""
    vecs = tfidf_vectors([item_text(it) for it in items])
    n = len(items)
    mean_sim = []
    for i in range(n):
        s = sum(_cosine(vecs[i], vecs[j]) for j in range(n) if j != i)
        mean_sim.append((s / max(n - 1, 1), i))
    return sorted(items[i]["id"] for _, i in sorted(mean_sim)[:k])


def length_outliers(items, k):
    """The k items whose description length is farthest from the collection's median
    (ties: the earlier id)."""
    lengths = sorted(len(it["description"]) for it in items)
    mid = len(lengths) // 2
    median = lengths[mid] if len(lengths) % 2 else (lengths[mid - 1] + lengths[mid]) / 2
    ranked = sorted(range(len(items)), key=lambda i: (-abs(len(items[i]["description"]) - median), i))
    return sorted(items[i]["id"] for i in ranked[:k])


def format_reply(ids, theme):
    """The reply format the task asks for: ``<intruders>D, K</intruders>`` then ``<theme>``."""
    return "<intruders>" + ", ".join(sorted(ids)) + "</intruders>\n<theme>" + theme + "</theme>\n"
