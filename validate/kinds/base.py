"""What every attempt kind shares, once: an attempt's key and its row started before anything
runs, when it started and ended, an error's message cut to what a row keeps, the row of a try
the backend cannot make or that was lost with its machine, where it ran; and, for the kinds
whose result is the row and the reply it names (`Tried`: ``program``, ``trial``), storing the
replies on the driver before their rows are journaled.

A kind says only what differs: how it plays (`AttemptKind.once`) and, for a reply kind, the
image digest its rows name (`ReplyKind.image_digest`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from environment.protocol import Task
from validate.core.errors import EvidenceError
from validate.core.records import Attempt
from validate.evidence.journal import store_reply
from validate.run.context import AttemptKind, Play, RunContext
from validate.run.workspace import workspace_sha256

#: An error message as a row keeps it, in characters.
ERROR_CHARS = 2000


def now() -> datetime:
    """An attempt's timestamps: UTC, as every row has them."""
    return datetime.now(UTC)


def failed(row: dict, status: str, error_class: str, message: str) -> None:
    """`row` ended with `status` and its error, the message cut to what a row keeps."""
    row.update(status=status, error_class=error_class, error_message=message[:ERROR_CHARS])


def attempt_key(ctx: RunContext, play: Play, agent: str, role: str, sample: int, number: int) -> dict:
    """What names one try in the run: its run, phase, agent, sample and try number."""
    return dict(run_id=ctx.run_id, phase=play.phase, agent=agent, role=role, sample=sample, attempt=number)


def started_row(key: dict, task: Task, **fields) -> dict:
    """A try's row as it stands before anything runs: its key and task, started now, and a
    ``harness_error`` until the try says otherwise (a row exists whatever happens)."""
    return dict(key, task_id=task.id, idx=task.idx, task_hash=task.hash, started_at=now(),
                status="harness_error", **fields)


def unsupported_row(ctx: RunContext, task: Task, key: dict, image_digest: str,
                    status: str = "unsupported_execution_contract", error_class: str = "NEEDS_CONTAINER",
                    message: str | None = None) -> Attempt:
    """The row of an attempt that did not run here: by default the backend cannot run it (the
    task needs a network-isolated sandbox); or `status` with its error."""
    message = message or f"the task needs network isolation and backend {ctx.sandbox.backend} provides none"
    row = started_row(key, task, workspace_sha256=workspace_sha256(dict(task.files)),
                      backend=ctx.sandbox.backend, image_digest=image_digest)
    row["finished_at"] = row["started_at"]  # nothing ran: one instant, never a finish before the start
    failed(row, status, error_class, message)
    return Attempt(**row)


@dataclass(frozen=True)
class Tried:
    """One try's result: its row and the whole reply it names (None: no reply was read)."""

    row: Attempt
    reply: bytes | None = None


def keep_replies(ctx: RunContext, results: list[Tried]) -> None:
    """Store each result's reply whole under its sha256, on the driver, before the rows are
    journaled: a reply that cannot be kept fails the evidence itself (EvidenceError), as a
    journal write does."""
    for r in results:
        if r.reply is not None and store_reply(ctx.paths, r.reply) != r.row.reply_sha256:
            raise EvidenceError(f"attempt {r.row.phase}/{r.row.task_id}/{r.row.agent}: its reply is not the "
                                f"bytes its row names ({r.row.reply_sha256})")


class ReplyKind(AttemptKind[Tried]):
    """A kind whose result is the attempt's row and the reply it names (`Tried`): the
    unsupported and lost rows, where it ran, the row, and keeping the replies, for every such kind."""

    def image_digest(self, play: Play, task: Task) -> str:
        """The image digest its rows name for `task` (the contract's sandbox image by default)."""
        return play.manifest.execution.image_digest

    def unsupported(self, ctx: RunContext, play: Play, task: Task, agent, sample: int, number: int) -> Tried:
        key = attempt_key(ctx, play, agent.name, agent.role, sample, number)
        return Tried(unsupported_row(ctx, task, key, self.image_digest(play, task)))

    def lost(self, ctx: RunContext, play: Play, task: Task, agent, sample: int, number: int,
             error_class: str, message: str) -> Tried:
        key = attempt_key(ctx, play, agent.name, agent.role, sample, number)
        return Tried(unsupported_row(ctx, task, key, self.image_digest(play, task), "infrastructure_error",
                                     error_class, message))

    def placed(self, result: Tried, node: str, host: str) -> Tried:
        return Tried(result.row.model_copy(update={"node": node, "host": host}), result.reply)

    def row(self, result: Tried) -> Attempt:
        return result.row

    def keep(self, ctx: RunContext, results: list[Tried]) -> None:
        keep_replies(ctx, results)
