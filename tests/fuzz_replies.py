"""Reply fuzzing shared by tests/test_fuzz.py (CI budget) and bench/fuzz_bench.py (≥ 100,000).

`generate(rng, gold)` returns a reply and whether it is a valid partition, decided here
independently of the parser: replies are built from a known-valid partition and then
either kept valid (re-grouped, re-ordered, boxed twice with the valid one last, padded
with text) or broken by one known-invalidating mutation.
"""

from __future__ import annotations

import json
import random

VALID_MUTATIONS = ("as_is", "regroup", "flatten", "reverse_groups", "pad_text", "earlier_bad_box", "spaces")
INVALID_MUTATIONS = ("drop", "duplicate", "unknown", "zero", "float", "string", "bool", "null", "empty_group",
                     "deep", "unbalanced", "no_box", "not_json", "garbage_bytes", "huge_int", "object",
                     "empty_list")


def random_gold(rng: random.Random, max_papers: int = 4, max_units: int = 12) -> list[list[int]]:
    """A random true partition: 1..max_papers papers of 1..max_units labels, labels shuffled."""
    sizes = [rng.randint(1, max_units) for _ in range(rng.randint(1, max_papers))]
    labels = list(range(1, sum(sizes) + 1))
    rng.shuffle(labels)
    return split_by_sizes(labels, sizes)


def split_by_sizes(labels: list[int], sizes: list[int]) -> list[list[int]]:
    """Consecutive runs of `labels` of the given sizes: the papers of a gold partition."""
    out, i = [], 0
    for s in sizes:
        out.append(labels[i:i + s])
        i += s
    return out


def _groups(rng: random.Random, gold: list[list[int]]) -> list[list[int]]:
    flat = [x for g in gold for x in g]
    rng.shuffle(flat)
    k = rng.randint(1, len(flat))
    cuts = sorted(rng.sample(range(1, len(flat)), k - 1)) if k > 1 else []
    return [flat[a:b] for a, b in zip([0, *cuts], [*cuts, len(flat)], strict=True)]


def generate(rng: random.Random) -> tuple[list[list[int]], str | bytes, bool]:
    gold = random_gold(rng)
    groups = _groups(rng, gold) if rng.random() < 0.5 else [list(g) for g in gold]
    valid = rng.random() < 0.5
    mutation = rng.choice(VALID_MUTATIONS if valid else INVALID_MUTATIONS)
    body: object = groups
    text_before, text_after = "", ""
    if mutation == "regroup":
        body = _groups(rng, gold)
    elif mutation == "flatten":
        body = [x for g in groups for x in g]
    elif mutation == "reverse_groups":
        body = groups[::-1]
    elif mutation == "pad_text":
        text_before, text_after = "Reasoning {with} braces }{ and text.\n", "\nDone."
    elif mutation == "earlier_bad_box":
        text_before = "\\boxed{[[1, 1]]} on second thought "
    labels = [x for g in groups for x in g]
    if mutation == "drop":
        gone = rng.choice(labels)
        body = [kept for g in groups if (kept := [x for x in g if x != gone])]
    elif mutation == "duplicate":
        body = [*groups[:-1], [*groups[-1], rng.choice(labels)]]
    elif mutation == "unknown":
        body = [*groups[:-1], [*groups[-1], len(labels) + rng.randint(1, 5)]]
    elif mutation == "zero":
        body = [*groups[:-1], [*groups[-1], 0]]
    elif mutation in ("float", "string", "bool", "null"):
        bad = {"float": float(labels[0]), "string": str(labels[0]), "bool": True, "null": None}[mutation]
        body = [[bad if x == labels[0] else x for x in g] for g in groups]
    elif mutation == "empty_group":
        body = [*groups, []]
    elif mutation == "deep":
        body = [[g] for g in groups]
    elif mutation == "object":
        body = {"groups": groups}
    elif mutation == "empty_list":
        body = []
    if mutation == "huge_int":
        content = json.dumps(groups)[:-2] + ", " + "9" * rng.randint(20, 6000) + "]]"
    elif mutation == "not_json":
        content = json.dumps(groups).replace(",", ";", 1) if len(labels) > 1 else "[[one]]"
    else:
        content = json.dumps(body, separators=(",", ":") if mutation != "spaces" else (" , ", " : "))
    reply = f"{text_before}\\boxed{{{content}}}{text_after}"
    if mutation == "unbalanced":
        reply = reply[:-1]
    elif mutation == "no_box":
        reply = reply.replace("\\boxed", "\\fbox")
    elif mutation == "garbage_bytes":
        return gold, reply.encode() + bytes([0xff, 0xfe, rng.randrange(256)]), False
    return gold, reply, valid


def check(rng: random.Random, n: int) -> dict[str, int]:
    """Fuzz n replies; raise AssertionError on the first violation; return counts."""
    from environment.deshuffle import analyze_ordering

    counts = {"valid": 0, "invalid": 0}
    for _ in range(n):
        gold, reply, valid = generate(rng)
        reward, metrics = analyze_ordering(reply, gold)
        assert (metrics["parsed_ok"] == 1.0) == valid, (gold, reply[:300], valid)
        assert 0.0 <= reward <= 1.0 and all(0.0 <= v <= 1.0 + 1e-12
                                            for v in metrics.values()), (gold, reply[:300])
        counts["valid" if valid else "invalid"] += 1
    return counts
