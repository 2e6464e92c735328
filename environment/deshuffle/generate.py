"""Deterministic task generation: (corpus revision, config, idx) → identical bytes anywhere.

Randomness comes from one `random.Random` per task, seeded with the first 8 bytes of
``sha256("deshuffle-papers:<seed>:<idx>")``, and only its ``random()`` method is used
(the one stream Python guarantees across versions); integer draws are
``floor(random() * n)``. No ``hash()``, no set order.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, model_validator

from environment.deshuffle.corpus import Corpus, Paper
from environment.deshuffle.score import METRIC_NAMES, analyze_ordering

ENV_NAME = "deshuffle-papers"
PARAGRAPHS_FILE = "paragraphs.jsonl"


def canonical_json(value: object) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the one serialisation that is hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DeshuffleConfig(BaseModel):
    """How tasks are drawn. Checked against a corpus by `DeshuffleTaskset`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Fewest complete papers in one task (inclusive).
    min_papers: int = Field(default=1, ge=1)
    #: Most complete papers in one task (inclusive).
    max_papers: int = Field(default=1, ge=1)
    #: Task-generation seed; with idx it fixes every random choice.
    seed: int = 0
    #: Restrict papers to one source present in the corpus (None = all sources).
    source: str | None = None
    #: Add each section heading as an orderable unit before its section's first paragraph.
    include_headers: bool = False

    @model_validator(mode="after")
    def _range(self) -> DeshuffleConfig:
        if self.min_papers > self.max_papers:
            raise ValueError(f"min_papers ({self.min_papers}) must be ≤ max_papers ({self.max_papers})")
        return self


class Rng:
    """Draws from `random.Random.random` only (stable across Python versions)."""

    def __init__(self, seed: int, idx: int) -> None:
        digest = hashlib.sha256(f"{ENV_NAME}:{seed}:{idx}".encode()).digest()
        self._r = random.Random(int.from_bytes(digest[:8], "big"))

    def below(self, n: int) -> int:
        return int(self._r.random() * n)

    def shuffle(self, items: list) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]

    def sample_excluding(self, n: int, k: int, excluded: int) -> list[int]:
        """k distinct ints from range(n) other than `excluded` (sparse Fisher–Yates)."""
        swapped: dict[int, int] = {}
        out = []
        m = n - 1  # the pool is range(n) without `excluded`, indexed 0..m-1
        for i in range(k):
            j = i + self.below(m - i)
            vi, vj = swapped.get(i, i), swapped.get(j, j)
            swapped[j] = vi
            out.append(vj if vj < excluded else vj + 1)
        return out


class DeshuffleTask(BaseModel):
    """One task: what the agent sees (`prompt`, `files`) and what only the scorer sees (`gold`)."""

    model_config = ConfigDict(frozen=True)

    id: str
    idx: int
    n_papers: int
    prompt: str
    #: File name → bytes, written into the agent's workspace.
    files: dict[str, bytes]
    #: True partition: per-paper label lists in true order (never in `files` or `prompt`).
    gold: tuple[tuple[int, ...], ...]
    paper_ids: tuple[str, ...]
    requires_network_isolation: bool = True

    @cached_property
    def hash(self) -> str:
        view = {
            "id": self.id,
            "prompt": self.prompt,
            "files": {k: sha256_hex(v) for k, v in self.files.items()},
            "gold": self.gold,
        }
        return f"sha256:{sha256_hex(canonical_json(view))}"

    @property
    def answer_key(self) -> bytes:
        return canonical_json({"id": self.id, "gold": self.gold})

    @property
    def n_labels(self) -> int:
        return sum(len(t) for t in self.gold)


def _units(paper: Paper, include_headers: bool) -> list[str]:
    units: list[str] = []
    current = ""
    for para in paper.paragraphs:
        if include_headers and para.section and para.section != current:
            units.append(para.section)
        current = para.section
        units.append(para.text)
    return units


def _prompt(k: int, m: int) -> str:
    if k == 1:
        fmt = ("Answer with a JSON permutation of all labels in the paper's reading order, "
               "inside \\boxed{}, for example: \\boxed{[3, 1, 4, 2]}")
        what = "one research paper"
    else:
        fmt = ("Answer with a JSON list of per-paper label lists, each in reading order "
               "(the order of the papers does not matter; every label exactly once), inside "
               "\\boxed{}, for example: \\boxed{[[3, 1, 4], [7, 2], [5, 8, 6]]}")
        what = f"exactly {k} research papers"
    return (
        f"The file {PARAGRAPHS_FILE} in your workspace holds the {m} shuffled paragraphs of "
        f"{what}, one JSON object a line: {{\"label\": int, \"text\": str}}. The displayed "
        f"order may already be correct. Reconstruct the original "
        f"{'paper' if k == 1 else 'papers'}. {fmt}"
    )


class DeshuffleTaskset:
    """The infinite, lazily generated deshuffle-papers taskset over one corpus."""

    name = ENV_NAME
    metric_names = METRIC_NAMES

    def __init__(self, config: DeshuffleConfig, corpus: Corpus) -> None:
        if config.source is not None and config.source not in corpus.sources():
            raise ValueError(f"source: {config.source!r} is not in the corpus; "
                             f"sources present: {', '.join(corpus.sources())}")
        self.papers = corpus.select(config.source)
        if config.max_papers > len(self.papers):
            raise ValueError(f"max_papers: {config.max_papers} exceeds the {len(self.papers)} "
                             f"papers of the corpus{'' if config.source is None else ' for source ' + config.source}")
        self.config = config
        self.corpus = corpus
        # Each unit's text JSON-encoded once: a task's lines are then string joins.
        self._units = [[json.dumps(u, ensure_ascii=False) for u in _units(p, config.include_headers)]
                       for p in self.papers]

    def task(self, idx: int) -> DeshuffleTask:
        if idx < 0:
            raise ValueError(f"idx: must be ≥ 0, got {idx}")
        cfg, n = self.config, len(self.papers)
        rng = Rng(cfg.seed, idx)
        k = cfg.min_papers + rng.below(cfg.max_papers - cfg.min_papers + 1)
        anchor = idx % n
        chosen = [anchor, *rng.sample_excluding(n, k - 1, anchor)]
        units = [(p, u) for p, paper in enumerate(chosen) for u in range(len(self._units[paper]))]
        order = list(range(len(units)))
        rng.shuffle(order)
        label_of = [0] * len(units)
        lines = []
        for label, unit in enumerate(order, 1):
            label_of[unit] = label
            p, u = units[unit]
            lines.append(f'{{"label": {label}, "text": {self._units[chosen[p]][u]}}}')
        gold, start = [], 0
        for paper in chosen:
            size = len(self._units[paper])
            gold.append(tuple(label_of[start:start + size]))
            start += size
        return DeshuffleTask(
            id=f"deshuffle:{idx}:{cfg.seed}",
            idx=idx,
            n_papers=k,
            prompt=_prompt(k, len(units)),
            files={PARAGRAPHS_FILE: ("\n".join(lines) + "\n").encode()},
            gold=tuple(gold),
            paper_ids=tuple(self.papers[p].paper_id for p in chosen),
        )

    def tasks(self, start: int, stop: int | None = None) -> Iterator[DeshuffleTask]:
        """Tasks start, start+1, ... up to stop (exclusive), or forever when stop is None."""
        idx = start
        while stop is None or idx < stop:
            yield self.task(idx)
            idx += 1

    def score(self, task: DeshuffleTask, reply: str | bytes):
        reward, metrics = analyze_ordering(reply, task.gold)
        return ScoreResult(reward=reward, metrics=metrics)


class ScoreResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    reward: float
    metrics: dict[str, float]
