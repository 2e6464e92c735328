"""The evidence's rows, as pydantic models: the schema of record for every Parquet file;
and the run's vocabulary, each word set defined once: `Role`, `Status`, `Reason`, `Verdict`,
`RunKind` (a `Literal` each, with module constants naming its members, so a comparison is
checked by the type checker and the Parquet/JSON bytes stay plain strings).

Parquet columns derive from these models (`arrow_schema`), each carrying its field's
description in the column metadata. An attempt's ``metrics`` dict is flattened into one
``metric_<name>`` float column per metric the environment declares; a verdict's ``meta`` is
the environment's public task facts as canonical JSON text, whole per row (tasks' facts differ
in keys and types; evidence written before that holds a struct of the first row's keys, which
`meta_of` still reads).
"""

from __future__ import annotations

import json
import types
import typing
from datetime import datetime
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from environment.protocol import Role as DeclaredRole, canonical_json, meta_value, safe_text

SCHEMA_VERSION = 2

#: Free text a task, an agent or its verifier may have produced (their output, file names, a
#: reward file's keys in an error): stored `safe_text`, each lone surrogate escaped, so no
#: byte of theirs can stop the journal or a Parquet write.
Text = Annotated[str, AfterValidator(safe_text)]

#: What the contract expects of an attempt's agent: the roles an environment declares for its
#: agents (`environment.protocol.Role`: oracle, control, probe), plus the model under
#: evaluation (`validate.eval`), which no environment declares.
Role = Literal[DeclaredRole, "model"]
ORACLE: Role = "oracle"
CONTROL: Role = "control"
PROBE: Role = "probe"
MODEL: Role = "model"
#: Every role, in the order reports list them (oracle first, the model last).
# nested Literals flatten: ("oracle", "control", "probe", "model")
ROLES: tuple[Role, ...] = typing.get_args(Role)

#: What kind of run a run directory holds: a dataset run (`validate run`/`pilot`/`pool`, its
#: run.json says which) or a model evaluation (`validate eval run`). Read it with
#: `validate.evidence.summary.run_kind`.
RunKind = Literal["run", "pool", "pilot", "eval"]
RUN: RunKind = "run"
POOL: RunKind = "pool"
PILOT: RunKind = "pilot"
EVAL: RunKind = "eval"

#: What happened to one attempt. The first six are the agent's own doing; the rest are
#: harness-side outcomes, known from the harness's own signals.
Status = Literal[
    "ok",                              # the agent exited 0 and left a reply; it was scored
    "no_reply",                        # the agent exited 0 without a regular reply file; scored as empty
    # crashed or exited non-zero (a model: its commands ended its sandbox); reply scored
    "exit_nonzero",
    "timeout",                         # killed at the wall-clock limit; its reply (if any) was scored
    "oom",                             # killed by the memory limit; its reply (if any) was scored
    "reply_too_large",                 # the reply exceeded max_reply_bytes; scored as empty
    # the sandbox or a scorer dependency failed (retried); not the agent's doing
    "infrastructure_error",
    # handling this attempt raised inside the harness (a bug); recorded, not retried
    "harness_error",
    "unsupported_execution_contract",  # the backend cannot honour the task's contract; not run
    "scorer_error",                    # the environment's scorer raised on this reply
]
OK: Status = "ok"
NO_REPLY: Status = "no_reply"
EXIT_NONZERO: Status = "exit_nonzero"
TIMEOUT: Status = "timeout"
OOM: Status = "oom"
REPLY_TOO_LARGE: Status = "reply_too_large"
INFRASTRUCTURE_ERROR: Status = "infrastructure_error"
HARNESS_ERROR: Status = "harness_error"
UNSUPPORTED_EXECUTION_CONTRACT: Status = "unsupported_execution_contract"
SCORER_ERROR: Status = "scorer_error"
STATUSES: tuple[Status, ...] = typing.get_args(Status)
AGENT_STATUSES: tuple[Status, ...] = STATUSES[:6]
# A model attempt (role "model", `validate.eval`) maps onto the same statuses: ok, it answered;
# no_reply, it did not (no final message, out of turns, over the context); timeout, the
# attempt's wall clock ran out; error_class then holds how the conversation ended.
#: Outcomes that are exceptions in the protocol's sense: the harness, not the agent, failed.
EXCEPTION_STATUSES: tuple[Status, ...] = (INFRASTRUCTURE_ERROR, HARNESS_ERROR)

Reason = Literal[
    "infrastructure_failure",
    "unsupported_execution_contract",
    "invalid_task_or_verifier",
    # The task's reference solution passes only when the changes it made outside the task's work
    # paths (a package it installed, /etc it edited) reach the verifier: under the trusted
    # verifier it fails, replayed in its own container it passes. Its verifier reads what an
    # agent may tamper with, so it cannot be shown hack-resistant; counted apart, never
    # certified. Before oracle_fails_on_valid_task, which it replaces for such a task.
    "needs_system_changes",
    "oracle_fails_on_valid_task",
    # The task ships no reference solution (the environment froze the oracle out of it, e.g. a
    # Harbor task without solution/solve.sh): it cannot be oracle-certified, only runtime-tested
    # (its controls run and all reject). After the three reasons above: a control that passes,
    # a verifier error or a broken task is the more telling finding (invalid_task_or_verifier
    # wins), and nothing about the oracle can be found on a task it never plays. Before
    # no_negative_control: a missing reference is a fact of the task's own files, whichever
    # controls the contract chose.
    "no_reference_solution",
    # The contract names controls, but every one is frozen out of this task (its environment's
    # not_applicable, the manifest's per-task skip): no rejection can be shown, so the oracle's
    # pass proves nothing about the reward here. Last: the contract alone decides it, so any
    # reason the run itself found is the more telling one.
    "no_negative_control",
]
#: Verdict precedence: the first reason that applies is the task's one reason.
REASON_ORDER: tuple[Reason, ...] = typing.get_args(Reason)
INFRASTRUCTURE_FAILURE: Reason = "infrastructure_failure"
UNSUPPORTED_CONTRACT: Reason = "unsupported_execution_contract"
INVALID_TASK_OR_VERIFIER: Reason = "invalid_task_or_verifier"
NEEDS_SYSTEM_CHANGES: Reason = "needs_system_changes"
ORACLE_FAILS_ON_VALID_TASK: Reason = "oracle_fails_on_valid_task"
NO_REFERENCE_SOLUTION: Reason = "no_reference_solution"
NO_NEGATIVE_CONTROL: Reason = "no_negative_control"

#: A task's one verdict.
Verdict = Literal["compatible", "excluded", "incomplete"]
COMPATIBLE: Verdict = "compatible"
EXCLUDED: Verdict = "excluded"
INCOMPLETE: Verdict = "incomplete"
VERDICTS: tuple[Verdict, ...] = typing.get_args(Verdict)


class TaskRow(BaseModel):
    """The key fields every evidence row starts with."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(default=SCHEMA_VERSION, description="Version of this row's schema.")
    run_id: str = Field(description="The run directory's name; the same before and after a resume.")
    phase: str = Field(description="Which part of the run: oracle, controls, pilot-<variant>, eval, ...")
    task_id: str = Field(description="The task's id in the contract (unique per config variant).")
    idx: int = Field(description="The task's index in its taskset.")
    task_hash: str = Field(description="sha256 of the task's whole content, gold included (the manifest's).")


class PathChange(BaseModel):
    """A path an agent changed, as the container engine's own diff of its container gives it."""

    model_config = ConfigDict(extra="forbid")

    path: Text = Field(description="The changed path (absolute).")
    kind: Literal["changed", "added", "deleted"] = Field(description="What the agent did to it.")


class TrialEvidence(BaseModel):
    """What the harness itself observed of one trial (a task directory's attempt): never the
    agent's or the verifier's text. The audit re-derives the attempt's ``stderr`` head, its
    ``shared_reward`` and its ``planted`` from these."""

    model_config = ConfigDict(extra="forbid")

    verifier_mode: Literal["trusted", "shared", "separate"] = Field(description=(
        "Where the verifier ran: trusted (a fresh container of the task's image, the agent's changes under "
        "the work paths carried), shared (the agent's own container), separate (the task's own "
        "verifier image)."))
    work_paths: list[Text] = Field(description="The task's work paths "
                                              "(validate.taskdir.trial.workpaths.RULE): every change under "
                                              "them is the agent's work.")
    named_paths: list[Text] = Field(default_factory=list, description=(
        "The paths the instruction or tests name outside them: only what the agent added there is its work."))
    carried: list[Text] = Field(description="The agent's changed subtrees under its work paths (the first "
                                           "200): trusted, all the verifier gets of its changes; otherwise "
                                           "seen by the verifier like every other change.")
    carried_total: int = Field(description="How many changed subtrees under the work paths.")
    dropped: list[Text] = Field(description="Devices, fifos and sockets the agent made under its work paths, "
                                           "never carried.")
    outside: list[PathChange] = Field(description="The agent's changes outside its work paths (the first "
                                                  "200), from the engine's record of its writable layer; "
                                                  "trusted: never carried.")
    outside_total: int = Field(description="How many changes outside the work paths.")
    processes_killed: int | None = Field(description="Processes of the agent phase killed before a shared "
                                                     "verifier ran in the same container "
                                                     "(None: no such sweep).")
    left_in_verifier: list[Text] = Field(description="What the agent phase left in /logs/verifier (never "
                                                    "read as a reward).")
    verifier_exit_code: int | None = Field(description="test.sh's exit status (None: killed by the harness).")
    lookups_agent: list[Text] = Field(description="Names the agent phase looked up through the "
                                                  "harness's resolver.")
    lookups_verifier: list[Text] = Field(description="Names the verifier phase looked up.")
    pid1_guarded: bool | None = Field(description="The container's PID 1 ran under the harness's own ids.")
    shared_replayed: bool = Field(description="The verifier was replayed in the agent's own container (the "
                                              "reference solution's trusted verifier did not pass and it "
                                              "changed paths outside its work paths).")
    lookups_note: Text | None = Field(default=None, description="What the resolver could not name (more "
                                                               "names than it keeps, a problem it met).")
    storage_bounded: bool = Field(default=False, description=(
        "The trial's writable layer was on storage of the contract's size and inodes (a tmpfs of the "
        "harness's); False: the engine's own layer (a rootless service, another storage driver), bounded "
        "by its disk only."))

    def lines(self) -> str:
        """The head of the attempt's ``stderr``: these observations in words, one a line, each in
        brackets (the rest of ``stderr`` is the verifier's own output). The audit derives it again."""
        out = []
        if self.left_in_verifier:
            out.append("[left in /logs/verifier by the agent phase, removed unread: "
                       f"{', '.join(self.left_in_verifier)}]")
        if self.processes_killed:
            out.append(f"[processes of the agent phase killed before the verifier: {self.processes_killed}]")
        looked = [f"agent phase: {_named(self.lookups_agent)}" if self.lookups_agent else "",
                  f"verifier phase: {_named(self.lookups_verifier)}" if self.lookups_verifier else "",
                  self.lookups_note or ""]
        if any(looked):
            out.append("[names looked up through the harness's resolver: " + "; ".join(b for b in looked if b)
                       + "]")
        if self.dropped:
            out.append(f"[not handed to the verifier: {', '.join(self.dropped)}]")
        if self.verifier_mode == "trusted":
            named = f"; what it added under {', '.join(self.named_paths)}" if self.named_paths else ""
            out.append(f"[trusted verifier: carried {self.carried_total} of the agent's paths under its work "
                       f"paths ({', '.join(self.work_paths) or 'none'}{named}); {self.outside_total} changes "
                       "outside them stayed in the agent's container]")
        if self.shared_replayed:
            out.append("[the verifier replayed in the agent's own container]")
        out.append(f"[verifier exit {self.verifier_exit_code}]")
        return "".join(f"{line}\n" for line in out)


def _named(names: list[str], most: int = 10) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def planted_words(paths: list[str], total: int, most: int = 3) -> str | None:
    """`Attempt.planted` of a control's paths the verifier may have seen (None: none)."""
    if not paths:
        return None
    return ", ".join(paths[:most]) + (f" (+{total - most} more)" if total > most else "")


class Attempt(TaskRow):
    """One agent run on one task (one try: an infrastructure retry is a new attempt)."""

    agent: str = Field(description="The agent's name in its environment.")
    role: Role = Field(
        description="What the contract expects of the agent (declared by the environment, never "
                    "read from its name).")
    sample: int = Field(default=0, ge=0,
                        description="Sample number (0 unless the run draws several per task).")
    attempt: int = Field(ge=1, description="1-based try number of this (phase, task, agent, sample).")
    superseded: bool = Field(default=False,
                             description="A later try of the same (phase, task, agent, sample) exists.")
    status: Status = Field(description="How the attempt ended (see validate.core.records.Status).")
    reward: float | None = Field(default=None,
                                 description="Reward from the environment's own scorer; None: not scored.")
    reward_decimal: str | None = Field(default=None, description="The reward's exact decimal text, where the "
                                       "float misreads what the scorer read (a verifier's "
                                       "0.99999999999999999999 is the float 1.0): the threshold and ceilings "
                                       "are compared with it. None: the float is exact.")
    metrics: dict[str, float] = Field(default_factory=dict, description="The scorer's metrics.")
    as_expected: bool = Field(default=False, description="The oracle passed / the control stayed under its "
                                                         "ceiling / the probe landed in between "
                                                         "(recomputed by audit).")
    error_class: str | None = Field(default=None, description="The error's kind, for any outcome but ok.")
    error_message: Text | None = Field(default=None, description="What went wrong, in words (agent text "
                                                                "escaped in reports).")
    started_at: datetime = Field(description="UTC time the attempt began.")
    finished_at: datetime | None = Field(default=None, description="UTC time the attempt ended.")
    runtime_s: float | None = Field(default=None, description="Wall-clock seconds of the sandbox run.")
    reply_sha256: str | None = Field(default=None, description="sha256 of the whole reply read back.")
    reply_bytes: int | None = Field(default=None, description="Size of the reply read back.")
    reply_text: Text | None = Field(default=None, description="The reply (UTF-8, errors replaced), its first "
                                                             "max_reply_text_bytes bytes.")
    reply_truncated: bool = Field(default=False, description="reply_text holds only the reply's head.")
    workspace_sha256: str = Field(description="sha256 of the task's workspace files as materialised.")
    backend: str = Field(description="The sandbox backend.")
    image_digest: str = Field(description="The sandbox image's content digest.")
    exit_code: int | None = Field(default=None,
                                  description="The agent's exit code; None when killed by the harness.")
    oom_killed: bool = Field(default=False,
                             description="The memory limit killed the agent (the backend says so).")
    timed_out: bool = Field(default=False, description="The harness's own clock hit timeout_s.")
    stdout: Text = Field(default="",
                         description="First bytes of the agent's stdout (UTF-8, errors replaced).")
    stderr: Text = Field(default="",
                         description="First bytes of the agent's stderr (UTF-8, errors replaced).")
    # Where it ran, set by an executor that runs attempts on other machines (ray) from what the
    # cluster itself says; None on this machine. Their columns are written only when some row
    # has them (`PLACEMENT`), so evidence of local runs keeps the columns it always had.
    node: str | None = Field(default=None, description="The cluster node that ran the attempt (Ray's node "
                                                       "id); None: the driver's own machine.")
    host: str | None = Field(default=None, description="That node's host, as the cluster records it.")
    # A task directory's trial: what the harness observed (`TrialEvidence`), the reward of the
    # verifier replayed in the agent's own container, and the paths a control planted that the
    # verifier saw (its first carried paths, then its outside changes). Their columns are
    # written only when some row has them (`TRIAL`), so evidence of other runs keeps its columns.
    trial: TrialEvidence | None = Field(default=None, description="What the harness observed of a trial "
                                                                  "(task directories only).")
    shared_reward: float | None = Field(default=None, description="The reference solution's reward from the "
                                                                  "verifier replayed in its own container "
                                                                  "(None: not replayed or no "
                                                                  "usable reward there).")
    planted: Text | None = Field(default=None, description="A trial's changes the verifier may have seen: "
                                                          "its first carried paths (trusted) or changes "
                                                          "(shared), for the verdict's words.")


#: Attempt columns present only in the evidence of a run whose attempts ran on cluster nodes.
PLACEMENT: tuple[str, ...] = ("node", "host")
#: Attempt columns present only in the evidence of a run that played trials (task directories).
TRIAL: tuple[str, ...] = ("trial", "shared_reward", "planted")
#: Attempt columns present only in the evidence of a run where some reward's float misread its
#: text (and in none recorded before they existed): runs keep the columns they always had.
EXACT: tuple[str, ...] = ("reward_decimal",)


class FindingRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Text = Field(description="What was found.")
    blocking: bool = Field(description="It makes the task invalid whatever the agents do.")
    detail: Text = Field(description="In words.")


class TaskVerdict(TaskRow):
    """The task's one verdict."""

    family: str = Field(description="The task's family, as its environment names it (strata, "
                                    "per-family tables).")
    meta: dict[str, Any] = Field(default_factory=dict, description="The environment's public facts of the "
                                 "task, stored as canonical JSON text (sorted keys; "
                                 "environment.protocol.meta_value: TOML dates and times as RFC 3339 text, "
                                 "non-finite floats as 'nan', 'inf', '-inf').")
    verdict: Verdict = Field(description="compatible; excluded (exactly one reason); incomplete "
                                         "(evidence missing).")
    reason: Reason | None = Field(description="Why excluded (see REASON_ORDER for "
                                              "precedence); None otherwise.")
    missing: list[str] = Field(default_factory=list, description="What evidence an incomplete task lacks.")
    detail: Text = Field(description="The verdict in words.")
    findings: list[FindingRow] = Field(default_factory=list,
                                       description="Checks on the task before any agent ran.")
    oracle_reward: float | None = Field(description="The oracle's final reward.")
    max_control_reward: float | None = Field(description="The highest final control reward.")
    max_control_agent: str | None = Field(description="The control that got it.")
    margin: float | None = Field(description="oracle_reward minus max_control_reward.")
    retried: bool = Field(default=False, description="It passed only after an infrastructure retry "
                                                     "(exception rule 'retry' only).")
    n_attempts: int = Field(description="Attempts recorded for the task in this phase, superseded included.")
    oracle_certified: bool | None = Field(default=None, description=(
        "Task directories: the oracle passed (in its own container, for needs_system_changes) and every "
        "control but the tampering ones rejected — the claim's N, whatever the tampering controls did "
        "(compatible tasks are the hack-resistant H). Written only for a contract with a trial profile "
        "(`VERDICT_TRIAL`)."))


#: TaskVerdict columns present only in the evidence of a contract with a trial profile.
VERDICT_TRIAL: tuple[str, ...] = ("oracle_certified",)


class Exclusion(TaskRow):
    """An excluded task and its one reason."""

    reason: Reason = Field(description="The one reason.")
    detail: Text = Field(description="In words.")


_SCALARS: dict[object, pa.DataType] = {int: pa.int64(), float: pa.float64(), str: pa.string(),
                                       bool: pa.bool_(), datetime: pa.timestamp("us", tz="UTC")}


def _arrow_type(annotation) -> pa.DataType:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is Annotated:  # `Text`: a str validated on its way in
        return _arrow_type(args[0])
    if origin is list:
        return pa.list_(_arrow_type(args[0]))
    if origin in (typing.Union, types.UnionType):
        return _arrow_type(args[0])
    if origin is Literal:
        return pa.string()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pa.struct([pa.field(n, _arrow_type(f.annotation)) for n, f in annotation.model_fields.items()])
    return _SCALARS[annotation]


def arrow_schema(model: type[BaseModel], metric_names: tuple[str, ...] = (),
                 omit: tuple[str, ...] = ()) -> pa.Schema:
    """The model's Parquet schema, less the columns named in `omit` (`PLACEMENT` of a local run)."""
    fields: list[pa.Field] = []
    for name, info in model.model_fields.items():
        if name in omit:
            continue
        about = {b"description": (info.description or "").encode()}
        if name == "metrics":
            fields += [pa.field(f"metric_{m}", pa.float64(),
                                metadata={b"description": f"metric {m}".encode()})
                       for m in metric_names]
        elif name == "meta":  # canonical JSON text: every row's own keys and types (`flat_row`)
            fields.append(pa.field(name, pa.string(), metadata=about))
        else:
            fields.append(pa.field(name, _arrow_type(info.annotation), metadata=about))
    return pa.schema(fields, metadata={b"model": model.__name__.encode(),
                                       b"schema_version": str(SCHEMA_VERSION).encode()})


def flat_row(record: BaseModel, metric_names: tuple[str, ...] = ()) -> dict:
    row = record.model_dump()
    metrics = row.pop("metrics", None)
    if metrics is not None:
        for m in metric_names:
            row[f"metric_{m}"] = metrics.get(m)
    if "meta" in row:
        row["meta"] = meta_text(row["meta"])
    return row


def meta_text(meta: dict[str, Any]) -> str | None:
    """A verdict's public facts as stored: canonical JSON text of `meta_value`s; None when empty."""
    return canonical_json(meta_value(meta)).decode() if meta else None


def meta_of(stored: str | dict | None) -> dict[str, Any]:
    """A verdict's public facts as read back: its JSON text parsed, or from evidence written
    before meta was text, the struct's fields less the nulls a struct gives a key its row
    lacked; an empty meta is stored null."""
    if isinstance(stored, str):
        return json.loads(stored)
    return {k: v for k, v in (stored or {}).items() if v is not None}


def verdict_of_row(row: dict) -> TaskVerdict:
    """The inverse of `flat_row` for a verdict read back from Parquet."""
    return TaskVerdict.model_validate({**row, "meta": meta_of(row.get("meta"))})


def unflatten(row: dict) -> dict:
    """The inverse of `flat_row` for an attempt read back from Parquet."""
    metrics = {k[len("metric_"):]: row.pop(k) for k in [k for k in row if k.startswith("metric_")]}
    row["metrics"] = {k: v for k, v in metrics.items() if v is not None}
    return row
