"""Play agents on tasks through a sandbox; record every attempt; give every task a verdict.

For each (task, agent): materialise the workspace in a fresh temp dir, run the agent in a
fresh sandbox with a timeout, read the reply back (size-capped, symlinks refused), score it
on the host with the environment's own scorer, and append the attempt to the journal.
Infrastructure faults (`SandboxError`) are retried with backoff, each try recorded as its
own attempt; an agent's own failure (exit code, timeout, OOM) never is.

Resuming is not a mode: the runner always skips (phase, task, agent) pairs whose latest
recorded attempt is final (anything but an infrastructure error); a fresh run directory
simply has none.
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from validate.agents import AgentSpec
from validate.contract import Manifest
from validate.errors import SandboxError, ValidateError
from validate.evidence import Journal, finalize, open_run
from validate.findings import task_findings
from validate.paths import RunPaths, SANDBOX_AGENT, SANDBOX_WORKSPACE
from validate.records import Attempt, TaskVerdict
from validate.sandbox import RunRequest, Sandbox
from validate.verdicts import Outcome, decide, outcome_as_expected
from validate.workspace import ReplyTooLarge, materialise, read_reply, workspace_sha256


#: How every agent starts, on every backend. `-S` skips `site`: the agents are stdlib programs,
#: and site's path set-up cost ~3 ms of CPU per attempt, ~9 % of a bwrap pool's wall time.
AGENT_ARGV = ("python3", "-S", f"{SANDBOX_AGENT}/agent.py")


class Interrupted(ValidateError):
    """The run was stopped (Ctrl-C); what finished is recorded, `--resume` continues."""


@dataclass
class RunContext:
    manifest: Manifest
    sandbox: Sandbox
    taskset: object
    paths: RunPaths
    run_id: str
    phase: str
    image_digest: str
    work_dir: Path | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    #: Seconds to wait between infrastructure retries: (multiplier, max) of an exponential backoff.
    backoff_s: tuple[float, float] = (1.0, 10.0)


def _now() -> datetime:
    return datetime.now(UTC)


def _base(ctx: RunContext, task, agent: AgentSpec, number: int) -> dict:
    return dict(run_id=ctx.run_id, phase=ctx.phase, task_id=task.id, idx=task.idx, task_hash=task.hash,
                agent=agent.name, expect=agent.expect, attempt=number, started_at=_now(),
                workspace_sha256=workspace_sha256(task.files), backend=ctx.sandbox.backend,
                image_digest=ctx.image_digest)


def _score(ctx: RunContext, task, agent: AgentSpec, reply: bytes | None, status: str) -> dict:
    try:
        scored = ctx.taskset.score(task, reply or b"")
    except Exception as e:  # noqa: BLE001 - the scorer raising is evidence, not a crash
        return dict(status="scorer_error", error_class=type(e).__name__, error_message=str(e)[:2000])
    exp = ctx.manifest.expectations
    return dict(status=status, reward=scored.reward, metrics=dict(scored.metrics),
                as_expected=outcome_as_expected(agent.name, status, scored.reward, exp, agent.expect))


def _one_try(ctx: RunContext, task, agent: AgentSpec, number: int) -> Attempt:
    """Run one try; raise `SandboxError` (with the attempt attached) on an infrastructure fault."""
    base = _base(ctx, task, agent, number)
    ex = ctx.manifest.execution
    with materialise(task, agent, ctx.work_dir) as m:
        request = RunRequest(argv=AGENT_ARGV, mounts=m.mounts, env=m.env,
                             workdir=SANDBOX_WORKSPACE, limits=ex.limits,
                             name=f"{task.idx}-{agent.name}-{number}-{uuid.uuid4().hex[:8]}")
        try:
            result = ctx.sandbox.run(request)
        except SandboxError as e:
            e.attempt = Attempt(**base, status="infrastructure_error", error_class=type(e).__name__,
                                error_message=str(e)[:2000], finished_at=_now())
            raise
        status = ("timeout" if result.timed_out else "oom" if result.oom_killed
                  else "exit_nonzero" if result.exit_code != 0 else "ok")
        reply = None
        try:
            reply = read_reply(m.reply_path, ex.max_reply_bytes)
        except ReplyTooLarge:
            status = "reply_too_large"
        except OSError as e:
            status = "exit_nonzero" if status == "ok" else status
            base.update(error_class=type(e).__name__, error_message=f"reading the reply: {e}")
    scored = _score(ctx, task, agent, reply, status)
    return Attempt(**base, **scored, finished_at=_now(), runtime_s=result.runtime_s,
                   reply_sha256=None if reply is None else "sha256:" + hashlib.sha256(reply).hexdigest(),
                   reply_bytes=None if reply is None else len(reply),
                   exit_code=result.exit_code, oom_killed=result.oom_killed, timed_out=result.timed_out,
                   stdout=result.stdout.decode("utf-8", "replace"), stderr=result.stderr.decode("utf-8", "replace"))


def play(ctx: RunContext, task, agent: AgentSpec, first_number: int) -> list[Attempt]:
    """Every try of one (task, agent): retried only on infrastructure faults, each try recorded."""
    if task.requires_network_isolation and not ctx.sandbox.isolates_network:
        return [Attempt(**_base(ctx, task, agent, first_number), status="unsupported_execution_contract",
                        error_class="NEEDS_CONTAINER", finished_at=_now(),
                        error_message=f"the task needs network isolation (network_allow=[]) and backend "
                                      f"{ctx.sandbox.backend} provides none")]
    tries: list[Attempt] = []
    mult, cap = ctx.backoff_s
    retrying = Retrying(retry=retry_if_exception_type(SandboxError), reraise=True,
                        stop=stop_after_attempt(1 + ctx.manifest.execution.infra_retries),
                        wait=wait_exponential(multiplier=mult, max=cap))
    try:
        for attempt in retrying:
            with attempt:
                if ctx.stop.is_set():
                    break
                try:
                    tries.append(_one_try(ctx, task, agent, first_number + len(tries)))
                except SandboxError as e:
                    tries.append(e.attempt)
                    raise
    except SandboxError:
        pass  # the last try is recorded as an infrastructure_error
    return tries


def pending(done: Iterable[Attempt], phase: str, idx_list: list[int],
            agents: list[AgentSpec]) -> list[tuple[int, AgentSpec, int]]:
    """(idx, agent, next attempt number) still to run: no final attempt recorded yet."""
    latest: dict[tuple[int, str], tuple[int, str]] = {}
    for a in done:
        key = (a.idx, a.agent)
        if a.phase == phase and (key not in latest or a.attempt > latest[key][0]):
            latest[key] = (a.attempt, a.status)
    out = []
    for idx in idx_list:
        for agent in agents:
            number, status = latest.get((idx, agent.name), (0, "infrastructure_error"))
            if status == "infrastructure_error":
                out.append((idx, agent, number + 1))
    return out


def judge(ctx: RunContext, attempts: Iterable[Attempt], agents: list[AgentSpec],
          entries: list | None = None, phases: list[str] | None = None) -> list[TaskVerdict]:
    """One verdict per task of `entries` (default: the manifest's), from each agent's final
    attempt over `phases` (default: this phase; a later phase in the list wins). `attempts`
    is streamed (superseded flags set); only the final attempts are kept, without their logs."""
    phases = phases or [ctx.phase]
    rank = {p: i for i, p in enumerate(phases)}
    final: dict[tuple[int, str], Attempt] = {}
    counts: dict[int, int] = {}
    for a in attempts:
        if a.phase not in rank:
            continue
        counts[a.idx] = counts.get(a.idx, 0) + 1
        key = (a.idx, a.agent)
        if not a.superseded and (key not in final or rank[a.phase] >= rank[final[key].phase]):
            final[key] = Outcome.of(a)
    names = [a.name for a in agents]
    out = []
    for entry in entries if entries is not None else ctx.manifest.tasks:
        task = ctx.taskset.task(entry.idx)
        mine = [final[(entry.idx, n)] for n in names if (entry.idx, n) in final]
        reason, detail = decide(mine, names, ctx.manifest.expectations, task_findings(task))
        controls = [a for a in mine if a.agent != "oracle" and a.reward is not None]
        top = max(controls, key=lambda a: (a.reward, a.agent), default=None)
        oracle = next((a for a in mine if a.agent == "oracle"), None)
        out.append(TaskVerdict(run_id=ctx.run_id, phase=phases[-1], task_id=task.id, idx=task.idx,
                               task_hash=task.hash, n_papers=task.n_papers, n_units=task.n_labels,
                               paper_ids=list(task.paper_ids), anchor_source=task.paper_ids[0].split(":")[0],
                               compatible=reason is None,
                               reason=reason, detail=detail, oracle_reward=oracle.reward if oracle else None,
                               max_control_reward=top.reward if top else None,
                               max_control_agent=top.agent if top else None, n_attempts=counts.get(task.idx, 0)))
    return out


def execute(ctx: RunContext, journal: Journal, idx_list: list[int], agents: list[AgentSpec],
            concurrency: int = 1, on_attempt: Callable[[Attempt], None] | None = None,
            on_plan: Callable[[int], None] | None = None) -> None:
    """Play every pending (idx, agent) and journal it. On Ctrl-C: stop handing out work, kill
    what runs, keep what finished, and raise `Interrupted`."""
    todo = pending(journal, ctx.phase, idx_list, agents)
    if on_plan:
        on_plan(len(todo))
    task_of = lru_cache(maxsize=max(8, 4 * concurrency))(ctx.taskset.task)
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="attempt") as pool:
        queue = iter(todo)
        running: dict[Future, tuple] = {}

        def submit_next() -> None:
            item = next(queue, None)
            if item is not None:
                idx, agent, number = item
                running[pool.submit(play, ctx, task_of(idx), agent, number)] = item

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
                    journal.append(rows)
                    for row in rows:
                        if on_attempt:
                            on_attempt(row)
                    submit_next()
        except KeyboardInterrupt:
            ctx.stop.set()
            ctx.sandbox.close()
            for fut in running:
                fut.cancel()
            wait(list(running))
            raise Interrupted(f"interrupted: what finished is recorded in {ctx.paths.root}; "
                              f"continue with --resume {ctx.paths.root}") from None


def machine() -> dict:
    """The facts a scoped claim names: OS, kernel, architecture, cores, memory (no host name)."""
    facts = {"system": platform.system(), "kernel": platform.release(), "architecture": platform.machine(),
             "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        facts["os"] = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except OSError:
        facts["os"] = ""
    try:
        facts["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        facts["memory_gib"] = None
    return facts


def summary(ctx: RunContext, verdicts: list[TaskVerdict], **extra) -> dict:
    return {
        "run_id": ctx.run_id, "phase": ctx.phase, "manifest_sha256": ctx.manifest.sha256,
        "backend": ctx.sandbox.backend, "backend_version": ctx.manifest.execution.backend_version,
        "image": ctx.manifest.execution.image, "image_digest": ctx.image_digest, "machine": machine(),
        "tasks": len(verdicts), "compatible": sum(v.compatible for v in verdicts),
        "finished_at": _now().isoformat(), **extra,
    }


def run(ctx: RunContext, agents: list[AgentSpec], concurrency: int = 1,
        on_attempt: Callable[[Attempt], None] | None = None,
        on_plan: Callable[[int], None] | None = None) -> tuple[dict, list[TaskVerdict]]:
    """One phase: play every pending (task, agent) of the manifest, judge, finalize the
    evidence (even when interrupted). Returns the run summary and the verdicts; the attempts
    are in the run directory (`validate.evidence.read_attempts`)."""
    open_run(ctx.paths, ctx.manifest.to_json())
    journal = Journal(ctx.paths, ctx.taskset.metric_names)
    interrupted = False
    try:
        execute(ctx, journal, ctx.manifest.selection.idx, agents, concurrency, on_attempt, on_plan)
    except Interrupted:
        interrupted = True
        raise
    finally:
        task_verdicts = judge(ctx, journal.marked(), agents)
        written = finalize(journal, task_verdicts, summary(ctx, task_verdicts, interrupted=interrupted))
    return written, task_verdicts
