"""Config, tasks and the taskset: the built dataset seen through the harness's protocol.

A task is one built row. ``id`` is ``curator/<config digest>/<spec_id>`` (`config_digest`:
eight hex digits of the canonical config's sha256, so two configs never share an id); ``family`` is the tier;
public ``meta`` is only ``n_items`` (the prompt lists them);
``prompt`` is the row's system message, a blank line and its user message; ``files`` holds
``collection.json`` (``[{"id", "title", "description"}]``, nothing hidden); ``answer_key`` is
canonical JSON of the gold (intruder ids, principle, decoy, every item with its flag and
``why``); ``hash`` is ``sha256:`` of the canonical ``{id, prompt, files: sha256s,
answer_key: sha256}``. The taskset's ``revision`` is the sha256 of the canonical built
dataset (all rows, before any filter): the specs and the seed, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from environment.curator.agents.curatorlib import COLLECTION_FILE
from environment.curator.build import build_rows, canonical_json, revision, sha256_hex
from environment.curator.judge import Judge, JudgeConfig
from environment.curator.parse import parse_reply
from environment.curator.score import METRIC_NAMES, score_parsed
from environment.curator.themes import TIERS, ThemeSpec, Tier
from environment.protocol import ConfigError, Score, config_digest, sha256_tag

ENV_NAME = "curator"


class CuratorConfig(BaseModel):
    """Which rows, built with which seed, scored with or without a judge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = Field(default=1, description="Version of this config's schema.")
    split: Literal["all", "train", "eval"] = Field(
        default="all", description="train, eval (theme-disjoint, 20 % of each tier) or all.")
    difficulty: tuple[Tier, ...] = Field(default=TIERS,
                                         description="Tiers to keep (obvious, moderate, subtle).")
    seed: int = Field(default=0, ge=0, description="Builder seed: which items and intruders, in which order.")
    judge: JudgeConfig | None = Field(
        default=None, description="The theme judge; None freezes the intruders-only mode (reward = Jaccard).")

    @field_validator("difficulty")
    @classmethod
    def _tiers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("difficulty: name at least one tier of obvious, moderate, subtle")
        return tuple(t for t in TIERS if t in value)  # canonical order, no repeats



class CuratorTask(BaseModel):
    """One task (a built row); see the module docstring for each field."""

    model_config = ConfigDict(frozen=True)

    id: str
    idx: int
    prompt: str
    files: dict[str, bytes]
    family: str
    meta: dict[str, int]
    row: dict
    requires_network_isolation: bool = True

    @property
    def spec_id(self) -> str:
        return self.row["info"]["spec_id"]

    @property
    def gold(self) -> frozenset[str]:
        return frozenset(it["id"] for it in self.row["info"]["items"] if it["is_intruder"])

    @cached_property
    def answer_key(self) -> bytes:
        info = self.row["info"]
        return canonical_json({"intruders": sorted(self.gold), "answer": self.row["answer"],
                               "principle": info["theme"], "decoy": info["decoy"], "items": info["items"]})

    @cached_property
    def hash(self) -> str:
        view = {"id": self.id, "prompt": self.prompt,
                "files": {k: sha256_hex(v) for k, v in sorted(self.files.items())},
                "answer_key": sha256_hex(self.answer_key)}
        return sha256_tag(canonical_json(view))


def _task(row: dict, idx: int, digest: str) -> CuratorTask:
    items = row["info"]["items"]
    public = [{"id": it["id"], "title": it["title"], "description": it["description"]} for it in items]
    system, user = (m["content"] for m in row["prompt"])
    return CuratorTask(id=f"{ENV_NAME}/{digest}/{row['info']['spec_id']}", idx=idx,
                       prompt=f"{system}\n\n{user}", files={COLLECTION_FILE: canonical_json(public) + b"\n"},
                       family=row["info"]["difficulty"], meta={"n_items": len(items)}, row=row)


class CuratorTaskset:
    """The finite curator taskset for one config."""

    name = ENV_NAME
    metric_names = METRIC_NAMES
    parse_metric = "format_ok"

    def __init__(self, config: CuratorConfig, specs: Sequence[ThemeSpec],
                 expected_revision: str | None = None) -> None:
        rows = build_rows(specs, config.seed)
        self.revision = revision(rows)
        if expected_revision is not None and expected_revision != self.revision:
            raise ConfigError(f"revision: the specs and seed {config.seed} build {self.revision}, but the "
                              f"contract froze {expected_revision}; restore the specs the "
                              "contract was frozen with")
        self.config = config
        self.rows = rows
        keep = [r for r in rows if r["info"]["difficulty"] in config.difficulty
                and config.split in ("all", r["info"]["split"])]
        digest = config_digest(config)
        self._tasks = [_task(r, i, digest) for i, r in enumerate(keep)]
        self.size = len(self._tasks)

    def task(self, idx: int) -> CuratorTask:
        if not 0 <= idx < self.size:
            raise IndexError(f"idx: {idx} is outside 0..{self.size - 1}")
        return self._tasks[idx]

    def score(self, task: CuratorTask, reply: bytes | None, cache_dir: Path | None = None) -> Score:
        """Never raises for a bad reply; raises `ScorerUnavailable` if the declared judge fails."""
        parsed = parse_reply(reply, [it["id"] for it in task.row["info"]["items"]])
        grade = None
        if self.config.judge is not None:
            judge = Judge(self.config.judge, cache_dir)
            info = task.row["info"]

            def grade(theme: str) -> str:
                return judge.grade(info["theme"], info["decoy"], theme)

        return score_parsed(parsed.intruders, parsed.theme, parsed.format_ok, task.gold, grade)
