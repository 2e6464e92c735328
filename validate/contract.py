"""The contract manifest: what is validated, frozen before anything runs, and checked after.

A manifest is written as canonical JSON (sorted keys) with its own ``sha256`` (of the
compact canonical JSON of every other field). Every command that takes a manifest first
calls `verify`, which recomputes what it can (manifest hash, corpus revision, every task
hash, the backend's image digest, architecture and name) and raises `ContractError`
naming the field on any mismatch.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import validate
from environment.deshuffle import Corpus, CorpusError, DeshuffleConfig, DeshuffleTaskset
from environment.deshuffle.hub import HUB_REPO, HUB_REVISION
from validate.agents import REGISTRY, resolve
from validate.errors import ContractError
from validate.sandbox import Limits, Sandbox
from validate.sandbox.base import BackendFacts

SCHEMA_VERSION = 1


def canonical(value: object, *, indent: int | None = None) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=indent,
                      separators=None if indent else (",", ":")).encode()


def sha256_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


class CorpusSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: ``local`` (a snapshot file) or ``hub`` (the pinned Hugging Face revision).
    kind: Literal["local", "hub"]
    #: The file path as given (relative to the working directory), or ``hf:<repo>``.
    location: str
    #: Immutable identifier: ``sha256:<file bytes>`` or ``hf:<repo>@<commit>``.
    revision: str


class EnvironmentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["deshuffle-papers"] = "deshuffle-papers"
    config: DeshuffleConfig
    corpus: CorpusSpec


class Selection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: How the idx list was chosen, in words (e.g. ``contiguous idx range [0, 20)``).
    rule: str
    #: Task indices, sorted, distinct.
    idx: list[int]
    #: The task-generation seed (equal to ``environment.config.seed``).
    seed: int


class TaskEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    idx: int
    hash: str


class Expectations(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The oracle passes when its reward is at least this.
    oracle_min_reward: float = 1.0
    #: Agents to run and, for each control, the ceiling its reward must stay under
    #: (None: it must not pass, i.e. stay under `oracle_min_reward`).
    control_max_reward: dict[str, float | None] = Field(default_factory=dict)

    def agents(self) -> list[str]:
        return ["oracle", *self.control_max_reward]

    def ceiling(self, agent: str) -> float:
        c = self.control_max_reward.get(agent)
        return self.oracle_min_reward if c is None else c


class ExecutionProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["docker", "bwrap", "subprocess"]
    image: str
    image_digest: str
    architecture: str
    backend_version: str
    network: Literal["none"] = "none"
    user: str = "65534:65534"
    privileges: str = "all capabilities dropped, no-new-privileges"
    mounts: list[str] = [
        "/workspace rw (task files; the reply is /workspace/reply.txt)",
        "/agent ro (agent program, agentlib.py, task.json)",
        "/answer_key ro (oracle only: answer.json)",
        "/tmp tmpfs",
    ]
    root_filesystem: str = "read-only"
    limits: Limits = Limits()
    #: Bytes of the reply file read back; a larger reply is recorded as reply_too_large.
    max_reply_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    #: What the sandbox may install at run time.
    dependency_policy: Literal["none"] = "none"
    #: Further tries after an infrastructure fault (never after an agent's own failure).
    infra_retries: int = Field(default=2, ge=0, le=10)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    created_at: datetime
    environment: EnvironmentSpec
    selection: Selection
    tasks: list[TaskEntry]
    task_list_sha256: str
    expectations: Expectations
    execution: ExecutionProfile
    min_task_count: int = Field(ge=0)
    harness_version: str
    git_commit: str
    #: sha256 of the manifest this one was frozen from (None for a root contract).
    parent_sha256: str | None = None
    sha256: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.selection.seed != self.environment.config.seed:
            raise ValueError("selection.seed must equal environment.config.seed")
        if [t.idx for t in self.tasks] != self.selection.idx:
            raise ValueError("tasks: the task list does not follow selection.idx")
        unknown = [a for a in self.expectations.control_max_reward if a not in REGISTRY or a == "oracle"]
        if unknown:
            raise ValueError(f"expectations.control_max_reward: unknown control(s) {unknown}")
        return self

    def content_sha256(self) -> str:
        return sha256_of(canonical(self.model_dump(mode="json", exclude={"sha256"})))

    def sealed(self) -> Manifest:
        return self.model_copy(update={"sha256": self.content_sha256()})

    def to_json(self) -> bytes:
        return canonical(self.model_dump(mode="json"), indent=2) + b"\n"


def task_list_sha256(entries: list[TaskEntry]) -> str:
    return sha256_of(canonical([[e.id, e.hash] for e in entries]))


def git_commit() -> str:
    here = Path(validate.__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    if out.returncode != 0:
        return "unknown (not a git checkout)"
    return out.stdout.strip() + ("-dirty" if dirty else "")


def load_corpus(spec: CorpusSpec | None = None, *, path: str | None = None, hub: bool = False) -> Corpus:
    try:
        if spec is not None:
            hub, path = spec.kind == "hub", spec.location
        return Corpus.from_hub() if hub else Corpus.from_path(path)
    except CorpusError as e:
        raise ContractError(f"environment.corpus: {e}") from None


def build_taskset(env: EnvironmentSpec, corpus: Corpus) -> DeshuffleTaskset:
    try:
        return DeshuffleTaskset(env.config, corpus)
    except ValueError as e:
        raise ContractError(f"environment.config.{e}") from None


def freeze(*, name: str, env: EnvironmentSpec, idx: list[int], rule: str, facts: BackendFacts,
           corpus: Corpus, control_max_reward: dict[str, float | None], oracle_min_reward: float = 1.0,
           limits: Limits | None = None, min_task_count: int = 1, parent_sha256: str | None = None,
           **execution: object) -> Manifest:
    """Build and seal a manifest: generate every selected task and record its hash."""
    taskset = build_taskset(env, corpus)
    idx = sorted(set(idx))
    entries = [TaskEntry(id=t.id, idx=t.idx, hash=t.hash) for t in map(taskset.task, idx)]
    resolve(["oracle", *control_max_reward])
    try:
        return Manifest(
            name=name, created_at=datetime.now(UTC), environment=env,
            selection=Selection(rule=rule, idx=idx, seed=env.config.seed),
            tasks=entries, task_list_sha256=task_list_sha256(entries),
            expectations=Expectations(oracle_min_reward=oracle_min_reward, control_max_reward=control_max_reward),
            execution=ExecutionProfile(backend=facts.backend, image=facts.image, image_digest=facts.image_digest,
                                       architecture=facts.architecture, backend_version=facts.version,
                                       limits=limits or Limits(), **execution),
            min_task_count=min_task_count, harness_version=validate.__version__, git_commit=git_commit(),
            parent_sha256=parent_sha256,
        ).sealed()
    except ValidationError as e:
        err = e.errors()[0]
        raise ContractError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def derive(parent: Manifest, *, name: str, idx: list[int], rule: str, corpus: Corpus,
           config: DeshuffleConfig | None = None) -> Manifest:
    """A child contract of `parent` (same corpus, expectations and execution profile) over
    `idx`, optionally with another environment config; it points at its parent by hash."""
    env = parent.environment if config is None else parent.environment.model_copy(update={"config": config})
    taskset = build_taskset(env, corpus)
    idx = sorted(set(idx))
    entries = [TaskEntry(id=t.id, idx=t.idx, hash=t.hash) for t in map(taskset.task, idx)]
    return parent.model_copy(update={
        "name": name, "created_at": datetime.now(UTC), "environment": env,
        "selection": Selection(rule=rule, idx=idx, seed=env.config.seed), "tasks": entries,
        "task_list_sha256": task_list_sha256(entries), "parent_sha256": parent.sha256,
        "min_task_count": min(parent.min_task_count, len(entries)),
        "harness_version": validate.__version__, "git_commit": git_commit(),
    }).sealed()


def write_manifest(manifest: Manifest, path: Path) -> Path:
    from validate.evidence import atomic_write

    atomic_write(path, manifest.to_json())
    return path


def load_manifest(path: str | Path) -> Manifest:
    p = Path(path)
    try:
        raw = json.loads(p.read_bytes())
    except FileNotFoundError:
        raise ContractError(f"{p}: manifest not found (create one with `validate freeze`)") from None
    except (OSError, ValueError) as e:
        raise ContractError(f"{p}: not a readable JSON manifest ({e})") from None
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise ContractError(f"{p}: field '{'.'.join(map(str, err['loc']))}': {err['msg']}") from None
    if manifest.sha256 != manifest.content_sha256():
        raise ContractError(f"{p}: field 'sha256': the manifest's content does not match its sha256 "
                            f"(edited after freezing?)")
    return manifest


def _mismatch(field: str, expected: object, actual: object) -> ContractError:
    return ContractError(f"{field}: the manifest says {expected!r} but this machine has {actual!r}")


def verify(manifest: Manifest, sandbox: Sandbox) -> DeshuffleTaskset:
    """Recompute the contract on this machine (each task regenerated, checked, dropped);
    return the taskset."""
    corpus = load_corpus(manifest.environment.corpus)
    if corpus.revision != manifest.environment.corpus.revision:
        raise _mismatch("environment.corpus.revision", manifest.environment.corpus.revision, corpus.revision)
    taskset = build_taskset(manifest.environment, corpus)
    for i, entry in enumerate(manifest.tasks):
        task = taskset.task(entry.idx)
        if (task.id, task.hash) != (entry.id, entry.hash):
            raise _mismatch(f"tasks[{i}].hash ({entry.id})", entry.hash, task.hash)
    if task_list_sha256(manifest.tasks) != manifest.task_list_sha256:
        raise ContractError("task_list_sha256: does not match the task list")
    ex = manifest.execution
    if sandbox.backend != ex.backend:
        raise _mismatch("execution.backend", ex.backend, sandbox.backend)
    facts = sandbox.facts()
    for field in ("image", "image_digest", "architecture"):
        if getattr(facts, field) != getattr(ex, field):
            raise _mismatch(f"execution.{field}", getattr(ex, field), getattr(facts, field))
    return taskset


def hub_spec() -> CorpusSpec:
    return CorpusSpec(kind="hub", location=f"hf:{HUB_REPO}", revision=f"hf:{HUB_REPO}@{HUB_REVISION}")
