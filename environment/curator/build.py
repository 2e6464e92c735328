"""The seeded builder: theme specs → dataset rows, byte-identical anywhere for one seed.

Per spec, one ``random.Random`` seeded with the first 8 bytes of
``sha256("curator:<seed>:<spec_id>")`` draws, using only ``random()`` (the one stream Python
guarantees across versions): the intruder count (1, or 1–2 when the spec has two or more),
which intruders, the collection size N uniform in ``8..min(12, members + intruders)``,
which members, then the display order (Fisher–Yates). Items get letter ids A.. in display
order. The split does not depend on the seed: within each tier, specs are ordered by
``sha256(spec_id)`` and the first ``floor(0.2 n + 0.5)`` are ``eval``, the rest ``train``.

A row is ``{"prompt": [system, user], "answer": "D,K", "info": {...}}`` (the seed's
columns); ``python -m environment.curator.build -o FILE`` writes the canonical JSONL whose
sha256 is the taskset's revision.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from environment.curator.themes import SPECS_DIR, TIERS, ThemeSpec, load_specs
from environment.protocol import canonical_json, sha256_tag

MIN_ITEMS, MAX_ITEMS = 8, 12
EVAL_FRACTION = 0.2

SYSTEM_PROMPT = (
    "You are shown a collection of eight to twelve items, each with a letter id, a title and a "
    "short description. Most of the items share one specific principle. One or two items were put "
    "in because they look as if they belong, but they do not fit that principle. Work out the "
    "principle and find the items that do not fit it.\n\n"
    "Reply with exactly these two lines and nothing else:\n"
    "<intruders>the ids of the items that do not fit, comma-separated, for example D, K</intruders>\n"
    "<theme>the principle the other items share, in one sentence</theme>"
)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Rng:
    """Draws from `random.Random.random` only (stable across Python versions)."""

    def __init__(self, seed: int, spec_id: str) -> None:
        digest = hashlib.sha256(f"curator:{seed}:{spec_id}".encode()).digest()
        self._r = random.Random(int.from_bytes(digest[:8], "big"))

    def below(self, n: int) -> int:
        return int(self._r.random() * n)

    def shuffled(self, items: Sequence) -> list:
        out = list(items)
        for i in range(len(out) - 1, 0, -1):
            j = self.below(i + 1)
            out[i], out[j] = out[j], out[i]
        return out


def eval_spec_ids(specs: Sequence[ThemeSpec]) -> frozenset[str]:
    """The held-out specs: 20 % of each tier, chosen by sha256(spec_id)."""
    held: set[str] = set()
    for tier in TIERS:
        ids = sorted((s.spec_id for s in specs if s.difficulty == tier), key=lambda i: sha256_hex(i.encode()))
        held.update(ids[:int(EVAL_FRACTION * len(ids) + 0.5)])
    return frozenset(held)


def user_message(items: Sequence[dict]) -> str:
    lines = [f"{it['id']}. {it['title']}: {it['description']}" for it in items]
    return "The collection:\n\n" + "\n".join(lines)


def build_row(spec: ThemeSpec, seed: int, split: str) -> dict:
    rng = _Rng(seed, spec.spec_id)
    n_intruders = 1 if len(spec.intruders) == 1 else 1 + rng.below(2)
    intruders = rng.shuffled(spec.intruders)[:n_intruders]
    n_items = MIN_ITEMS + rng.below(min(MAX_ITEMS, len(spec.members) + n_intruders) - MIN_ITEMS + 1)
    members = rng.shuffled(spec.members)[:n_items - n_intruders]
    shown = rng.shuffled([(m, False) for m in members] + [(i, True) for i in intruders])
    items = []
    for k, (item, is_intruder) in enumerate(shown):
        row_item = {"id": chr(ord("A") + k), "title": item.title, "description": item.description,
                    "is_intruder": is_intruder}
        if is_intruder:
            row_item["why"] = item.why
        items.append(row_item)
    answer = ",".join(it["id"] for it in items if it["is_intruder"])
    return {
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                   {"role": "user", "content": user_message(items)}],
        "answer": answer,
        "info": {"spec_id": spec.spec_id, "theme": spec.principle, "decoy": spec.decoy,
                 "difficulty": spec.difficulty, "domain": spec.domain, "split": split, "items": items},
    }


def build_rows(specs: Sequence[ThemeSpec], seed: int) -> list[dict]:
    """One row per spec, in spec_id order."""
    held = eval_spec_ids(specs)
    return [build_row(s, seed, "eval" if s.spec_id in held else "train")
            for s in sorted(specs, key=lambda s: s.spec_id)]


def dataset_bytes(rows: Sequence[dict]) -> bytes:
    """The canonical JSONL of the rows (one canonical JSON object a line)."""
    return b"".join(canonical_json(r) + b"\n" for r in rows)


def revision(rows: Sequence[dict]) -> str:
    return sha256_tag(dataset_bytes(rows))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m environment.curator.build",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--specs", type=Path, default=SPECS_DIR, help="folder of theme specs (*.json)")
    parser.add_argument("--seed", type=int, default=0, help="builder seed (default 0)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="JSONL file to write")
    args = parser.parse_args(argv)
    rows = build_rows(load_specs(args.specs), args.seed)
    args.out.write_bytes(dataset_bytes(rows))
    print(f"{len(rows)} rows → {args.out} ({revision(rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
