"""A heuristic baseline for deshuffle-papers — not a model, not an LLM, and no upper bound.

It is the real policy served behind the local OpenAI-compatible endpoint
(`validate.devtools.localserver`) under the model name `MODEL_NAME`, so that a model-evaluation
phase can be exercised end to end on a machine with no LLM. It sees only what an agent
sees: the prompt (number of papers k, number of paragraphs M) and the text of
``paragraphs.jsonl`` as returned by its ``bash`` tool call. Never the gold.

The solver (`solve`), in three steps over TF-IDF vectors of the paragraphs' words:

1. **Grouping** (k > 1): spectral clustering of the paragraphs' k-nearest-neighbour
   cosine-similarity graph into k groups (papers have different vocabularies); section
   headings, which have almost no vocabulary, join the group whose paragraphs share most
   of their words, identical headings spread over different groups.
2. **Position** within a group: a prior in [0, 1] from cues a reader uses — numeric citations
   (``[12]``: references are numbered in order of first use), figure numbers, canonical
   section headings (Introduction … Discussion … Acknowledgements) and a few rhetorical
   phrases ("little is known", "future work") — spread to the paragraphs without cues
   by label propagation over the similarity graph.
3. **Order**: a greedy chain that, from the paragraphs with the smallest positions, picks the
   next one by similarity to the last placed minus its distance in position (lexical-overlap
   adjacency). At temperature 0 it takes the best choice (deterministic); above 0 it samples
   among the near-best with ``random.Random(seed)``, softmax at that temperature.
   (Deterministic means: the same answer for the same input with the same numpy build;
   the eigenvectors come from the machine's LAPACK.)

`policy` is the server-side policy: no tool result yet → a ``bash`` call reading the file;
after it → the ``\\boxed{...}`` answer. A truncated tool output is answered with what it
has: labels it never saw are appended to the largest group so the partition stays valid.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter

import numpy as np

MODEL_NAME = "heuristic-baseline-deshuffle"
READ_COMMAND = "cat /workspace/paragraphs.jsonl"
BASH_TOOL = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}

_WORD = re.compile(r"[a-z][a-z0-9]+(?:-[a-z0-9]+)*")
_STOP = frozenset("""a about above after again all also although among an and any are as at be because been
before being between both but by can could did do does doing during each either et al few for from further had
has have having here how however if in into is it its itself just may might more most much must no nor not of
off on once only or other our ours out over own same should since so some such than that the their theirs them
then there these they this those through thus to too under until up upon very was we were what when where
whether which while who whom why will with within without would yet you your""".split())
_CITATION = re.compile(r"\[(\d{1,3}(?:\s*[,;–-]\s*\d{1,3})*)\]")
_FIGURE = re.compile(r"\b(?:Fig(?:ure)?s?\.?|FIG\.?)\s*(\d{1,2})\b")  # not "Figure S1": supplementary
#: Canonical section headings → usual relative position in a paper; the first match wins,
#: so end matter ("Data availability") is tried before the sections it shares words with.
_HEADINGS = (
    (r"acknowledge?ments?|funding|author|contributions?|data availability|supporting|supplementary|"
     r"competing|ethics|abbreviations|references", 0.99),
    (r"abstract|summary|significance", 0.0), (r"introduction|background|overview|motivation", 0.05),
    (r"related work|literature|previous work|prior work", 0.15), (r"theory|model|framework|preliminar", 0.3),
    (r"materials?|methods?|methodology|experimental|setup|data|participants|study design|approach", 0.4),
    (r"results? and discussion", 0.6), (r"results?|experiments?|evaluation|findings", 0.6),
    (r"discussion|limitations?|implications?", 0.82),
    (r"conclusions?|concluding|summary and|future work", 0.92),
)
#: Rhetorical phrases → relative position. Only the few that measurably lean one way are
#: kept: most ("in this paper", "we found", "in conclusion") occur all over a paper.
_PHRASES = (
    (r"\b(?:we hypothesi[sz]ed|little is known|remains? (?:unclear|unknown)|our (?:main )?contributions)",
     0.2),
    (r"\bfuture (?:work|research|studies|directions)", 0.85),
)


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def is_heading(text: str) -> bool:
    """A section heading: a short line that is not a sentence."""
    return len(text.split()) <= 12 and not text.rstrip().endswith((".", ":", "?", "!", ";"))


def tfidf(texts: list[str]) -> np.ndarray:
    """L2-normalised TF-IDF rows over the words shared by at least two texts."""
    docs = [Counter(words(t)) for t in texts]
    df = Counter(w for d in docs for w in d)
    vocab = sorted(w for w, c in df.items() if c >= 2)  # sorted: a deterministic column order
    column = {w: j for j, w in enumerate(vocab)}
    x = np.zeros((len(texts), len(vocab)))
    for i, doc in enumerate(docs):
        for w, c in doc.items():
            if w in column:
                x[i, column[w]] = (1 + math.log(c)) * math.log(len(texts) / df[w])
    norms = np.linalg.norm(x, axis=1)
    return x / np.where(norms > 0, norms, 1)[:, None]


def knn_graph(sim: np.ndarray, m: int = 10) -> np.ndarray:
    """Each node's m most similar neighbours, symmetrised (an edge if either side chose it)."""
    n = len(sim)
    a = np.zeros_like(sim)
    if n < 2:
        return a
    m = min(m, n - 1)
    nearest = np.argsort(-sim, axis=1, kind="stable")[:, :m]
    rows = np.repeat(np.arange(n), m)
    a[rows, nearest.ravel()] = sim[rows, nearest.ravel()]
    return np.maximum(a, a.T)


def kmeans(points: np.ndarray, k: int, iterations: int = 50) -> np.ndarray:
    """Lloyd's k-means from a farthest-point start (deterministic)."""
    centres = [points[int(np.argmax(np.linalg.norm(points - points.mean(0), axis=1)))]]
    while len(centres) < k:
        dist = np.min([np.linalg.norm(points - c, axis=1) for c in centres], axis=0)
        centres.append(points[int(np.argmax(dist))])
    centres = np.array(centres)
    assign = np.full(len(points), -1)
    for _ in range(iterations):
        new = np.argmin(((points[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
        if np.array_equal(new, assign):
            break
        assign = new
        centres = np.array([points[assign == g].mean(0) if np.any(assign == g) else centres[g]
                            for g in range(k)])
    return assign


def spectral_groups(sim: np.ndarray, k: int) -> np.ndarray:
    """Group index per row: regularised spectral clustering of the kNN similarity graph."""
    n = len(sim)
    if k <= 1:
        return np.zeros(n, dtype=int)
    if n <= k:  # one paragraph per group
        return np.arange(n)
    a = knn_graph(sim)
    a = a + a.sum() / n / n  # regularisation: isolated paragraphs do not make groups of their own
    d = 1 / np.sqrt(a.sum(1))
    _, vecs = np.linalg.eigh(np.eye(n) - d[:, None] * a * d[None, :])
    u = vecs[:, :k]
    u = u / np.maximum(np.linalg.norm(u, axis=1), 1e-12)[:, None]
    return kmeans(u, k)


def heading_position(text: str) -> float | None:
    low = re.sub(r"^(?:[\d.]+|[ivx]+\.)\s*", "", text.strip().lower())  # "2.1 Methods", "IV. Results"
    for pattern, pos in _HEADINGS:
        if re.match(pattern, low):
            return pos
    return None


def _citation_max(text: str) -> int:
    nums = [int(n) for group in _CITATION.findall(text) for n in re.findall(r"\d+", group)]
    return max(nums, default=0)


def _ranks(values: dict[int, float]) -> dict[int, float]:
    """Key → dense rank of its value, scaled to [0, 1]; empty when all values are equal."""
    ordered = sorted(set(values.values()))
    if len(ordered) < 2:
        return {}
    rank = {v: r / (len(ordered) - 1) for r, v in enumerate(ordered)}
    return {i: rank[v] for i, v in values.items()}


def priors(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(position prior, confidence) per text from citations, figures, headings and phrases."""
    n = len(texts)
    cues: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    # Numbered references appear in order of first use, so a paragraph's highest number
    # grows along the whole paper (three citing paragraphs make it a citation style, not
    # an interval like [0, 1]); figures are cited in order too, mostly in the results, the
    # middle of a paper. The spans and weights were set by measuring Kendall tau on tasks.
    cites = {i: c for i, c in enumerate(map(_citation_max, texts)) if c}
    if len(cites) >= 3:
        for i, r in _ranks(cites).items():
            cues[i].append((0.05 + 0.9 * r, 2.0))
    figs = {i: min(int(f) for f in _FIGURE.findall(t)) for i, t in enumerate(texts) if _FIGURE.search(t)}
    for i, r in _ranks(figs).items():
        cues[i].append((0.45 + 0.35 * r, 1.0))
    for i, t in enumerate(texts):
        if is_heading(t):
            pos = heading_position(t)
            if pos is not None:
                cues[i].append((pos, 5.0))
            continue
        for pattern, pos in _PHRASES:
            if re.search(pattern, t, re.IGNORECASE):
                cues[i].append((pos, 0.5))
    weight = np.array([sum(w for _, w in c) for c in cues])
    prior = np.array([sum(p * w for p, w in c) / sum(w for _, w in c) if c else 0.5 for c in cues])
    return prior, weight


def propagate(prior: np.ndarray, weight: np.ndarray, graph: np.ndarray, iterations: int = 60) -> np.ndarray:
    """Positions: each node's prior, pulled towards its neighbours' (harmonic label propagation)."""
    s = prior.copy()
    degree = graph.sum(1)
    for _ in range(iterations):
        s = (weight * prior + graph @ s) / np.maximum(weight + degree, 1e-12)
        s = np.where((weight == 0) & (degree == 0), prior, s)
    return s


def _choose(utility: list[float], temperature: float, rng: random.Random) -> int:
    """The best index at temperature 0; above it, a softmax sample (near-best choices dominate)."""
    best = max(range(len(utility)), key=lambda i: (utility[i], -i))
    if temperature <= 0:
        return best
    weights = [math.exp((u - utility[best]) / (0.1 * temperature)) for u in utility]
    return rng.choices(range(len(utility)), weights=weights)[0]


def chain(positions: np.ndarray, sim: np.ndarray, temperature: float, rng: random.Random,
          window: int = 4, spread: float = 0.15) -> list[int]:
    """Greedy reading order: among the `window` lowest positions left, the one most similar to
    the last placed, penalised by how far ahead of the lowest it is."""
    remaining = sorted(range(len(positions)), key=lambda i: (positions[i], i))
    order: list[int] = []
    while remaining:
        cand = remaining[:window]
        lowest = positions[cand[0]]
        last_sim = sim[order[-1]] if order else np.zeros(len(positions))
        utility = [float(last_sim[j]) - (positions[j] - lowest) / spread for j in cand]
        pick = cand[_choose(utility, temperature, rng)]
        order.append(pick)
        remaining.remove(pick)
    return order


def _place_headings(groups: list[list[int]], headings: list[int], texts: list[str], sim: np.ndarray) -> None:
    """Headings join the group that shares their words; generic ones spread over groups."""
    used: dict[str, set[int]] = {}
    for i in headings:
        affinity = [float(sim[i, g].mean()) if g else 0.0 for g in groups]
        key = texts[i].strip().lower()
        if max(affinity) > 0.05:
            target = int(np.argmax(affinity))
        else:  # "Introduction": at most one per paper, so a group that has none yet, largest first
            free = [g for g in range(len(groups))
                    if g not in used.get(key, set())] or list(range(len(groups)))
            target = max(free, key=lambda g: (len(groups[g]), -g))
        used.setdefault(key, set()).add(target)
        groups[target].append(i)


def order_group(members: list[int], texts: list[str], sim: np.ndarray, temperature: float,
                rng: random.Random) -> list[int]:
    sub = sim[np.ix_(members, members)]
    prior, weight = priors([texts[i] for i in members])
    positions = propagate(prior, weight, knn_graph(sub, 5))
    return [members[j] for j in chain(positions, sub, temperature, rng)]


def solve(paragraphs: list[tuple[int, str]], k: int, temperature: float = 0.0,
          seed: int = 0) -> list[list[int]]:
    """Heuristic partition of (label, text) paragraphs into at most k ordered groups."""
    if not paragraphs:
        return []
    labels = [label for label, _ in paragraphs]
    texts = [text for _, text in paragraphs]
    x = tfidf(texts)
    sim = x @ x.T
    np.fill_diagonal(sim, 0.0)
    heading = [is_heading(t) for t in texts]
    body = [i for i in range(len(texts)) if not heading[i]] or list(range(len(texts)))
    assign = spectral_groups(sim[np.ix_(body, body)], k)
    groups = [[body[j] for j in range(len(body)) if assign[j] == g] for g in range(max(k, 1))]
    _place_headings(groups, [i for i in range(len(texts)) if i not in set(body)], texts, sim)
    rng = random.Random(seed)
    ordered = [order_group(g, texts, sim, temperature, rng) for g in groups if g]
    return [[labels[i] for i in g] for g in ordered]


_LINE_HEAD = re.compile(r'\{\s*"label"\s*:\s*(\d+)\s*,\s*"text"\s*:\s*"')


def parse_paragraphs(text: str) -> list[tuple[int, str]]:
    """(label, text) of each ``{"label", "text"}`` line, first occurrence of a label kept.

    Hostile or cut output is tolerated: lines that are not such objects are skipped, and a
    line cut mid-text (a truncated tool output) keeps the text it has.
    """
    out: dict[int, str] = {}
    for line in text.split("\n"):
        start = line.find("{")
        if start < 0:
            continue
        try:
            obj = json.loads(line[start:])
        except ValueError:
            head = _LINE_HEAD.match(line, start)
            if head and int(head.group(1)) not in out:
                out[int(head.group(1))] = _partial_string(line[head.end():])
            continue
        if isinstance(obj, dict) and type(obj.get("label")) is int and isinstance(obj.get("text"), str):
            out.setdefault(obj["label"], obj["text"])
    return [(label, out[label]) for label in sorted(out) if label >= 1]


def _partial_string(body: str) -> str:
    """The text of a JSON string cut anywhere: shorten until what is left decodes."""
    for end in range(len(body), max(len(body) - 8, -1), -1):
        try:
            return json.loads('"' + body[:end].removesuffix('"}').removesuffix('"') + '"')
        except ValueError:
            continue
    return body


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                          and isinstance(p.get("text"), str))
    if not isinstance(content, str):
        return ""
    try:  # a harness may wrap the tool's output: {"stdout": ..., "exit_code": ...}
        wrapped = json.loads(content)
    except ValueError:
        return content
    if isinstance(wrapped, dict):
        return next((wrapped[k] for k in ("stdout", "output", "content") if isinstance(wrapped.get(k), str)),
                    content)
    return content


def task_facts(prompt: str) -> tuple[int, int | None]:
    """(number of papers k, number of paragraphs M or None) as the prompt states them."""
    many = re.search(r"exactly (\d+) research papers", prompt)
    count = re.search(r"holds the (\d+) shuffled paragraphs", prompt)
    return (int(many.group(1)) if many else 1), (int(count.group(1)) if count else None)


def complete(groups: list[list[int]], k: int, n_labels: int | None) -> list[list[int]]:
    """A valid partition of 1..M: labels beyond M dropped, labels never seen appended to the
    largest group (or split over k groups when nothing was read)."""
    n_labels = n_labels or max((x for g in groups for x in g), default=0)
    groups = [[x for x in g if x <= n_labels] for g in groups]
    groups = [g for g in groups if g]
    seen = {x for g in groups for x in g}
    missing = [x for x in range(1, n_labels + 1) if x not in seen]
    if groups:
        max(groups, key=len).extend(missing)
    elif missing:
        size = math.ceil(len(missing) / max(k, 1))
        groups = [missing[i:i + size] for i in range(0, len(missing), size)]
    return groups


def answer(groups: list[list[int]], k: int) -> str:
    """The reply text: a label as a heuristic baseline, then the boxed partition."""
    value = [x for g in groups for x in g] if k == 1 else groups
    return f"Heuristic baseline ({MODEL_NAME}, lexical overlap, no model): \\boxed{{{json.dumps(value)}}}"


def policy(request: dict) -> dict:
    """The local server's policy: read the file with ``bash``, then answer.

    Temperature as in the OpenAI API: absent means 1. The seed is the request's ``seed``
    (absent means 0: the same request always gets the same answer).
    """
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    prompt = "\n".join(_text(m) for m in messages if m.get("role") == "user")
    k, n_labels = task_facts(prompt)
    tool_results = [_text(m) for m in messages if m.get("role") == "tool"]
    offered = any(isinstance(t, dict) and isinstance(t.get("function"), dict)
                  and t["function"].get("name") == "bash"
                  for t in request.get("tools") or [])
    if not tool_results and offered and request.get("tool_choice") != "none":
        return {"content": None, "tool_calls": [{"id": "call_read_paragraphs", "type": "function",
                                                 "function": {
            "name": "bash", "arguments": json.dumps({"command": READ_COMMAND})}}]}
    temperature = request.get("temperature")
    temperature = 1.0 if temperature is None else float(temperature)
    groups = solve(parse_paragraphs("\n".join(tool_results) or prompt), k, temperature,
                   request.get("seed") or 0)
    return {"content": answer(complete(groups, k, n_labels), k)}
