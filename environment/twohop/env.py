"""twohop-env behind the environment seam: config, tasks, taskset, findings and agents.

Task identity
    ``id`` is ``twohop-env/<config digest>/th-NNN`` (`environment.protocol.config_digest`),
    so two configs never share an id. ``hash`` is
    ``sha256:`` of the canonical JSON of the whole task, gold included. The taskset's
    ``revision`` is the dataset's (`dataset.Dataset.revision`).

What an agent sees
    ``prompt`` (the question and the exact answer shape), the workspace file
    ``api_description.txt`` (the full fact set and the answer-format rules, the same for
    every task of a config) and ``meta`` = ``{"n_facts": N}``, also the same for every task:
    meta never carries the category, since ``broken`` would give ``unknown`` away. (Meta is
    not empty because an empty struct cannot be a Parquet column.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from environment.protocol import (
    AgentSpec,
    ConfigError,
    Environment,
    Finding,
    LoadHints,
    MetaValue,
    Score,
    ScorerSpec,
    Task,
    Taskset,
    canonical_json,
    config_digest,
    sha256_tag,
)
from environment.twohop.agents_spec import agent_specs, control_may_pass
from environment.twohop.checks import chains_proved, dataset_checks, task_checks
from environment.twohop.dataset import (
    DEFAULT_SEED,
    FACTS_FILE,
    BuildError,
    BuiltTask,
    Dataset,
    build_dataset,
    sha256_hex,
)
from environment.twohop.score import METRIC_NAMES, score_reply
from environment.twohop.solver import Question
from environment.twohop.universe import Universe

ENV_NAME = "twohop-env"


class TwohopConfig(BaseModel):
    """The environment's settings. Deliberately few: prompts, parsing and grading are fixed,
    so there is one correct way to run it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = Field(default=1, description="Version of this config's schema.")
    seed: int = Field(
        default=DEFAULT_SEED, ge=0, lt=2**63,
        description="Universe seed. 0 builds the published dataset; any other value a fresh universe of "
                    "the same shape (a held-out set that no memorised copy of the published one answers).")

    @property
    def digest(self) -> str:
        return config_digest(self)


@dataclass(frozen=True, eq=False)
class TwohopTask:
    """One task: the public view (prompt, files, meta) and the host-side truth."""

    id: str
    idx: int
    prompt: str
    files: Mapping[str, bytes]
    family: str
    meta: Mapping[str, MetaValue]
    rows: tuple[str, ...]
    question: Question
    universe: Universe
    requires_network_isolation: bool = True

    @cached_property
    def hash(self) -> str:
        view = {"id": self.id, "idx": self.idx, "prompt": self.prompt, "family": self.family,
                "files": {k: sha256_hex(v) for k, v in sorted(self.files.items())}, "meta": dict(self.meta),
                "gold": list(self.rows), "question": list(self.question),
                "requires_network_isolation": self.requires_network_isolation}
        return sha256_tag(canonical_json(view))

    @property
    def answer_key(self) -> bytes:
        return canonical_json({"rows": list(self.rows)})


class TwohopTaskset:
    """The 36 tasks of one config's dataset."""

    metric_names = METRIC_NAMES
    parse_metric = "parsed_ok"

    def __init__(self, config: TwohopConfig, dataset: Dataset) -> None:
        self.config = config
        self.dataset = dataset
        self.revision = dataset.revision
        self.size = len(dataset.tasks)
        self._facts = dataset.api_description.encode()

    def task(self, idx: int) -> TwohopTask:
        if not isinstance(idx, int) or not 0 <= idx < self.size:
            raise IndexError(f"idx: {idx!r} is not a task of twohop-env (0..{self.size - 1})")
        built: BuiltTask = self.dataset.tasks[idx]
        return TwohopTask(id=f"{ENV_NAME}/{self.config.digest}/{built.task_id}", idx=idx, prompt=built.prompt,
                          files={FACTS_FILE: self._facts}, family=built.category,
                          meta={"n_facts": len(self.dataset.universe.facts)}, rows=built.rows,
                          question=built.question, universe=self.dataset.universe)

    def score(self, task: TwohopTask, reply: bytes, cache_dir: Path | None = None) -> Score:
        reward, metrics = score_reply(reply, task.rows)
        return Score(reward, metrics)


def _checks(task: TwohopTask):
    return task_checks(task.universe, task.family, task.question, task.rows, task.prompt, task.files)


class TwohopEnvironment(Environment):
    """Multi-hop composition over an invented fact universe; binary exact-match reward.
    No partial-credit probe: the reward has no partial credit to probe."""

    name = ENV_NAME
    Config = TwohopConfig

    @staticmethod
    def _config(config: BaseModel | Mapping | None) -> TwohopConfig:
        if isinstance(config, TwohopConfig):
            return config
        raw = config.model_dump() if isinstance(config, BaseModel) else dict(config or {})
        try:
            return TwohopConfig.model_validate(raw)
        except ValueError as e:
            raise ConfigError(f"twohop-env config: {e}") from None

    def load(self, config: BaseModel, hints: LoadHints = LoadHints()) -> Taskset:
        cfg = self._config(config)
        try:
            dataset = build_dataset(cfg.seed)
        except BuildError as e:
            raise ConfigError(f"seed: {e}") from None
        if hints.revision is not None and hints.revision != dataset.revision:
            raise ConfigError(f"revision: the contract froze {hints.revision}, but this source builds "
                              f"{dataset.revision} for seed {cfg.seed}; install the version the contract was "
                              f"frozen with, or freeze a new contract")
        return TwohopTaskset(cfg, dataset)

    def agents(self, config: BaseModel) -> Sequence[AgentSpec]:
        return agent_specs()

    def findings(self, task: Task) -> list[Finding]:
        return [Finding(kind=c.kind, blocking=True, detail=f"{c.kind}: {c.detail}")
                for c in _checks(task) if not c.passed]

    def dataset_findings(self, taskset: Taskset, tasks: Iterable[Task]) -> list[Finding]:
        """The modal-answer guards over the whole dataset (a property of what a policy trains
        on, whatever subset a phase selects); the selection's meta and wording checks."""
        every = [taskset.task(i) for i in range(taskset.size)]
        selected = list(tasks)
        checks = dataset_checks([(t.family, t.question, t.rows) for t in every], [t.meta for t in selected])
        modal = every[0].universe.modal_hq_city() if every else ""
        hits = [t.id.rsplit("/", 1)[-1] for t in every if t.rows == (modal,)]
        out = [Finding(kind=c.kind, blocking=not c.passed, detail=f"{c.kind}: {c.detail}") for c in checks]
        out.append(Finding(kind="modal_city_control", blocking=False,
                           detail=f"modal_city_control: the city hosting the most organisations, {modal}, is "
                                  f"the answer to {len(hits)} of {len(every)} tasks "
                                  f"({', '.join(hits) or 'none'}); the modal-city control "
                                  "passes exactly those"))
        return out

    def scorer(self, config: BaseModel) -> ScorerSpec:
        return ScorerSpec(deterministic=True, smoke_tolerance=0.0, pass_threshold=1.0,
                          details={"comparison": "rows equal exactly: case-sensitive, ordered, "
                                                 "no normalisation",
                                   "unknown": "the literal lower-case word unknown"})

    def not_applicable(self, agent: AgentSpec, task: TwohopTask) -> str | None:
        """Why a control cannot test this task: what it would reply (its fixed answer, or its
        prediction from the facts) is this task's answer (`agents_spec.control_may_pass`).
        The harness does not play it here."""
        return control_may_pass(agent.name, task.universe, task.question, task.rows) \
            or super().not_applicable(agent, task)

    def multi_hop_report(self, taskset: TwohopTaskset) -> tuple[int, int, int]:
        """(tasks passing every check, tasks, chains proved multi-hop) for ``build --verify``."""
        ok = chains = 0
        for i in range(taskset.size):
            t = taskset.task(i)
            if all(c.passed for c in _checks(t)):
                ok += 1
                chains += 0 if t.family == "broken" else chains_proved(t.universe, t.question)
        return ok, taskset.size, chains
