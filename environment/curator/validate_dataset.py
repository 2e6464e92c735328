"""The dataset validator: checks over built rows, as `Finding`s and as a printed table.

Per row (`row_findings`): structure (8–12 items, ids A.. in order, 1–2 intruders, each with a
``why``, the answer equal to the sorted intruder ids, [system, user] prompt listing every
item) and theme-word leaks (a word of the principle, stemmed, in some member's text but in
no intruder's text: a lexical route to the answer).

Over the dataset (`dataset_report`): near-duplicate themes (principle word-set Jaccard ≥
0.6) and item titles shared between rows; intruder positions by thirds of the collection
with a chi-square test against what shuffling gives; three shortcut baselines, each told
the true intruder count, mean Jaccard against gold: random (exact expectation), TF-IDF
odd-one-out and description-length outlier (`curatorlib`, the same code the sandboxed
controls run). A shortcut whose mean beats random's expectation is blocking; so is a
position imbalance with p < 0.01.

``python -m environment.curator.validate_dataset [--seed N] [--data FILE.jsonl]`` prints the
seed's tables and exits 1 when anything blocks.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from environment.curator.agents.curatorlib import (
    item_text,
    length_outliers,
    tfidf_outliers,
    tokens,
)
from environment.curator.build import MAX_ITEMS, MIN_ITEMS, build_rows
from environment.curator.score import jaccard
from environment.curator.themes import SPECS_DIR, TIERS, load_specs
from environment.protocol import Finding

NEAR_DUPLICATE_JACCARD = 0.6
#: chi-square with 2 degrees of freedom: p = exp(-x/2), so p < 0.01 ⇔ x > 2 ln 100.
CHI2_P01_DF2 = 2 * math.log(100)


def _intruders(row: dict) -> list[str]:
    return [it["id"] for it in row["info"]["items"] if it["is_intruder"]]


def structure_problems(row: dict) -> list[str]:
    info, items = row["info"], row["info"]["items"]
    out = []
    if not MIN_ITEMS <= len(items) <= MAX_ITEMS:
        out.append(f"{len(items)} items, outside {MIN_ITEMS}–{MAX_ITEMS}")
    ids = [it["id"] for it in items]
    if ids != [chr(ord("A") + k) for k in range(len(items))]:
        out.append(f"ids {''.join(ids)} are not A.. in display order")
    gold = _intruders(row)
    if not 1 <= len(gold) <= 2:
        out.append(f"{len(gold)} intruders, not 1 or 2")
    if row["answer"] != ",".join(sorted(gold)):
        out.append(f"answer {row['answer']!r} is not the sorted intruder ids {','.join(sorted(gold))!r}")
    if any(it["is_intruder"] and not it.get("why") for it in items):
        out.append("an intruder has no 'why'")
    prompt = row["prompt"]
    if [m.get("role") for m in prompt] != ["system", "user"]:
        out.append("prompt is not [system, user]")
    elif any(f"{it['id']}. {it['title']}: {it['description']}" not in prompt[1]["content"] for it in items):
        out.append("the user message does not list every item")
    if info["difficulty"] not in TIERS or info["split"] not in ("train", "eval"):
        out.append(f"difficulty {info['difficulty']!r} / split {info['split']!r} not recognised")
    return out


def theme_leaks(row: dict) -> list[str]:
    """Principle words (stemmed) found in a member's text and in no intruder's text."""
    items = row["info"]["items"]
    member_words = set().union(*(tokens(item_text(it)) for it in items if not it["is_intruder"]))
    intruder_words = set().union(*(tokens(item_text(it)) for it in items if it["is_intruder"]))
    return sorted(w for w in set(tokens(row["info"]["theme"])) if w in member_words
                  and w not in intruder_words)


def row_findings(row: dict) -> list[Finding]:
    out = [Finding(kind="malformed_row", blocking=True, detail=f"{row['info']['spec_id']}: {p}")
           for p in structure_problems(row)]
    leaks = theme_leaks(row)
    if leaks:
        out.append(Finding(kind="theme_word_leak", blocking=True,
                           detail=f"{row['info']['spec_id']}: theme word(s) {', '.join(leaks)} appear in "
                                  "member text but in no intruder text"))
    return out


def random_expectation(n: int, k: int) -> tuple[float, float]:
    """(mean Jaccard, exact-hit probability) of k ids drawn uniformly from n against k gold."""
    total = math.comb(n, k)
    mean = sum(math.comb(k, m) * math.comb(n - k, k - m) / total * (m / (2 * k - m)) for m in range(k + 1))
    return mean, 1 / total


@dataclass(frozen=True)
class DatasetReport:
    rows: int
    tiers: dict[str, dict[str, int]]
    domains: dict[str, int]
    leaks: int
    near_duplicates: list[str]
    position_shares: tuple[float, float, float]
    position_chi2: float
    baselines: dict[str, float]
    exact_hits: dict[str, float]

    @property
    def position_p(self) -> float:
        return math.exp(-self.position_chi2 / 2)


def _near_duplicates(rows: Sequence[dict]) -> list[str]:
    out = []
    words = [(r["info"]["spec_id"], set(tokens(r["info"]["theme"]))) for r in rows]
    for i, (a, wa) in enumerate(words):
        for b, wb in words[i + 1:]:
            score = len(wa & wb) / max(len(wa | wb), 1)
            if score >= NEAR_DUPLICATE_JACCARD:
                out.append(f"themes {a} and {b} overlap (word Jaccard {score:.2f})")
    owner: dict[str, str] = {}
    for r in rows:
        for it in r["info"]["items"]:
            key = it["title"].casefold()
            if key in owner and owner[key] != r["info"]["spec_id"]:
                out.append(f"item {it['title']!r} appears in {owner[key]} and {r['info']['spec_id']}")
            owner.setdefault(key, r["info"]["spec_id"])
    return out


def _positions(rows: Sequence[dict]) -> tuple[tuple[float, float, float], float]:
    observed, expected = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    for r in rows:
        items = r["info"]["items"]
        n = len(items)
        for k, it in enumerate(items):
            if it["is_intruder"]:
                observed[3 * k // n] += 1
                for slot in range(n):  # a shuffled intruder is equally likely in any slot
                    expected[3 * slot // n] += 1 / n
    total = sum(observed) or 1.0
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)
    return (observed[0] / total, observed[1] / total, observed[2] / total), chi2


def _baselines(rows: Sequence[dict]) -> tuple[dict[str, float], dict[str, float]]:
    sums: dict[str, float] = defaultdict(float)
    hits: dict[str, float] = defaultdict(float)
    for r in rows:
        items = [{k: it[k] for k in ("id", "title", "description")} for it in r["info"]["items"]]
        gold = frozenset(_intruders(r))
        mean, p_exact = random_expectation(len(items), len(gold))
        sums["random"] += mean
        hits["random"] += p_exact
        for name, guess in (("tfidf", tfidf_outliers(items, len(gold))),
                            ("length", length_outliers(items, len(gold)))):
            score = jaccard(frozenset(guess), gold)
            sums[name] += score
            hits[name] += score == 1.0
    n = max(len(rows), 1)
    names = ("random", "tfidf", "length")
    return {k: sums[k] / n for k in names}, {k: hits[k] / n for k in names}


def dataset_report(rows: Sequence[dict]) -> DatasetReport:
    tiers: dict[str, dict[str, int]] = {}
    for tier in TIERS:
        sel = [r for r in rows if r["info"]["difficulty"] == tier]
        tiers[tier] = {"rows": len(sel),
                       "train": sum(r["info"]["split"] == "train" for r in sel),
                       "eval": sum(r["info"]["split"] == "eval" for r in sel),
                       "one": sum(len(_intruders(r)) == 1 for r in sel),
                       "two": sum(len(_intruders(r)) == 2 for r in sel)}
    shares, chi2 = _positions(rows)
    baselines, exact = _baselines(rows)
    return DatasetReport(rows=len(rows), tiers=tiers,
                         domains=dict(sorted(Counter(r["info"]["domain"] for r in rows).items())),
                         leaks=sum(bool(theme_leaks(r)) for r in rows),
                         near_duplicates=_near_duplicates(rows), position_shares=shares, position_chi2=chi2,
                         baselines=baselines, exact_hits=exact)


def dataset_findings(rows: Sequence[dict]) -> list[Finding]:
    rep = dataset_report(rows)
    out = [Finding(kind="near_duplicate_theme", blocking=True, detail=d) for d in rep.near_duplicates]
    if rep.position_chi2 > CHI2_P01_DF2:
        out.append(Finding(kind="intruder_position_imbalance", blocking=True,
                           detail=f"intruder positions by thirds {_shares(rep)} (chi-square "
                                  f"{rep.position_chi2:.2f}, p {rep.position_p:.4f} < 0.01)"))
    for name in ("tfidf", "length"):
        if rep.baselines[name] > rep.baselines["random"]:
            out.append(Finding(kind="shortcut_beats_random", blocking=True,
                               detail=f"the {name} shortcut scores mean Jaccard {rep.baselines[name]:.3f}, "
                                      f"above random told the count ({rep.baselines['random']:.3f})"))
    return out


def _shares(rep: DatasetReport) -> str:
    return " / ".join(f"{s:.2f}" for s in rep.position_shares)


def table(rep: DatasetReport) -> str:
    lines = ["| Tier | Rows | train / eval | 1 intruder / 2 intruders |", "|---|---|---|---|"]
    for tier, c in rep.tiers.items():
        lines.append(f"| {tier} | {c['rows']} | {c['train']} / {c['eval']} | {c['one']} / {c['two']} |")
    lines += ["", "Domains: " + ", ".join(f"{d} {n}" for d, n in rep.domains.items()), "",
              "| Check | Result |", "|---|---|",
              f"| Theme-word leaks | {rep.leaks} |",
              f"| Near-duplicate themes or shared items | {len(rep.near_duplicates)} |",
              (f"| Intruder position (first / middle / last third) | {_shares(rep)} "
               f"(chi-square {rep.position_chi2:.2f}, p {rep.position_p:.2f}) |"),
              (f"| Random guess, told the true intruder count | {rep.baselines['random']:.3f} mean Jaccard "
               f"({rep.exact_hits['random']:.3f} exact) |"),
              (f"| TF-IDF odd-one-out solver (told the count) | {rep.baselines['tfidf']:.3f} "
               f"({rep.exact_hits['tfidf']:.3f} exact) |"),
              (f"| Description-length outlier solver (told the count) | {rep.baselines['length']:.3f} "
               f"({rep.exact_hits['length']:.3f} exact) |")]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m environment.curator.validate_dataset",
                                     description="Validate the curator dataset and print its tables.")
    parser.add_argument("--specs", type=Path, default=SPECS_DIR, help="folder of theme specs (*.json)")
    parser.add_argument("--seed", type=int, default=0, help="builder seed (default 0)")
    parser.add_argument("--data", type=Path,
                        help="validate this built JSONL instead of building from --specs")
    args = parser.parse_args(argv)
    if args.data is not None:
        rows = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines()
                if line.strip()]
    else:
        rows = build_rows(load_specs(args.specs), args.seed)
    print(table(dataset_report(rows)))
    blocking = [f for r in rows for f in row_findings(r)] + dataset_findings(rows)
    for f in blocking:
        print(f"BLOCKING {f.kind}: {f.detail}")
    return 1 if blocking else 0


if __name__ == "__main__":
    sys.exit(main())
