"""Deterministic task generation: (corpus revision, config, secret, idx) → identical bytes anywhere.

Two random streams per task, each a `random.Random` of which only ``random()`` is used (the
one stream Python guarantees across versions; integer draws are ``floor(random() * n)``):

- the *selection* stream, seeded with ``sha256("deshuffle-papers:<seed>:<idx>")``, draws the
  paper count and the co-papers. It is not secret: what it decides, the papers in the
  task, the agent reads anyway;
- the *shuffle* stream, seeded with sha256 of the contract's task *secret*
  (`environment.protocol.LoadHints.secret`, derived from the manifest's salt, never in an
  agent's view), the seed, idx and every chosen unit's text *in true order*.

Why the secret. Without it the shuffle is a public function of the answer: anyone with this
source replays a *guessed* order and compares the result with the displayed order, so a
guess can be checked. From the heuristic baseline's answer, a search of the orders within
two moves of it found the gold of one task in 60 of the local corpus (idx 29, 14 units:
a few thousand replays, under a second here). Without the secret (256 bits derived from the
manifest's 128-bit salt) the replay cannot be computed, so no guess can be checked: the
standing `source-peek` control (``agents/replaylib.py``) runs exactly that search, and
tests/test_deshuffle_secret.py shows it finds the gold when handed the secret and nothing
without it. The true-order text stays in the key, so even a leaked secret only checks
guesses, never yields the order. ``secret=""`` (no contract: unit tests, benchmarks) gives
the replayable shuffle; every contract passes its own.

No ``hash()``, no set order.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from environment.deshuffle.corpus import Corpus, Paper
from environment.deshuffle.score import METRIC_NAMES, analyze_ordering
from environment.protocol import Score, canonical_json, config_digest, sha256_tag

ENV_NAME = "deshuffle-papers"
PARAGRAPHS_FILE = "paragraphs.jsonl"
#: Where the local snapshot lies relative to the project's root (read where it lies).
DEFAULT_CORPUS = "../shared/corpus/papers.jsonl.gz"
#: Units a paper may have and still count as short in the pilot's strata.
SHORT_PAPER_UNITS = 40


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DeshuffleConfig(BaseModel):
    """How tasks are drawn. Checked against a corpus by `DeshuffleTaskset`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = Field(default=1, description="Version of this config's schema.")
    corpus: str = Field(default=DEFAULT_CORPUS, min_length=1,
                        description="The paper corpus: a local snapshot (.jsonl, .jsonl.gz, .parquet; found "
                                    "by its sha256 revision, this path first) or 'hub' for the pinned "
                                    "Hugging Face revision (needs the network).")
    min_papers: int = Field(default=1, ge=1, le=1000,
                            description="Fewest complete papers in one task (inclusive).")
    max_papers: int = Field(default=1, ge=1, le=1000,
                            description="Most complete papers in one task (inclusive).")
    seed: int = Field(default=0, ge=0, lt=2**63, description="Task-generation seed; with idx it fixes every "
                                                                "random choice.")
    source: str | None = Field(default=None, description="Only papers of this source (e.g. arxiv, biorxiv, "
                                                         "plos); None: every source.")
    include_headers: bool = Field(default=False,
                                  description="Section headings are orderable units of their own.")

    @model_validator(mode="after")
    def _range(self) -> DeshuffleConfig:
        if self.min_papers > self.max_papers:
            raise ValueError(f"min_papers ({self.min_papers}) must be ≤ max_papers ({self.max_papers})")
        return self


class Rng:
    """Draws from `random.Random.random` only (stable across Python versions), seeded with the
    first 8 bytes of sha256 of `key`."""

    def __init__(self, key: bytes) -> None:
        self._r = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))

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
    """One task: what the agent sees (`prompt`, `files`, `meta`) and what only the scorer sees
    (`gold`)."""

    model_config = ConfigDict(frozen=True)

    #: ``deshuffle-papers/<config digest>/<idx>``: unique per config, so two pilot variants of
    #: one idx never share an id.
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

    @property
    def family(self) -> str:
        """The anchor paper's source (plos, biorxiv, arxiv, medrxiv)."""
        return self.paper_ids[0].split(":")[0]

    @property
    def meta(self) -> dict[str, int]:
        """Public facts, shown to agents: the paper count (the prompt states it) and the units."""
        return {"n_papers": self.n_papers, "n_units": self.n_labels}

    @cached_property
    def hash(self) -> str:
        view = {
            "id": self.id,
            "prompt": self.prompt,
            "files": {k: sha256_hex(v) for k, v in self.files.items()},
            "gold": self.gold,
        }
        return sha256_tag(canonical_json(view))

    @property
    def answer_key(self) -> bytes:
        return canonical_json({"gold": self.gold})

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
    parse_metric = "parsed_ok"
    #: Procedurally generated: as many tasks as one asks for.
    size = None

    def __init__(self, config: DeshuffleConfig, corpus: Corpus, secret: str = "") -> None:
        if config.source is not None and config.source not in corpus.sources():
            raise ValueError(f"source: {config.source!r} is not in the corpus; "
                             f"sources present: {', '.join(corpus.sources())}")
        self.papers = corpus.select(config.source)
        if config.max_papers > len(self.papers):
            raise ValueError(f"max_papers: {config.max_papers} exceeds the {len(self.papers)} "
                             "papers of the "
                             f"corpus{'' if config.source is None else ' for source ' + config.source}")
        self.config = config
        self.corpus = corpus
        # Never in a task's files, prompt or meta; see the module docstring.
        self._secret = secret
        self.revision = corpus.revision
        self._digest = config_digest(config)
        located = Path(corpus.location)
        self.data_files: tuple[Path, ...] = (located,) if located.is_file() else ()
        # Each unit's text JSON-encoded once: a task's lines are then string joins.
        self._units = [[json.dumps(u, ensure_ascii=False) for u in _units(p, config.include_headers)]
                       for p in self.papers]

    def task(self, idx: int) -> DeshuffleTask:
        if idx < 0:
            raise ValueError(f"idx: must be ≥ 0, got {idx}")
        cfg, n = self.config, len(self.papers)
        select = Rng(f"{ENV_NAME}:{cfg.seed}:{idx}".encode())
        k = cfg.min_papers + select.below(cfg.max_papers - cfg.min_papers + 1)
        anchor = idx % n
        chosen = [anchor, *select.sample_excluding(n, k - 1, anchor)]
        units = [(p, u) for p, paper in enumerate(chosen) for u in range(len(self._units[paper]))]
        order = list(range(len(units)))
        Rng(self._shuffle_key(idx, chosen)).shuffle(order)
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
            id=f"{ENV_NAME}/{self._digest}/{idx}",
            idx=idx,
            n_papers=k,
            prompt=_prompt(k, len(units)),
            files={PARAGRAPHS_FILE: ("\n".join(lines) + "\n").encode()},
            gold=tuple(gold),
            paper_ids=tuple(self.papers[p].paper_id for p in chosen),
        )

    def _shuffle_key(self, idx: int, chosen: list[int]) -> bytes:
        """The shuffle stream's key: secret, seed, idx, then each unit's JSON text in true order."""
        key = hashlib.sha256(f"{ENV_NAME}:shuffle:{self._secret}:{self.config.seed}:{idx}".encode())
        for paper in chosen:
            for text in self._units[paper]:
                key.update(text.encode())
                key.update(b"\n")
        return key.digest()

    def tasks(self, start: int, stop: int | None = None) -> Iterator[DeshuffleTask]:
        """Tasks start, start+1, ... up to stop (exclusive), or forever when stop is None."""
        idx = start
        while stop is None or idx < stop:
            yield self.task(idx)
            idx += 1

    def score(self, task: DeshuffleTask, reply: str | bytes, cache_dir=None) -> Score:
        reward, metrics = analyze_ordering(reply, task.gold)
        return Score(reward, metrics)
