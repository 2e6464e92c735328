"""Executors by name: how a phase's attempts are carried out, and where.

An executor takes **attempt specifications** — plain, serialisable data naming one
(phase, task, agent, sample) and its first try number, no live object — and a *worker*
that turns one specification into its records (every try of it). It hands each
specification to the worker somewhere (threads of this process, a cluster's nodes) and gives
the results back to the caller's thread in the order they finish, so the runner and its
journal, the one writer of evidence, never know which executor ran an attempt.
`cancel()` stops handing out work and stops what runs; Ctrl-C reaches it through the
runner. An executor that runs the worker in another process or machine ships its `recipe`
(`WorkerRecipe`, plain data) and rebuilds it there (`validate.run.runner.worker_from_recipe`).
Executors are the ``validate.executors`` entry-point group of every installed distribution
(this project registers ``threads`` and ``ray``), loaded through `validate.core.registry`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from validate.core.errors import ValidateError
from validate.core.registry import Registry
from validate.sandbox.base import Limits

R = TypeVar("R")

DEFAULT_EXECUTOR = "threads"


class AttemptSpec(BaseModel):
    """One (phase, task, agent, sample) still to be played, from try number `attempt` on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    phase: str = Field(description="the play's phase, e.g. oracle, controls, run, eval-t0.7")
    idx: int = Field(ge=0, description="the task's index in the contract's taskset")
    agent: str = Field(description="the agent's name in the contract's expectations (model: eval)")
    sample: int = Field(ge=0, description="which of the key's independent samples")
    attempt: int = Field(ge=1, description="the number of its first try (later tries follow it)")
    contract: str = Field(description="sha256 of the contract (manifest) the attempt is played under")
    limits: Limits = Field(description="the sandbox limits of every try (the contract's execution limits)")


class WorkerRecipe(BaseModel):
    """What a worker is rebuilt from on another machine: plain data naming the live objects of
    the driver's worker (an executor that cannot share this process's memory ships this)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(description="the run's id")
    sandbox_label: str = Field(description="the run's sandbox and attempt-storage label "
                                           "(`RunPaths.sandbox_label`)")
    manifest: str = Field(description="the play's contract, its canonical JSON (re-verified "
                                      "where it is rebuilt)")
    execution: dict[str, Any] = Field(description="that contract's execution profile as it dumps (its image, "
                                                  "digest and backend: what the driver offers the nodes, "
                                                  "read without parsing the whole contract again)")
    data: list[str] = Field(default_factory=list,
                            description="where the environment's data is looked for (--data)")
    phase: str = Field(description="the play's phase")
    kind: str = Field(description="the attempt kind's registry name")
    agents: list[str] = Field(description="the play's agents, by their names in the contract")
    samples: int = Field(ge=1, description="independent samples per (task, agent)")
    backoff_s: tuple[float, float] = Field(
        description="the infrastructure retries' backoff (multiplier, max)"
    )
    code: str = Field(description="the driver's code label (commit, -dirty when patched)")


class Worker(Protocol[R]):
    """Plays one specification, every try of it; `cancel` kills what it is running. `recipe`
    is the plain data it is rebuilt from elsewhere; `lost(spec, first, error_class, message)`
    is the results of a try lost with the machine that ran it (an infrastructure fault) and the
    next try's specification if the contract's retries allow one (`first`: the key's first try
    in this run); `placed(results, node, host)` is the results marked with the cluster node that
    ran them."""

    def __call__(self, spec: AttemptSpec) -> list[R]: ...

    def cancel(self) -> None: ...

    def recipe(self) -> WorkerRecipe: ...

    def lost(self, spec: AttemptSpec, first: int, error_class: str,
             message: str) -> tuple[list[R], AttemptSpec | None]: ...

    def placed(self, results: list[R], node: str, host: str) -> list[R]: ...


class Executor(ABC, Generic[R]):
    """Carries out attempt specifications (see the module)."""

    #: The executor's registry name (``--executor``).
    name: ClassVar[str]
    #: It runs the worker in other processes or machines, rebuilt from its recipe: only
    #: standalone attempt kinds can run on it (`validate eval`'s chat kind cannot).
    remote: ClassVar[bool] = False

    def __init__(self, concurrency: int = 1) -> None:
        self.concurrency = concurrency

    @abstractmethod
    def run(self, specs: Iterable[AttemptSpec], worker: Worker[R], record: Callable[[list[R]], None]) -> None:
        """`worker(spec)` for each spec, at most `concurrency` at once; `record(results)` on
        the caller's thread for each spec as it finishes (or, where an executor hands a
        runner a few specs at once, as they all have: ray, at most `MAX_CALL`, each recorded
        in the order played). Threads hands the next spec out only after, so nothing runs
        that the run could not record; ray hands its idle slots their next calls first (a
        slot would otherwise wait on the journal), and a record that fails cancels those.
        Results of work killed by `cancel` are dropped (they are not evidence: a resume
        reruns them), a cancelled hand-out's finished specs with it.
        A KeyboardInterrupt on the caller's thread cancels and propagates."""

    @abstractmethod
    def cancel(self) -> None:
        """Stop handing out specifications and stop what is running (`worker.cancel`)."""


class ExecutorUnavailable(ValidateError):
    """The named executor is not installed or cannot run here."""


# The seam's base is abstract: the registry only checks classes against it (mypy #4717).
EXECUTORS: Registry[Executor] = Registry(
    "validate.executors", base=Executor,  # type: ignore[type-abstract]
    key="name", field="--executor", kind="executor", error=ExecutorUnavailable)


def executor_names() -> list[str]:
    """The installed executors' names, sorted (nothing is imported)."""
    return EXECUTORS.names()


def make_executor(name: str = DEFAULT_EXECUTOR, concurrency: int = 1) -> Executor:
    """A fresh executor of the class registered under `name`."""
    return EXECUTORS.load(name)(concurrency=concurrency)


__all__ = ["DEFAULT_EXECUTOR", "EXECUTORS", "AttemptSpec", "Executor", "ExecutorUnavailable", "Worker",
           "WorkerRecipe", "executor_names", "make_executor"]
