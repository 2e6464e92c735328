"""The environment seam: everything an environment gives the validation harness.

The harness (``validate/``) knows an environment only through this module. An environment
is one object, an `Environment`, registered by name in the ``validate.environments``
entry-point group of any installed distribution (this repository registers its own in
``pyproject.toml``). It provides:

- ``Config``: a pydantic model of its settings, with a ``schema_version`` field; frozen into
  every contract manifest as ``environment.config``;
- ``load(config, hints)``: a `Taskset`, whose ``revision`` names its content immutably
  (a corpus's sha256, a dataset file's sha256) and whose ``task(idx)`` is deterministic
  given the config, the content and ``hints.secret`` (the contract's task secret);
- ``taskset.score(task, reply, cache_dir)``: reward and metrics, computed on the host;
- ``agents(config)``: the oracle, the negative controls (each saying what failure it tests)
  and the partial-credit probes, as `AgentSpec` programs run inside the sandbox;
- ``findings(task)`` and ``dataset_findings(taskset, tasks)``: checks before any agent runs;
- each task's ``family`` (strata and per-family tables) and public ``meta``;
- optionally ``strata(task)`` and ``pilot_variants(config)`` for the pilot.

What an agent sees
    Its workspace holds ``task.files``; ``/agent/task.json`` holds ``task.prompt``, the public
    ``task.meta`` and an *opaque* id made by the harness (never ``task.id``, never
    ``task.hash``). Only agents declaring ``sees_answer_key`` get ``task.answer_key``. Nothing
    else about the task reaches the sandbox, so nothing in ``prompt``, ``files`` or ``meta``
    may let a program derive the answer without solving the task.

Agents are stdlib-only Python programs started as ``python3 -S /agent/agent.py`` with the
harness's ``agentlib.py`` beside them (``task()``, ``answer_key()``, ``reply(text)``) and
the environment's own ``support`` files. The reply is whatever the agent leaves in
``/workspace/reply.txt``.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


def canonical_json(value: object) -> bytes:
    """The one serialisation that is hashed, harness and environments alike: sorted keys, no
    whitespace, UTF-8, no NaN."""
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def safe_text(text: str) -> str:
    """`text` as UTF-8 can store it: each lone surrogate (what Python makes of a file name's
    bytes that are not UTF-8, or of a JSON ``\\ud800`` escape) written as its backslash escape
    (``\\udcff``), everything else unchanged. Text a task, an agent or a model produces goes
    through it before it reaches a JSON or Parquet writer, which would refuse it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def safe_json(value: object) -> object:
    """A parsed JSON value with every string in it (object keys too) made `safe_text`."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, list):
        return [safe_json(v) for v in value]
    if isinstance(value, dict):
        return {safe_text(k) if isinstance(k, str) else k: safe_json(v) for k, v in value.items()}
    return value


def sha256_tag(data: bytes) -> str:
    """``sha256:<hex>`` of `data`."""
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def config_digest(config: BaseModel) -> str:
    """Eight hex digits naming a config, for task ids that are unique per config."""
    return sha256_tag(canonical_json(config.model_dump(mode="json")))[7:15]

#: Public metadata values: JSON values (text, integers, finite floats, booleans, lists, tables
#: keyed by text), each task's stored whole as canonical JSON text (`meta_value` makes one).
MetaValue = int | float | str | bool | list["MetaValue"] | dict[str, "MetaValue"]


def meta_value(value: object) -> MetaValue:
    """A task's public fact as the JSON value stored (a verdict row's ``meta``) and shown to
    agents; the encoding is defined for every TOML type: text, integers, finite floats,
    booleans, arrays and tables as they are (a float stays a float: ``60.0``); an offset or
    local date-time, a local date or time as its RFC 3339 text (``datetime.isoformat``:
    ``1979-05-27T07:32:00-08:00``, ``1979-05-27``, ``07:32:00``); a non-finite float as TOML
    spells it (``nan``, ``inf``, ``-inf``), which JSON has no number for; a tuple as a list."""
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else "nan" if value != value else "inf" if value > 0 else "-inf"
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [meta_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): meta_value(v) for k, v in value.items()}
    raise TypeError(f"a public fact must be a TOML or JSON value, not {type(value).__name__}")

Role = Literal["oracle", "control", "probe"]


class AgentSpec(BaseModel):
    """One agent program an environment declares. Its role, never its name, says what the
    harness expects of it: the oracle passes, a control is rejected, a probe scores strictly
    between the controls and the oracle."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Unique within the environment.")
    role: Role = Field(description="oracle, control or probe: what the contract expects of this agent.")
    program: Path = Field(description="Absolute path of the agent's program (copied to /agent/agent.py).")
    support: tuple[Path, ...] = Field(
        default=(), description="Absolute paths of further files copied beside the program into /agent.")
    tests: str = Field(min_length=1,
                       description="What this agent checks: for a control, the failure it tests.")
    sees_answer_key: bool = Field(
        default=False, description="Only this agent's sandbox gets /answer_key/answer.json: the oracle, the "
                                   "probes, and known-wrong controls built from the gold (e.g. the "
                                   "decoy as theme).")
    sees_source: bool = Field(
        default=False, description="The environment's whole source tree is mounted read-only at "
                                   "/agent/source (the standing leak control: with the source and the agent "
                                   "view it must still not derive the answer).")
    applies_when: dict[str, int] = Field(
        default_factory=dict, description="Public meta key → least value for the agent to apply to a task "
                                          "(e.g. {'n_papers': 2} for a probe that merges two papers).")
    ceiling: float | None = Field(
        default=None, description="Default reward a control must stay under; None: under the pass threshold.")
    tampers: bool = Field(
        default=False, description="A tampering control: it tries to get the reward without doing the task "
                                   "by changing what the verifier runs (its binaries, start-up hooks, the "
                                   "dynamic linker). Its pass means the task is hackable; the run's claim "
                                   "counts the tasks every tampering control was played on and failed "
                                   "(hack-resistant).")
    baseline: bool = Field(
        default=False, description="A control that changes nothing (nop): when the oracle's and every "
                                   "baseline's verifier ran cleanly, a verifier that fails after another "
                                   "control was broken by that control (its own rejection), "
                                   "never by the task.")
    ceiling_scope: Literal["task", "mean"] = Field(
        default="task", description="task: the control must stay under its ceiling on every task (a pass "
                                    "makes the task invalid); mean: a chance-level control, which hits the "
                                    "answer on some tasks by luck, must keep its mean reward over the run "
                                    "under the ceiling (a hit on one task is a note, never an exclusion).")

    def applies_to(self, meta: Mapping[str, MetaValue]) -> bool:
        return all(isinstance(x := meta.get(k), int | float) and x >= v
                   for k, v in self.applies_when.items())


class Finding(BaseModel):
    """Something seen about a task (or the whole dataset) before any agent runs. A *blocking*
    finding makes the task ``invalid_task_or_verifier`` whatever the agents do; a
    non-blocking one is a note added to the verdict's detail."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    blocking: bool
    detail: str


class Score(NamedTuple):
    """The scorer's result: a reward in [0, 1] and named metrics (the taskset's
    ``metric_names``, each a float); and, when the reward was read from text the float
    misreads (a verifier's ``0.99999999999999999999`` is the float 1.0), that text
    (`exact_text`): the threshold is compared with it, the float is for the columns."""

    reward: float
    metrics: Mapping[str, float]
    exact: str | None = None


def exact_reward(value: float, text: str | None = None) -> Decimal:
    """A reward, pass threshold or ceiling as the decimal number it was written as, which is
    what every comparison between them reads: `text` (a `Score.exact`) when there is one, else
    the float's shortest repr, the number a contract's JSON holds (a threshold of 0.7 is 0.7,
    not the binary float nearest it). Two floats compare this way exactly as they compare
    as floats (the shortest repr is monotonic), so only a reward's exact text changes anything.
    A text that is not a finite decimal (evidence edited by hand) is no such reading: the float
    is compared, and the audit, which re-derives the text, names it."""
    if text is not None:
        try:
            exact = Decimal(text)
        except (InvalidOperation, ValueError, TypeError):
            exact = None
        if exact is not None and exact.is_finite():
            return exact
    return Decimal(repr(float(value)))


def exact_text(value: Decimal) -> str | None:
    """The exact text a `Score` keeps for a reward read as `value`: None when the float nearest
    it reads back as the same number (`exact_reward`), else `value`'s own decimal text."""
    return None if exact_reward(float(value)) == value else str(value)


class EnvError(Exception):
    """Root of every error an environment defines. Environments import nothing of the harness,
    so theirs is a root of its own beside `validate.core.errors.ValidateError`; the harness
    catches the ones it expects by name (`ConfigError`, `ScorerUnavailable`, ...)."""


class ScorerUnavailable(EnvError):
    """A scorer's own dependency failed (a judge endpoint down, timing out, rate-limited,
    answering garbage) after its retries. The harness records an infrastructure error, never
    a reward: a 0 must not be blamed on the task or the agent."""


class ScorerSpec(BaseModel):
    """What the contract freezes about scoring."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    deterministic: bool = Field(default=True, description="Same task and reply always give the same score.")
    smoke_tolerance: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="Largest reward difference the smoke test accepts (0 for a deterministic scorer).")
    pass_threshold: float = Field(default=1.0, description="A reward at or above this is a pass.")
    details: dict[str, str] = Field(
        default_factory=dict,
        description="Further frozen facts (a judge's model id, its prompt's sha256, ...).")
    env_vars: tuple[str, ...] = Field(
        default=(), description="Names (never values) of the environment variables the scorer reads, e.g. a "
                                "judge's API key; a rerun elsewhere (the smoke test) passes them on.")


@runtime_checkable
class Task(Protocol):
    """One task. ``id`` is unique within a taskset *and its config* (two configs never share
    an id); ``hash`` is ``sha256:`` of the task's whole content, gold included."""

    id: str
    idx: int
    hash: str
    prompt: str
    files: Mapping[str, bytes]
    family: str
    meta: Mapping[str, MetaValue]
    requires_network_isolation: bool

    @property
    def answer_key(self) -> bytes: ...


@runtime_checkable
class Taskset(Protocol):
    #: Immutable name of the content tasks are made from (``sha256:<hex>``).
    revision: str
    #: Names of the metrics `score` returns, in a fixed order.
    metric_names: tuple[str, ...]
    #: Number of tasks, or None for an infinite (procedurally generated) taskset.
    size: int | None
    # Optional, read with getattr: ``parse_metric: str``, the one of `metric_names` that is 1.0
    # when the reply parsed in the format the prompt asks for and 0.0 when not (the failure
    # rules tell a malformed answer from a wrong one by it). Optional, read with getattr:
    # ``data_files: tuple[Path, ...]``, the data files the
    # taskset was loaded from, so a fresh install elsewhere (the smoke test) is told where
    # they lie; absent or () when the data ships in the package. Optional, read with getattr:
    # ``source: dict | None``, where a published dataset came from (its immutable revision,
    # e.g. the commit a branch resolved to, and every file's sha256): recorded in the
    # contract and handed back in `LoadHints.source`, so a later load reads that very source.

    def task(self, idx: int) -> Task: ...

    def score(self, task: Task, reply: bytes, cache_dir: Path | None = None) -> Score:
        """Score on the host. Never raises for a bad reply (that scores 0); raises
        `ScorerUnavailable` when a dependency of the scorer failed. ``cache_dir`` is the run's
        own directory for anything the scorer must not recompute (a judge's answers)."""
        ...


@dataclass(frozen=True)
class LoadHints:
    """Where to look for data the config names, and what it must hash to."""

    #: The revision the contract froze (None at freeze time): data is found by it.
    revision: str | None = None
    #: Further files or folders to search for the data (``--data`` on the command line).
    search: tuple[Path, ...] = field(default_factory=tuple)
    #: The contract's task secret (hex; None outside a contract): an environment that draws
    #: tasks at random mixes it into every stream an agent could otherwise replay, so nothing
    #: in the agent's view (its source included) checks a guessed answer. Never shown to an
    #: agent; kept out of repr so no log or traceback prints it.
    secret: str | None = field(default=None, repr=False)
    #: The source record the contract froze (the taskset's ``source``; None at freeze time or
    #: for a dataset without one): an environment reads exactly that source again.
    source: Mapping[str, Any] | None = field(default=None, hash=False)
    #: Where an environment says what it resolved and how a long load progresses (one line
    #: each); None: silent.
    log: Callable[[str], None] | None = field(default=None, repr=False, compare=False)


class ConfigError(EnvError, ValueError):
    """Bad config or data for an environment; the message names the field or file and the fix."""


class Environment:
    """Base class of an environment. Subclasses set ``name`` and ``Config`` and implement
    `load`, `agents` and `findings`; the rest has working defaults."""

    name: ClassVar[str]
    Config: ClassVar[type[BaseModel]]
    #: How the harness plays an attempt at this environment's tasks: the name of a registered
    #: attempt kind (``validate.attempt_kinds``). ``program``: each agent is a program run in a
    #: fresh sandbox, its reply scored on the host by `Taskset.score`.
    attempt_kind: ClassVar[str] = "program"

    def load(self, config: BaseModel, hints: LoadHints = LoadHints()) -> Taskset:
        raise NotImplementedError

    def agents(self, config: BaseModel) -> Sequence[AgentSpec]:
        raise NotImplementedError

    def findings(self, task: Task) -> list[Finding]:
        return []

    def not_applicable(self, agent: AgentSpec, task: Task) -> str | None:
        """Why `agent` cannot test `task`, or None when it can. An agent that cannot test a
        task is not played on it (say, a control whose fixed answer is that task's answer).
        Decided on the host, frozen into the contract per task. By default: the agent's
        ``applies_when`` against the task's public meta."""
        if agent.applies_to(task.meta):
            return None
        return f"applies only when {', '.join(f'{k} ≥ {v}' for k, v in sorted(agent.applies_when.items()))}"

    def dataset_findings(self, taskset: Taskset, tasks: Iterable[Task]) -> list[Finding]:
        """Checks over the selected tasks as a whole (e.g. the modal answer's share)."""
        return []

    def scorer(self, config: BaseModel) -> ScorerSpec:
        return ScorerSpec()

    def families(self, taskset: Taskset) -> list[str] | None:
        """Every family the taskset can produce (the report names those a selection missed);
        by default read off a finite taskset's tasks, unknown (None) for an infinite one."""
        if taskset.size is None:
            return None
        return sorted({taskset.task(i).family for i in range(taskset.size)})

    def strata(self, task: Task) -> str:
        """The pilot's stratum of a task: by default its family."""
        return task.family

    def pilot_variants(self, config: BaseModel) -> list[tuple[str, BaseModel]]:
        """Config variants the pilot plays its sample under (name, config); by default the
        contract's own config only."""
        return [("base", config)]

    def source_dir(self) -> Path:
        """The environment's source tree, for agents declaring ``sees_source``."""
        import inspect

        return Path(inspect.getfile(type(self))).resolve().parent

    def source_files(self) -> list[tuple[str, Path]]:
        """The files an agent declaring ``sees_source`` gets, as (path relative to the source
        tree, file): by default every text file of `source_dir`, no caches. An environment
        whose package *is* its answers (a fixed hand-authored dataset) leaves them out, and
        says so: seeing them is contamination, not a leak of the harness."""
        root = self.source_dir()
        keep = {".py", ".md", ".json", ".toml", ".txt"}
        return sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*")
                      if p.is_file() and p.suffix in keep and "__pycache__" not in p.parts)
