"""The contract manifest: what is validated, frozen before anything runs, and checked after.

A manifest is written as canonical JSON (sorted keys) with its own ``sha256`` (of the
compact canonical JSON of every other field). Every command that takes a manifest first
calls `verify`, which recomputes what it can — the environment's config, content revision
and scorer, every agent's role and program, every task's id and hash, the backend, its
version, the image digest and package list, the architecture — and raises `ContractError`
naming the field on any mismatch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

import validate
from environment.protocol import (
    AgentSpec,
    ConfigError,
    Environment,
    LoadHints,
    Role,
    ScorerSpec,
    Taskset,
    canonical_json,
    sha256_tag,
)
from validate.contract.sealed import SealedDocument, canonical_items, first_error
from validate.contract.tasklist import TaskEntry, TaskList
from validate.core import environments
from validate.core.errors import ContractError
from validate.core.records import CONTROL, ORACLE, Role as RecordedRole
from validate.evidence.journal import atomic_write
from validate.evidence.patches import PatchInfo
from validate.evidence.verdicts import Rule
from validate.sandbox import BackendName, Limits, Sandbox
from validate.sandbox.base import BackendFacts, Isolation
from validate.sandbox.image import package_differences
from validate.taskdir.images.frozen import TaskImages

SCHEMA_VERSION = 2
#: How every agent starts, on every backend. `-S` skips `site`: the agents are stdlib programs,
#: and site's path set-up cost ~3 ms of CPU per attempt, ~9 % of a bwrap pool's wall time.
AGENT_COMMAND = ("python3", "-S", "/agent/agent.py")


class EnvironmentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The environment's registered name.")
    config: dict[str, Any] = Field(description="The environment's config, as its Config model dumps it.")
    revision: str = Field(description="Immutable name of the content the tasks are made from.")
    scorer: ScorerSpec = Field(description="What is frozen about scoring.")
    source: dict[str, Any] | None = Field(default=None, description=(
        "Where a published dataset came from, as its environment reports it (e.g. the Hub repository, the "
        "revision asked for, the commit it resolved to, every file's sha256); handed back at every load, so "
        "the same source is read again. Absent for data without one."))

    @model_serializer(mode="wrap")
    def _omit_no_source(self, handler: SerializerFunctionWrapHandler) -> dict:
        # Written only when recorded: every contract sealed before the field keeps its bytes.
        data = handler(self)
        if data.get("source") is None:
            data.pop("source", None)
        return data


class AgentEntry(BaseModel):
    """One agent the contract names, as its environment declared it at freeze."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    ceiling: float | None = Field(default=None, description="A control's reward must stay under this; None: "
                                                            "under the pass threshold.")
    ceiling_scope: Literal["task", "mean"] = Field(
        default="task", description="task: on every task; mean: the control's mean over the run (a "
                                    "chance-level control).")
    sees_answer_key: bool = False
    sees_source: bool = False
    program_sha256: str = Field(description="sha256 over the agent's program and support files "
                                            "(names and bytes).")
    tampers: bool = Field(default=False,
                          description="A tampering control (its pass makes the task hackable).")
    baseline: bool = Field(default=False, description="A control that changes nothing (nop): with the "
                                                      "oracle, the witness that the verifier runs cleanly.")

    @model_serializer(mode="wrap")
    def _omit_unset_flags(self, handler: SerializerFunctionWrapHandler) -> dict:
        # Written only when set: every contract sealed before the fields keeps its bytes and hash.
        data = handler(self)
        for flag in ("tampers", "baseline"):
            if not data.get(flag):
                data.pop(flag, None)
        return data


def program_sha256(spec: AgentSpec) -> str:
    try:
        files = {p.name: sha256_tag(p.read_bytes()) for p in (spec.program, *spec.support)}
    except OSError as e:
        raise ContractError(f"agents.{spec.name}: cannot read its program ({e})") from None
    return sha256_tag(canonical_json(files))


class Expectations(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pass_threshold: float = Field(ge=0.0, le=1.0, allow_inf_nan=False,
                                  description="The oracle passes at or above this reward.")
    agents: dict[str, AgentEntry] = Field(description="The oracle, the controls a task must "
                                                      "reject, the probes.")
    exception_rule: Literal["strict", "retry"] = Field(
        default="strict", description="strict: any infrastructure exception in the run excludes the task; "
                                      "retry: only each agent's final attempt counts.")
    oracle_repeats: int = Field(
        default=1, ge=1, le=100, strict=True,
        description="The oracle plays each task this many times (samples 0..N-1); every repeat must pass, a "
                    "mix is a flaky verifier (invalid_task_or_verifier).")

    @model_serializer(mode="wrap")
    def _omit_one_repeat(self, handler: SerializerFunctionWrapHandler) -> dict:
        # Written only when more than one: every contract sealed before the field (one repeat,
        # as they all played) keeps its bytes and its content hash.
        data = handler(self)
        if data.get("oracle_repeats") == 1:
            data.pop("oracle_repeats", None)
        return data

    def rules(self) -> dict[str, Rule]:
        return {n: Rule(a.role, self.pass_threshold if a.ceiling is None else a.ceiling, a.ceiling_scope,
                        a.tampers, a.baseline)
                for n, a in self.agents.items()}

    def named(self, *roles: RecordedRole) -> list[str]:
        return [n for n, a in self.agents.items() if a.role in roles]

    def testing(self, skip: dict[str, str]) -> list[str]:
        """The controls that can test a task with this `skip` (those not frozen out of it)."""
        return [n for n in self.named(CONTROL) if n not in skip]

    def required(self, skip: dict[str, str]) -> list[str]:
        """The oracle and the controls a task must have, all but those that do not apply to it."""
        return [n for n, a in self.agents.items() if a.role in (ORACLE, CONTROL) and n not in skip]


class TrialProfile(BaseModel):
    """How a task-directory dataset's trials verify (``execution.trial``; absent in a contract
    frozen before the field, whose trials verified in the agent's own container: ``shared``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    verifier_mode: Literal["trusted", "shared"] = Field(description=(
        "trusted: a fresh container of the task's pristine image with only the agent's changes under the "
        "task's work paths (hack-resistant against the tampering controls); shared: the agent's own "
        "container, Harbor's (verified in the agent's environment: not hack-resistant)."))
    work_paths_rule: str | None = Field(default=None, description=(
        "The rule naming what a trusted verifier gets of the agent's changes "
        "(validate.taskdir.trial.workpaths.RULE)."))
    tool_sha256: str = Field(description=(
        "sha256 of the source of the harness's program every trial container's PID 1 and verifier run "
        "(validate/taskdir/trial/native/dvtool.c)."))


def verifier_mode_of(execution: ExecutionProfile) -> str:
    """The contract's verifier mode: its trial profile's, or ``shared`` (a contract frozen before it)."""
    return "shared" if execution.trial is None else execution.trial.verifier_mode


class ExecutionProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: BackendName
    image: str
    image_digest: str = Field(description="Content digest of the root filesystem (the same on every "
                                          "backend).")
    tree_digest: str | None = Field(default=None, description="Digest of the unpacked tree bwrap runs.")
    packages: dict[str, str] = Field(default_factory=dict,
                                     description="The image's Debian packages, name → version.")
    python: str = Field(default="", description="The image's Python version.")
    seccomp: str = Field(default="none", description="The syscall filter agents run under (bwrap: the "
                                                     "compiled BPF's sha256; docker: its version's "
                                                     "default profile).")
    cgroup: Literal["v1", "v2", "none"] | None = Field(
        default=None, description="The cgroup version the limits are set through (bwrap: the host's "
                                  "hierarchy; docker: the daemon's CgroupVersion; none: subprocess); None: "
                                  "not recorded (a contract frozen before the field).")
    architecture: str
    backend_version: str
    network: Literal["none"] = "none"
    user: str = "65534:65534"
    privileges: str = "all capabilities dropped, no-new-privileges"
    agent_command: list[str] = Field(default=list(AGENT_COMMAND), description="How every agent starts.")
    mounts: list[str] = [
        "/workspace rw (task files; the reply is /workspace/reply.txt)",
        "/agent ro (agent program, agentlib.py, support files, task.json)",
        "/answer_key ro (only agents that see the answer key: answer.json)",
        "/agent/source ro (only agents that see the environment's source)",
        "/tmp rw (on the attempt's own tmpfs, counted in its storage)",
    ]
    root_filesystem: str = "read-only"
    limits: Limits = Limits()
    max_reply_bytes: int = Field(default=8 * 1024 * 1024, ge=1, le=1 << 30,
                                 description="Bytes of the reply read back; more is reply_too_large.")
    max_reply_text_bytes: int = Field(default=64 * 1024, ge=0, le=1 << 24,
                                      description="Bytes of each reply kept in attempts.parquet "
                                                  "(reply_text).")
    dependency_policy: Literal["none"] = "none"
    infra_retries: int = Field(default=2, ge=0, le=10,
                               description="Further tries after an infrastructure fault (never after "
                                           "the agent's own).")
    isolation: Isolation | None = Field(default=None, description=(
        "The profile's runtime, rootlessness and how each limit is enforced, for profiles other than "
        "rootful runc (validate.sandbox.base.Isolation); absent for docker with runc and bwrap."))
    task_images: TaskImages | None = Field(default=None, description=(
        "A task-directory dataset's per-task images: the base-image map, the build policy and each task's "
        "image id or build refusal (validate.taskdir.images.frozen); absent for every other dataset."))

    trial: TrialProfile | None = Field(default=None, description=(
        "A task-directory dataset's trials: where the verifier runs, the rule for what reaches it, the "
        "harness's in-container program (validate.taskdir.trial); absent for every other dataset."))

    @model_serializer(mode="wrap")
    def _omit_unrecorded(self, handler: SerializerFunctionWrapHandler) -> dict:
        # A field added after contracts were sealed is written only when recorded, so every
        # contract sealed before it keeps its bytes and its content hash.
        data = handler(self)
        for field in ("isolation", "task_images", "trial"):
            if data.get(field) is None:
                data.pop(field, None)
        return data


class Selection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: str = Field(description="How the idx list was chosen, in words.")
    idx: list[int] = Field(description="Task indices, sorted, distinct.")


class Manifest(SealedDocument):
    model_config = ConfigDict(extra="forbid", frozen=True)
    document: ClassVar[str] = "manifest"
    short: ClassVar[str] = "the manifest's"
    make_with: ClassVar[str] = "create one with `validate freeze`"

    schema_version: Literal[2] = SCHEMA_VERSION
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    created_at: datetime
    environment: EnvironmentSpec
    selection: Selection
    tasks: TaskList = Field(description="One entry per task of the selection, in its order (held as columns: "
                                          "validate.contract.tasklist).")
    task_list_sha256: str
    expectations: Expectations
    execution: ExecutionProfile
    min_task_count: int = Field(ge=0)
    harness_version: str
    git_commit: str
    patch: PatchInfo | None = Field(default=None,
                                    description="The uncommitted change the freeze ran with, if any.")
    config_file: str | None = Field(default=None, description="The TOML file the config was read from: its "
                                                              "name and sha256 (the config itself is "
                                                              "environment.config).")
    #: Salt of the opaque task ids agents see (sha256 of salt and task id): agents never see
    #: the manifest, so they cannot map an opaque id back to a task. The task secret handed
    #: to the environment's `load` is derived from it (`task_secret`).
    salt: str = Field(pattern=r"^[0-9a-f]{32}$")
    parent_sha256: str | None = None
    sha256: str = ""

    @classmethod
    def check_raw(cls, raw: Any, where: str) -> None:
        # An eval contract is the other sealed document users hold: name it, not its first field
        # that fails a dataset manifest's schema.
        if isinstance(raw, dict) and raw.get("kind") == "eval":
            raise ContractError(f"{where}: is an eval contract (field 'kind' is 'eval'), not a dataset "
                                f"manifest: run it with `validate eval run --contract {where}`; the dataset "
                                "commands take a manifest made by `validate freeze`")

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        # From the list's columns: a 10,000-task contract is checked without an entry model per task.
        idx = self.selection.idx
        if len(self.tasks) != len(idx) or any(a != b for a, b in zip(self.tasks.idx(), idx, strict=True)):
            raise ValueError("tasks: the task list does not follow selection.idx")
        if any(a >= b for a, b in pairwise(idx)):
            raise ValueError("selection.idx: must be sorted and distinct")
        if len(set(self.tasks.ids())) != len(self.tasks):
            raise ValueError("tasks: task ids repeat")
        if len(self.expectations.named(ORACLE)) != 1:
            raise ValueError("expectations.agents: exactly one oracle")
        if not self.expectations.named(CONTROL):
            raise ValueError("expectations.agents: no negative control; a contract names at least one "
                             "(freeze it again with --controls)")
        if task_list_sha256(self.tasks) != self.task_list_sha256:
            raise ValueError("task_list_sha256: does not match the task list")
        return self

    def opaque_id(self, task_id: str) -> str:
        return sha256_tag(f"{self.salt}\n{task_id}".encode())[7:23]

    def hints(self, search: Sequence[Path] = ()) -> LoadHints:
        """How to load this contract's taskset: its revision and its task secret."""
        return LoadHints(revision=self.environment.revision, search=tuple(search),
                         secret=task_secret(self.salt), source=self.environment.source)


def new_salt() -> str:
    """A fresh contract salt (`Manifest.salt`)."""
    return secrets.token_hex(16)


def task_secret(salt: str) -> str:
    """The secret an environment mixes into its tasks' random streams, derived from the salt
    (which every child contract inherits) under its own tag: the input starts with a non-hex
    byte, so it never equals an opaque id's ``salt + "\n" + id``, and neither value can be
    read back from the other or from the opaque ids an agent sees."""
    return sha256_tag(f"task-secret\n{salt}".encode())[7:]


def task_list_sha256(entries: Sequence[TaskEntry]) -> str:
    """The hash of the canonical JSON of ``[[id, hash], ...]`` of `entries`, streamed into the
    hash a pair at a time (a `TaskList`'s from its columns)."""
    pairs = zip(entries.ids(), entries.hashes(),
                strict=True) if isinstance(entries, TaskList) else ((e.id, e.hash) for e in entries)
    h = hashlib.sha256()
    for chunk in canonical_items([i, x] for i, x in pairs):
        h.update(chunk)
    return "sha256:" + h.hexdigest()


# --- building ----------------------------------------------------------------------------

def env_config(env: Environment, raw: dict[str, Any]) -> BaseModel:
    try:
        return env.Config.model_validate(raw)
    except ValidationError as e:
        raise ContractError(first_error(e, "environment.config")) from None


def load_taskset(env: Environment, config: BaseModel, hints: LoadHints) -> Taskset:
    try:
        return env.load(config, hints)
    except ConfigError as e:
        raise ContractError(f"environment.config.{e}") from None


def entries(env: Environment, config: BaseModel, taskset: Taskset, idx: Sequence[int],
            agents: Sequence[str]) -> list[TaskEntry]:
    """The contract's task list: each task's id, hash, and the agents that cannot test it."""
    specs = [a for a in env.agents(config) if a.name in agents]
    out = []
    for i in idx:
        try:
            task = taskset.task(i)
        except (ValueError, IndexError) as e:
            raise ContractError(f"selection.idx: task {i}: {e}") from None
        skip = skips(env, specs, task)
        out.append(TaskEntry(id=task.id, idx=task.idx, hash=task.hash, skip=skip))
    return out


def skips(env: Environment, specs: Sequence, task) -> dict[str, str]:
    """Agent name → why it cannot test `task`, for each of `specs` the environment excuses."""
    return {a.name: why for a in specs if (why := env.not_applicable(a, task)) is not None}


def agent_entries(env: Environment, config: BaseModel, controls: Sequence[str] | None,
                  ceilings: dict[str, float]) -> dict[str, AgentEntry]:
    """The oracle, the chosen controls (None: all) and every probe, with their ceilings."""
    specs = {a.name: a for a in env.agents(config)}
    known = [n for n, a in specs.items() if a.role == CONTROL]
    chosen = known if controls is None else list(controls)
    bad = [c for c in [*chosen, *ceilings] if c not in known]
    if bad:
        raise ContractError(f"expectations.agents: {', '.join(bad)} is not a control of {env.name}; "
                            f"its controls: {', '.join(known)}")
    if not chosen:  # the protocol's pass is an oracle pass AND a control rejection on every task
        raise ContractError("--controls: a contract must name at least one negative control (a task no "
                            f"control rejects is never compatible); name one of {env.name}'s controls "
                            f"({', '.join(known) or 'it declares none'}) or omit --controls for all of them")
    out = {}
    for name, a in specs.items():
        if a.role == CONTROL and name not in chosen:
            continue
        out[name] = AgentEntry(role=a.role, ceiling=ceilings.get(name, a.ceiling),
                               ceiling_scope=a.ceiling_scope, sees_answer_key=a.sees_answer_key,
                               sees_source=a.sees_source, program_sha256=program_sha256(a), tampers=a.tampers,
                               baseline=a.baseline)
    return out


def check_limits(limits: Limits) -> Limits:
    """Limits this machine can honour: finite, and no more CPUs or memory than it has."""
    import math
    import os

    for name, value in limits.model_dump().items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ContractError(f"--{name.replace('_', '-')}: must be a finite number, got {value}")
    cores = len(os.sched_getaffinity(0))
    if limits.cpus > cores:
        raise ContractError(f"--cpus: this machine has {cores} usable cores; got {limits.cpus}")
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    if limits.memory_mb > memory_mb:
        raise ContractError(f"--memory-mb: this machine has {memory_mb} MiB; got {limits.memory_mb}")
    if limits.storage_mb >= limits.memory_mb:
        raise ContractError("--storage-mb: the attempt's storage is memory (a tmpfs) and counts against "
                            f"--memory-mb ({limits.memory_mb}); keep it below, got {limits.storage_mb}")
    if limits.timeout_s > 86400:
        raise ContractError(f"--timeout-s: at most one day (86400 s); got {limits.timeout_s}")
    return limits


def profile(facts: BackendFacts, **execution: Any) -> ExecutionProfile:
    try:
        return ExecutionProfile(backend=facts.backend, image=facts.image, image_digest=facts.image_digest,
                                tree_digest=facts.tree_digest,
                                packages=facts.packages, python=facts.python, seccomp=facts.seccomp,
                                cgroup=facts.cgroup, isolation=facts.isolation,
                                architecture=facts.architecture, backend_version=facts.version, **execution)
    except ValidationError as e:
        raise ContractError(first_error(e, "execution")) from None


def freeze(*, name: str, env_name: str, config: BaseModel, hints: LoadHints, idx: Sequence[int], rule: str,
           facts: BackendFacts, controls: Sequence[str] | None = None,
           ceilings: dict[str, float] | None = None, pass_threshold: float | None = None,
           exception_rule: str = "strict", min_task_count: int | None = None, git_commit: str = "",
           patch: PatchInfo | None = None, config_file: str | None = None, oracle_repeats: int = 1,
           loaded: tuple[str, Taskset] | None = None, **execution: Any) -> Manifest:
    """Build and seal a root manifest: generate every selected task and record its hash.
    `loaded`: (salt, the taskset loaded with that salt's `task_secret`) when the caller read
    the tasks already; else a salt is drawn and the taskset loaded here."""
    env = environments.get(env_name)
    if loaded is None:
        salt = new_salt()
        taskset = load_taskset(env, config, dataclasses.replace(hints, secret=task_secret(salt)))
    else:
        salt, taskset = loaded
    scorer = env.scorer(config)
    idx = sorted(set(idx))
    agents = agent_entries(env, config, controls, ceilings or {})
    tasks = entries(env, config, taskset, idx, list(agents))
    try:
        return Manifest(
            name=name, created_at=datetime.now(UTC),
            environment=EnvironmentSpec(name=env.name, config=config.model_dump(mode="json"),
                                        revision=taskset.revision, scorer=scorer,
                                        source=getattr(taskset, "source", None)),
            selection=Selection(rule=rule, idx=idx), tasks=tasks, task_list_sha256=task_list_sha256(tasks),
            expectations=Expectations(pass_threshold=scorer.pass_threshold if pass_threshold is None
                                      else pass_threshold, agents=agents,
                                      exception_rule=exception_rule, oracle_repeats=oracle_repeats),
            execution=profile(facts, **execution),
            min_task_count=len(tasks) if min_task_count is None else min_task_count,
            harness_version=validate.__version__, git_commit=git_commit, patch=patch, config_file=config_file,
            salt=salt,
        ).sealed()
    except ValidationError as e:
        raise ContractError(first_error(e, "")) from None


def derive(parent: Manifest, env: Environment, taskset: Taskset, *, name: str, idx: Sequence[int], rule: str,
           config: BaseModel | None = None, git_commit: str | None = None,
           patch: PatchInfo | None = None) -> Manifest:
    """A child contract of `parent` (same expectations, execution profile and salt) over `idx`,
    with `taskset` (the parent's, or one for another config); it points at its parent by hash."""
    env_spec = parent.environment
    if config is not None:
        env_spec = env_spec.model_copy(update={"config": config.model_dump(mode="json")})
    idx = sorted(set(idx))
    # a copy's plain list too
    own = parent.tasks if isinstance(parent.tasks, TaskList) else TaskList(parent.tasks)
    at = [own.position(i) for i in idx]
    if config is None and None not in at:
        # The parent's own entries of those tasks (what it was verified against), not the tasks
        # regenerated again, taken from its columns: a 10,000-task pool's frozen set costs the
        # driver no 10,000 generations and no entry model per task.
        tasks = own.take(at)
    else:
        tasks = TaskList(entries(env, env_config(env, env_spec.config), taskset, idx,
                                 list(parent.expectations.agents)))
    return parent.model_copy(update={
        "name": name, "created_at": datetime.now(UTC), "environment": env_spec,
        "selection": Selection(rule=rule, idx=idx), "tasks": tasks,
        "task_list_sha256": task_list_sha256(tasks), "parent_sha256": parent.sha256,
        "min_task_count": min(parent.min_task_count, len(tasks)), "harness_version": validate.__version__,
        "git_commit": parent.git_commit if git_commit is None else git_commit,
        "patch": parent.patch if git_commit is None else patch,
    }).sealed()


def reprofile(like: Manifest, *, name: str, facts: BackendFacts, git_commit: str = "",
              patch: PatchInfo | None = None, **execution: Any) -> Manifest:
    """The contract `like` on another execution profile: the same environment, selection, tasks,
    expectations, minimum count, salt and parent (so the same tasks, judged the same way), with
    a new execution profile from this machine's backend `facts` — what
    `validate.report.profiles` compares; its verifier mode `like`'s unless `execution` gives one.
    The caller checks first that the tasks load here as frozen."""
    if like.execution.trial is not None:  # the same verifier mode, unless the caller gives one
        execution = {"trial": like.execution.trial, **execution}
    return like.model_copy(update={
        "name": name, "created_at": datetime.now(UTC), "execution": profile(facts, **execution),
        "harness_version": validate.__version__, "git_commit": git_commit, "patch": patch,
    }).sealed()


# --- reading and checking ----------------------------------------------------------------

def write_manifest(manifest: Manifest, path: Path) -> Path:
    atomic_write(path, manifest.to_json())
    return path


def parse_manifest(data: bytes, where: str) -> Manifest:
    return Manifest.parse(data, where)


def load_manifest(path: str | Path) -> Manifest:
    return Manifest.load(path)


def _mismatch(field: str, expected: object, actual: object) -> ContractError:
    return ContractError(f"{field}: the manifest says {expected!r} but this machine has {actual!r}")


def check_environment(manifest: Manifest, hints: LoadHints) -> tuple[Environment, BaseModel, Taskset]:
    """The manifest's environment, config and taskset, each checked against the contract."""
    spec = manifest.environment
    env = environments.get(spec.name)
    config = env_config(env, spec.config)
    taskset = load_taskset(env, config, manifest.hints(hints.search))
    if taskset.revision != spec.revision:
        raise _mismatch("environment.revision", spec.revision, taskset.revision)
    source = getattr(taskset, "source", None)
    if source != spec.source:
        field = next((f"environment.source.{k}" for k in sorted({*(spec.source or {}), *(source or {})})
                      if (spec.source or {}).get(k) != (source or {}).get(k)), "environment.source")
        raise _mismatch(field, (spec.source or {}).get(field.rsplit(".", 1)[-1]),
                        (source or {}).get(field.rsplit(".", 1)[-1]))
    if env.scorer(config) != spec.scorer:
        raise _mismatch("environment.scorer", spec.scorer.model_dump(), env.scorer(config).model_dump())
    declared = {a.name: a for a in env.agents(config)}
    for name, entry in manifest.expectations.agents.items():
        spec_ = declared.get(name)
        if spec_ is None:
            raise ContractError(f"expectations.agents.{name}: {spec.name} no longer declares this agent")
        if spec_.role != entry.role:
            raise _mismatch(f"expectations.agents.{name}.role", entry.role, spec_.role)
        if program_sha256(spec_) != entry.program_sha256:
            raise ContractError(f"expectations.agents.{name}.program_sha256: the agent's program changed "
                                "since the contract was frozen; freeze a new contract")
    return env, config, taskset


def check_tasks(manifest: Manifest, env: Environment, config: BaseModel, taskset: Taskset) -> None:
    check = TaskCheck(manifest, env, config)
    for i, entry in enumerate(manifest.tasks):
        check.entry(i, entry, taskset.task(entry.idx))


class TaskCheck:
    """One task of the contract regenerated here against its entry: the same id and hash, and
    the same agents excused. `verify` checks every task up front; a worker rebuilt on a
    cluster node (`validate.run.runner.worker_from_recipe`) checks each task it is handed, before
    it plays it (`__call__`), so a node of a 10,000-task pool regenerates only its own share."""

    def __init__(self, manifest: Manifest, env: Environment, config: BaseModel) -> None:
        self.env = env
        self.specs = [a for a in env.agents(config) if a.name in manifest.expectations.agents]
        self.manifest = manifest
        # A contract made by copying with a plain list of entries (not parsed) is held as one too.
        self._tasks = manifest.tasks if isinstance(manifest.tasks, TaskList) else TaskList(manifest.tasks)

    def entry(self, i: int, entry: TaskEntry, task) -> None:
        if (task.id, task.hash) != (entry.id, entry.hash):
            raise _mismatch(f"tasks[{i}].hash ({entry.id})", entry.hash, task.hash)
        skip = skips(self.env, self.specs, task)
        if skip != entry.skip:
            raise _mismatch(f"tasks[{i}].skip ({entry.id})", entry.skip, skip)

    def __call__(self, idx: int, task) -> None:
        """Check `task`, made here as task `idx`, against the contract's entry of that idx (one
        the contract lacks is refused, and so is a task that says it is another)."""
        i = self._tasks.position(idx)
        if i is None:
            raise ContractError(f"tasks: the contract has no task of idx {idx}")
        if task.idx != idx:
            raise _mismatch(f"tasks[{i}].idx ({self._tasks[i].id})", idx, task.idx)
        self.entry(i, self._tasks[i], task)


def check_execution(manifest: Manifest, sandbox: Sandbox) -> None:
    ex = manifest.execution
    if sandbox.backend != ex.backend:
        raise _mismatch("execution.backend", ex.backend, sandbox.backend)
    facts = sandbox.facts()
    if ex.packages and facts.packages != ex.packages:
        diff = package_differences(ex.packages, facts.packages)
        raise ContractError("execution.packages: the image differs from the contract's: "
                            f"{'; '.join(diff[:10])}{' …' if len(diff) > 10 else ''}; to run the contract's "
                            "own image, import it: `validate image import "
                            f"sha256-{ex.image_digest.removeprefix('sha256:')}.tar` (see "
                            "`validate image export`)")
    checks = [("image", facts.image), ("image_digest", facts.image_digest),
              ("architecture", facts.architecture), ("backend_version", facts.version),
              ("tree_digest", facts.tree_digest), ("python", facts.python), ("seccomp", facts.seccomp)]
    if ex.cgroup is not None:
        checks.append(("cgroup", facts.cgroup))
    checks.append(("isolation", facts.isolation))
    for field, actual in checks:
        if getattr(ex, field) != actual:
            raise _mismatch(f"execution.{field}", getattr(ex, field), actual)


def verify(manifest: Manifest, sandbox: Sandbox,
           hints: LoadHints = LoadHints()) -> tuple[Environment, Taskset]:
    """Recompute the contract on this machine; return the environment and its taskset."""
    env, config, taskset = check_environment(manifest, hints)
    check_tasks(manifest, env, config, taskset)
    check_execution(manifest, sandbox)
    return env, taskset
