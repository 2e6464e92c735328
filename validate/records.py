"""The evidence's rows, as pydantic models: the schema of record for every Parquet file.

Parquet columns derive from these models (`arrow_schema`); an attempt's ``metrics`` dict is
flattened into one ``metric_<name>`` float column per metric the environment declares.
"""

from __future__ import annotations

import types
import typing
from datetime import datetime
from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1

#: What happened to one attempt. Agent outcomes (the agent's own doing) come first;
#: the last three are harness-side outcomes.
Status = Literal[
    "ok",                              # the agent exited 0; its reply (if any) was scored
    "exit_nonzero",                    # the agent crashed or exited non-zero; its reply was scored
    "timeout",                         # killed at the wall-clock limit; its reply was scored
    "oom",                             # killed by the memory limit; its reply was scored
    "reply_too_large",                 # the reply exceeded max_reply_bytes; scored as no reply
    "infrastructure_error",            # the sandbox failed (retried); not the agent's doing
    "unsupported_execution_contract",  # the backend cannot honour the task's contract; not run
    "scorer_error",                    # the environment's scorer raised
]
AGENT_STATUSES = ("ok", "exit_nonzero", "timeout", "oom", "reply_too_large")

Reason = Literal[
    "infrastructure_failure",
    "unsupported_execution_contract",
    "invalid_task_or_verifier",
    "oracle_fails_on_valid_task",
]
#: Verdict precedence: the first reason that applies is the task's one reason.
REASON_ORDER: tuple[str, ...] = typing.get_args(Reason)


class TaskRow(BaseModel):
    """The key fields every evidence row starts with."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    run_id: str
    phase: str
    task_id: str
    idx: int
    task_hash: str


class Attempt(TaskRow):
    """One agent run on one task (one try: an infrastructure retry is a new attempt)."""

    agent: str
    #: What the contract expects: ``pass`` (oracle), ``reject`` (control) or ``partial`` (probe).
    expect: str
    #: 1-based try number for this (phase, task, agent).
    attempt: int
    #: True when a later attempt of the same (phase, task, agent) replaces this one.
    superseded: bool = False
    status: Status
    #: Reward and metrics from the environment's own scorer (None when not scored).
    reward: float | None = None
    metrics: dict[str, float] = {}
    #: The oracle passed (reward ≥ threshold, status ok) / the control stayed under its ceiling.
    as_expected: bool = False
    error_class: str | None = None
    error_message: str | None = None
    started_at: datetime
    finished_at: datetime | None = None
    #: Wall-clock seconds of the sandbox run (None when it never ran).
    runtime_s: float | None = None
    reply_sha256: str | None = None
    reply_bytes: int | None = None
    workspace_sha256: str
    backend: str
    image_digest: str
    exit_code: int | None = None
    oom_killed: bool = False
    timed_out: bool = False
    #: First bytes of the agent's stdout / stderr (UTF-8, errors replaced).
    stdout: str = ""
    stderr: str = ""


class TaskVerdict(TaskRow):
    """The task's one verdict."""

    n_papers: int
    #: Units (paragraphs, and headings when included) the agent had to order.
    n_units: int
    #: The task's papers, anchor first; the anchor's source names the task's family.
    paper_ids: list[str]
    anchor_source: str
    compatible: bool
    #: Exactly one reason when not compatible (see `REASON_ORDER` for precedence).
    reason: Reason | None
    detail: str
    oracle_reward: float | None
    #: The highest control reward and the control that got it.
    max_control_reward: float | None
    max_control_agent: str | None
    n_attempts: int


class Exclusion(TaskRow):
    """An excluded task and its one reason."""

    reason: Reason
    detail: str


_SCALARS = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_(),
            datetime: pa.timestamp("us", tz="UTC")}


def _arrow_type(annotation) -> pa.DataType:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is list:
        return pa.list_(_arrow_type(args[0]))
    if origin in (typing.Union, types.UnionType):
        return _arrow_type(args[0])
    if origin is Literal:
        return pa.string()
    return _SCALARS[annotation]


def arrow_schema(model: type[BaseModel], metric_names: tuple[str, ...] = ()) -> pa.Schema:
    fields = []
    for name, info in model.model_fields.items():
        if name == "metrics":
            fields += [pa.field(f"metric_{m}", pa.float64()) for m in metric_names]
        else:
            fields.append(pa.field(name, _arrow_type(info.annotation)))
    return pa.schema(fields)


def flat_row(record: BaseModel, metric_names: tuple[str, ...] = ()) -> dict:
    row = record.model_dump()
    metrics = row.pop("metrics", None)
    if metrics is not None:
        for m in metric_names:
            row[f"metric_{m}"] = metrics.get(m)
    return row
