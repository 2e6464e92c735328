"""What an environment gives the validation harness.

The harness knows environments only through these shapes: a *taskset* turns an integer
index into a *task* (deterministically), and scores a reply to a task. Everything the
agent may see is in `prompt` and `files`; `answer_key` is what the oracle alone may read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol, runtime_checkable


@runtime_checkable
class Task(Protocol):
    id: str
    idx: int
    hash: str
    prompt: str
    files: Mapping[str, bytes]
    #: True when the task must run with no network (it may not run without a sandbox).
    requires_network_isolation: bool

    @property
    def answer_key(self) -> bytes:
        """The gold answer as bytes, for the oracle's read-only mount only."""
        ...


class Score(Protocol):
    reward: float
    metrics: Mapping[str, float]


@runtime_checkable
class Taskset(Protocol):
    #: Environment name, e.g. ``deshuffle-papers``.
    name: str
    #: Names of the metrics `score` returns, in a fixed order.
    metric_names: tuple[str, ...]

    def task(self, idx: int) -> Task: ...

    def tasks(self, start: int, stop: int) -> Iterator[Task]: ...

    def score(self, task: Task, reply: str | bytes) -> Score: ...
