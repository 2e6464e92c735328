"""What a phase plays with: the run's context, one play's work, and the progress it reports.

`RunContext` is the live side of a run on this machine — the contract, its taskset, the
sandbox backend, the run directory, the executor that carries attempts out and the progress
callbacks. `Play` is one phase's work: these agents on these tasks of this contract, each
attempt made by one attempt kind (`validate.kinds`). An attempt itself is described by
plain data (`validate.run.executors.AttemptSpec`); nothing here is shipped to an executor.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

from environment.protocol import Environment, LoadHints, Task, Taskset
from validate.contract.manifest import Manifest
from validate.core.errors import ValidateError
from validate.core.paths import RunPaths
from validate.core.records import ORACLE, Attempt
from validate.evidence.patches import CodeState
from validate.run.executors import Executor, make_executor
from validate.sandbox import Limits, Sandbox

R = TypeVar("R")


class Interrupted(ValidateError):
    """The run was stopped (Ctrl-C); what finished is recorded, `--resume` continues."""


def _nothing(*_) -> None:
    return None


@dataclass(frozen=True)
class Progress:
    """What a long phase reports as it goes: `plan(n)` before n more attempts are handed out,
    `attempt(row)` as each is recorded (the CLI's progress bar; no-ops by default)."""

    plan: Callable[[int], None] = _nothing
    attempt: Callable[[object], None] = _nothing


@dataclass
class RunContext:
    env: Environment
    manifest: Manifest
    taskset: Taskset
    sandbox: Sandbox
    paths: RunPaths
    run_id: str
    code: CodeState
    #: Where the environment's data was looked for (``--data``); smoke and pilot variants reuse it.
    hints: LoadHints = field(default_factory=LoadHints)
    #: Makes each attempt's empty directory (and removes it after), given its name, its limits and
    #: the agent's gid; by default its own capped tmpfs (`validate.sandbox.storage`).
    storage: Callable[[str, Limits, int], AbstractContextManager[Path]] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    #: Seconds to wait between infrastructure retries: (multiplier, max) of an exponential backoff.
    backoff_s: tuple[float, float] = (1.0, 10.0)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    #: Carries the attempts out (``--executor``, ``--concurrency``): threads of this process by default.
    executor: Executor = field(default_factory=make_executor)
    progress: Progress = field(default_factory=Progress)
    #: Gets an image this machine lacks, by id, from the run's driver, or raises a
    #: `SandboxError` naming why (set by an executor whose workers run on other machines:
    #: `validate.run.executors.ray_image.TaskImageFetch`); None: nothing to fetch from.
    fetch_image: Callable[[str], None] | None = None


class Player(Protocol):
    """Who plays an attempt: an environment's agent program or the evaluated model."""

    @property
    def name(self) -> str: ...

    @property
    def role(self) -> str: ...


class AttemptKind(ABC, Generic[R]):
    """How one attempt is prepared, played and scored (registered by name in
    `validate.kinds`). `once` makes one try's result, complete whatever happens (an
    infrastructure fault is its row's ``infrastructure_error`` status, which the runner
    retries); `row` is the attempt row the result carries; `keep` writes any further
    evidence of the results before their rows are journaled. The kind gets the run's live
    context, so a kind may score on the host or inside a live session after the agent."""

    #: The kind's registry name (``validate.attempt_kinds``), which an environment names.
    name: ClassVar[str]
    #: False for a kind only a command that supplies its context can play (``chat``: the
    #: eval's model and contract); an environment cannot name it.
    standalone: ClassVar[bool] = True
    #: The attempt kind of the environments this kind plays a model on (None: it plays no
    #: model; `validate.kinds.model_kind_class` pairs them).
    evaluates: ClassVar[str | None] = None
    #: Its contracts record a trial profile (`validate.contract.manifest.TrialProfile`: the
    #: verifier mode, the work-paths rule, the harness program's digest).
    trial_profile: ClassVar[bool] = False

    @abstractmethod
    def once(self, ctx: RunContext, play: Play, task: Task, agent: Player, sample: int, number: int) -> R:
        """One try of (task, agent, sample), numbered `number`."""

    @abstractmethod
    def unsupported(self, ctx: RunContext, play: Play, task: Task, agent: Player, sample: int,
                    number: int) -> R:
        """The result of a try the backend cannot make: the task needs a network-isolated sandbox."""

    def lost(self, ctx: RunContext, play: Play, task: Task, agent: Player, sample: int, number: int,
             error_class: str, message: str) -> R:
        """The result of a try lost with the machine that ran it: an infrastructure error of
        `error_class` (a kind that cannot say so cannot run on another machine)."""
        raise NotImplementedError(f"the {self.name!r} attempt kind cannot record a lost attempt")

    def placed(self, result: R, node: str, host: str) -> R:
        """The result with where it ran: the cluster node (its id) and host, as the executor
        learnt them from the cluster (a kind that cannot say so cannot run on another machine)."""
        raise NotImplementedError(f"the {self.name!r} attempt kind cannot record where an attempt ran")

    def row(self, result: R) -> Attempt:
        assert isinstance(result, Attempt)
        return result

    def keep(self, ctx: RunContext, results: list[R]) -> None:
        """Write the results' evidence other than their attempt rows (nothing by default). Called
        on the driver, the one writer of evidence; `once` itself never writes the run directory."""


@dataclass(frozen=True)
class Play:
    """One phase's work: these agents on these tasks of this contract, by this attempt kind."""

    phase: str
    manifest: Manifest
    taskset: Taskset
    idx: list[int]
    agents: Sequence[Player]
    kind: AttemptKind
    samples: int = 1
    #: The contract's (task, agent) skips apply: its agents play. False for the evaluated model,
    #: which is no agent of the contract (a control that happened to be named like it must not
    #: drop the model's attempts).
    skips: bool = True

    def samples_of(self, agent: Player) -> int:
        """How many samples of `agent` each task gets: the contract's ``oracle_repeats`` for
        its oracle (each repeat a sample, so a resume reruns only the missing ones), else
        `samples`."""
        if self.skips and agent.role == ORACLE:
            return max(self.samples, self.manifest.expectations.oracle_repeats)
        return self.samples
