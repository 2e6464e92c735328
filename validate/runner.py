"""Play agents on tasks through a sandbox; record every attempt; judge every task.

For each (task, agent, sample): the attempt's row exists before anything runs; the
workspace is materialised in fresh storage, the agent runs in a fresh sandbox, the reply is
read back (size-capped, regular files only) and scored on the host by the environment's own
scorer, and the finished row is appended to the journal. Whatever goes wrong while handling
one attempt ends up *in its row*: an infrastructure fault (`SandboxError`, a scorer's
`ScorerUnavailable`) as ``infrastructure_error`` (retried with backoff, each try its own
row), any other exception as ``harness_error`` (recorded, the phase goes on). An agent's own
failure (exit code, timeout, OOM, a missing or odd reply) is data, never retried.

Resuming is not a mode: the runner always skips (phase, task, agent, sample) keys whose
latest recorded attempt is final (anything but an infrastructure error).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential

from environment.protocol import (
    AgentSpec,
    Environment,
    LoadHints,
    ScorerUnavailable,
    Task,
    Taskset,
)
from validate.agents import source_files
from validate.contract import Manifest, TaskEntry
from validate.errors import EvidenceError, SandboxError, ValidateError
from validate.evidence import Journal, store_reply
from validate.patches import CodeState
from validate.paths import SANDBOX_WORKSPACE, RunPaths
from validate.records import Attempt, FindingRow, TaskVerdict
from validate.sandbox import Limits, RunRequest, Sandbox
from validate.sandbox.storage import attempt_storage
from validate.verdicts import Outcome, as_expected, decide
from validate.workspace import (
    NotAReply,
    ReplyTooLarge,
    materialise,
    read_reply,
    workspace_sha256,
)

Hooks = dict[str, Callable]


class Interrupted(ValidateError):
    """The run was stopped (Ctrl-C); what finished is recorded, `--resume` continues."""


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


@dataclass(frozen=True)
class Play:
    """One phase's work: these agents on these tasks of this contract."""

    phase: str
    manifest: Manifest
    taskset: Taskset
    idx: list[int]
    agents: list[AgentSpec]
    samples: int = 1


def _now() -> datetime:
    return datetime.now(UTC)


def _text(data: bytes, cap: int) -> tuple[str, bool]:
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def _run_agent(ctx: RunContext, play: Play, task: Task, agent: AgentSpec, row: dict) -> bytes | None:
    """Materialise, run, read back; fill `row` with what happened; return the reply."""
    ex = play.manifest.execution
    source = source_files(ctx.env) if agent.sees_source else None
    name = f"{task.idx}-{agent.name}-{uuid.uuid4().hex[:8]}"
    make = ctx.storage or (lambda n, lim, gid: attempt_storage(ctx.run_id, n, lim, gid=gid))
    with materialise(task, agent, play.manifest.opaque_id(task.id), lambda gid: make(name, ex.limits, gid),
                     source) as m:
        request = RunRequest(argv=tuple(ex.agent_command), mounts=m.mounts, env=m.env, workdir=SANDBOX_WORKSPACE,
                             limits=ex.limits, name=name, user=m.user, tmp=m.tmp)
        result = ctx.sandbox.run(request)
        row.update(runtime_s=result.runtime_s, exit_code=result.exit_code, oom_killed=result.oom_killed,
                   timed_out=result.timed_out, stdout=result.stdout.decode("utf-8", "replace"),
                   stderr=result.stderr.decode("utf-8", "replace"))
        status = ("timeout" if result.timed_out else "oom" if result.oom_killed
                  else "exit_nonzero" if result.exit_code != 0 else "ok")
        try:
            reply = read_reply(m.reply_path, ex.max_reply_bytes)
        except ReplyTooLarge as e:
            row.update(status="reply_too_large", error_class="ReplyTooLarge", error_message=str(e))
            return None
        except NotAReply as e:
            row.update(status="no_reply" if status == "ok" else status, error_class="NotAReply", error_message=str(e))
            return None
    if reply is None:
        row.update(status="no_reply" if status == "ok" else status)
        if status == "ok":
            row.update(error_class="NoReply", error_message="the agent left no reply.txt")
        return None
    text, cut = _text(reply, ex.max_reply_text_bytes)
    # The whole reply is kept (reply_text is capped): the audit re-scores from these bytes.
    row.update(status=status, reply_sha256=store_reply(ctx.paths, reply), reply_bytes=len(reply), reply_text=text,
               reply_truncated=cut)
    return reply


def attempt_once(ctx: RunContext, play: Play, task: Task, agent: AgentSpec, sample: int, number: int) -> Attempt:
    """One try, as a row that exists before anything runs and is complete whatever happens."""
    rule = play.manifest.expectations.rules()[agent.name]
    row: dict = dict(run_id=ctx.run_id, phase=play.phase, task_id=task.id, idx=task.idx, task_hash=task.hash,
                     agent=agent.name, role=agent.role, sample=sample, attempt=number, started_at=_now(),
                     status="harness_error", workspace_sha256=workspace_sha256(dict(task.files)),
                     backend=ctx.sandbox.backend, image_digest=play.manifest.execution.image_digest)
    scoring = False
    try:
        reply = _run_agent(ctx, play, task, agent, row)
        scoring = True
        scored = play.taskset.score(task, reply or b"", ctx.paths.scorer_cache)
        row.update(reward=scored.reward, metrics=dict(scored.metrics),
                   as_expected=as_expected(rule, row["status"], scored.reward, play.manifest.expectations.pass_threshold))
    except (SandboxError, ScorerUnavailable) as e:
        row.update(status="infrastructure_error", error_class=type(e).__name__, error_message=str(e)[:2000])
    except EvidenceError:
        raise  # the reply could not be kept: the evidence itself fails, as a journal write does
    except Exception as e:  # noqa: BLE001 - one attempt's trouble stays in that attempt's row
        # The scorer raising on this reply is the environment's fault; anything before it is ours.
        row.update(status="scorer_error" if scoring else "harness_error", error_class=type(e).__name__,
                   error_message=(str(e) if scoring else f"harness: {e}")[:2000])
    row["finished_at"] = _now()
    return Attempt(**row)


def unsupported(ctx: RunContext, task: Task, key: dict, image_digest: str) -> Attempt:
    """The row of an attempt the backend cannot run: the task needs a network-isolated sandbox."""
    return Attempt(**key, task_id=task.id, idx=task.idx, task_hash=task.hash, started_at=_now(), finished_at=_now(),
                   status="unsupported_execution_contract", error_class="NEEDS_CONTAINER",
                   error_message=f"the task needs network isolation and backend {ctx.sandbox.backend} provides none",
                   workspace_sha256=workspace_sha256(dict(task.files)), backend=ctx.sandbox.backend,
                   image_digest=image_digest)


T = TypeVar("T")


def with_retries(ctx: RunContext, infra_retries: int, once: Callable[[int], T], failed: Callable[[T], bool]) -> list[T]:
    """Every try of one unit of work: `once(try_index)` again while `failed(result)` (an
    infrastructure fault), with exponential backoff, at most ``1 + infra_retries`` times;
    each try is kept."""
    tries: list[T] = []
    mult, cap = ctx.backoff_s
    retrying = Retrying(retry=retry_if_result(lambda r: failed(r) and not ctx.stop.is_set()),
                        stop=stop_after_attempt(1 + infra_retries), wait=wait_exponential(multiplier=mult, max=cap),
                        retry_error_callback=lambda state: None)
    for attempt in retrying:
        with attempt:
            result = once(len(tries))
            tries.append(result)
        if not attempt.retry_state.outcome.failed:
            attempt.retry_state.set_result(result)
    return tries


def play_task(ctx: RunContext, play: Play, task: Task, agent: AgentSpec, sample: int, first: int) -> list[Attempt]:
    """Every try of one (task, agent, sample): retried only on infrastructure faults."""
    if task.requires_network_isolation and not ctx.sandbox.isolates_network:
        key = dict(run_id=ctx.run_id, phase=play.phase, agent=agent.name, role=agent.role, sample=sample,
                   attempt=first)
        return [unsupported(ctx, task, key, play.manifest.execution.image_digest)]
    return with_retries(ctx, play.manifest.execution.infra_retries,
                        lambda n: attempt_once(ctx, play, task, agent, sample, first + n),
                        lambda a: a.status == "infrastructure_error")


def pending_keys(done: Iterable[Attempt], phase: str, keys: Iterable[tuple[int, str, int]]) -> list[tuple]:
    """``(idx, agent, sample, next try number)`` of each key with no final attempt recorded in
    `phase` yet (a final attempt is anything but an infrastructure error)."""
    latest: dict[tuple[int, str, int], tuple[int, str]] = {}
    for a in done:
        key = (a.idx, a.agent, a.sample)
        if a.phase == phase and (key not in latest or a.attempt > latest[key][0]):
            latest[key] = (a.attempt, a.status)
    out = []
    for key in keys:
        number, status = latest.get(key, (0, "infrastructure_error"))
        if status == "infrastructure_error":
            out.append((*key, number + 1))
    return out


def pending(done: Iterable[Attempt], play: Play) -> list[tuple[int, AgentSpec, int, int]]:
    """(idx, agent, sample, next try number) still to run: no final attempt recorded yet."""
    specs = {a.name: a for a in play.agents}
    keys = [(idx, a.name, sample) for idx in play.idx for a in play.agents for sample in range(play.samples)]
    return [(idx, specs[name], sample, n) for idx, name, sample, n in pending_keys(done, play.phase, keys)]


def run_pool(ctx: RunContext, todo: list, work: Callable, record: Callable[[list], None], concurrency: int,
             hooks: Hooks | None = None, resume: str = "--resume") -> None:
    """Run `work(item)` for each item of `todo` on `concurrency` threads, `record` each result
    in the order they finish, and hand out the next item only after. On Ctrl-C: stop handing
    out work, kill what runs (`ctx.sandbox.close`), keep what finished, raise `Interrupted`."""
    hooks = hooks or {}
    if "on_plan" in hooks:
        hooks["on_plan"](len(todo))
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="attempt") as pool:
        queue = iter(todo)
        running: dict[Future, object] = {}

        def submit_next() -> None:
            item = next(queue, None)
            if item is not None:
                running[pool.submit(work, item)] = item

        for _ in range(concurrency):
            submit_next()
        try:
            while running:
                done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                for fut in done:
                    running.pop(fut)
                    rows = fut.result()
                    if ctx.stop.is_set():
                        continue  # killed by our own stop: not evidence, rerun on resume
                    record(rows)
                    submit_next()
        except KeyboardInterrupt:
            ctx.stop.set()
            ctx.sandbox.close()
            for fut in running:
                fut.cancel()
            wait(list(running))
            raise Interrupted(f"interrupted: what finished is recorded in {ctx.paths.root}; "
                              f"continue with {resume} {ctx.paths.root}") from None


def execute(ctx: RunContext, journal: Journal, play: Play, concurrency: int = 1, hooks: Hooks | None = None) -> None:
    """Play every pending (task, agent, sample) that applies and journal it (see `run_pool`)."""
    hooks = hooks or {}
    task_of = lru_cache(maxsize=max(8, 4 * concurrency))(play.taskset.task)
    skip = {e.idx: e.skip for e in play.manifest.tasks}
    todo = [item for item in pending(journal, play) if item[1].name not in skip.get(item[0], {})]

    def record(rows: list[Attempt]) -> None:
        journal.append(rows)
        for row in rows:
            if "on_attempt" in hooks:
                hooks["on_attempt"](row)

    run_pool(ctx, todo, lambda item: play_task(ctx, play, task_of(item[0]), item[1], item[2], item[3]), record,
             concurrency, hooks)


def judge(ctx: RunContext, attempts: Iterable[Attempt], phase: str, manifest: Manifest, taskset: Taskset,
          phases: tuple[str, ...], entries: list[TaskEntry] | None = None) -> list[TaskVerdict]:
    """One verdict per task of `entries` (default: `manifest`'s) from all its attempts (sample 0)
    in `phases`, superseded ones included. `attempts` is streamed; small outcomes are kept."""
    outcomes: dict[str, list[Outcome]] = {}
    for a in attempts:
        if a.phase in phases and a.sample == 0:
            outcomes.setdefault(a.task_id, []).append(Outcome.of(a))
    entries = entries if entries is not None else manifest.tasks
    return [verdict_row(ctx.env, ctx.run_id, phase, manifest, e, taskset.task(e.idx), outcomes.get(e.id, []))
            for e in entries]


def verdict_row(env: Environment, run_id: str, phase: str, manifest: Manifest, entry: TaskEntry, task: Task,
                outcomes: list[Outcome]) -> TaskVerdict:
    """One task's verdict row from its attempts' outcomes (the run's and the audit's one way)."""
    exp = manifest.expectations
    findings = env.findings(task)
    d = decide(outcomes, exp.required(entry.skip), exp.rules(), exp.pass_threshold, exp.exception_rule, findings)
    return TaskVerdict(
        run_id=run_id, phase=phase, task_id=entry.id, idx=entry.idx, task_hash=entry.hash,
        family=task.family, meta=dict(task.meta), verdict=d.verdict, reason=d.reason, missing=d.missing,
        detail=d.detail, findings=[FindingRow(**f.model_dump()) for f in findings],
        oracle_reward=d.oracle_reward, max_control_reward=d.max_control_reward,
        max_control_agent=d.max_control_agent, margin=d.margin, retried=d.retried, n_attempts=len(outcomes))
