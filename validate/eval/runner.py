"""Play the model agent on tasks: one attempt per (phase, task, sample, try), rows first.

Each attempt's `Attempt` row (role ``model``) exists before anything runs. The task's
workspace is materialised in fresh storage, a live sandbox session is started on it, the
conversation is played (`validate.eval.agent.converse`), the session is stopped, and the
final message is scored on the host by the environment's own scorer. The attempt's
`SampleRow` and turns go to the eval journal first, then its row to the attempts journal.

Errors land in the row like the dataset runner's (`validate.runner`): a sandbox that died
of a harness-side cause (`SandboxError`), an endpoint that stayed unavailable through its
retries, a scorer dependency that failed, or an endpoint refusing the key or the model
(401/403/404) → ``infrastructure_error``, retried as a new try; an endpoint refusing a
request the harness built, or any other exception of the harness → ``harness_error``; the
scorer raising on a reply → ``scorer_error``. The model's own failures (no answer, out of
turns, timeout, a reply over max_reply_bytes) are data; so is a sandbox its commands ended
before the deadline (`SandboxEnded`, e.g. ``kill -TERM 1``; termination ``sandbox_ended``):
``exit_nonzero``, the conversation over, what it left scored (cut mid-turn, it has no final
message: scored as empty). Attempt keys are (phase, task, agent, sample, try): the k samples of a task never
collide with infrastructure retries.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

from environment.protocol import ScorerUnavailable, Task
from validate.errors import EvidenceError, SandboxError
from validate.eval import classes
from validate.eval.agent import Conversation, converse, opening
from validate.eval.client import ChatClient, EndpointRejected, EndpointUnavailable
from validate.eval.contract import EvalContract, request_seed
from validate.eval.evidence import Entry, EvalJournal
from validate.eval.metrics import solved
from validate.eval.records import SampleRow, TurnRow
from validate.evidence import Journal, store_reply
from validate.paths import SANDBOX_WORKSPACE
from validate.records import Attempt
from validate.runner import Hooks, RunContext, pending_keys, run_pool, with_retries
from validate.runner import unsupported as unsupported_row
from validate.sandbox import Mount, RunRequest
from validate.sandbox.storage import attempt_storage
from validate.workspace import AGENT_UID, workspace_sha256

MODEL_AGENT = "model"


@dataclass
class EvalContext:
    run: RunContext
    contract: EvalContract
    client: ChatClient
    journal: EvalJournal


@dataclass(frozen=True)
class EvalPlay:
    """One pass: `samples` samples of every task of `idx` at `temperature`."""

    phase: str
    temperature: float
    samples: int
    idx: list[int]


def _now() -> datetime:
    return datetime.now(UTC)


def lay_out(root: Path, task: Task) -> tuple[tuple[Mount, ...], Path]:
    """The task's files in ``root/workspace`` and an empty ``root/tmp``, both owned by the
    sandbox's user: the workspace mount (read-write) and the request's /tmp. The model agent
    gets no /agent directory: its view (prompt and public meta) reaches it as messages."""
    for sub, mode in (("workspace", 0o755), ("tmp", 0o700)):
        (root / sub).mkdir(mode=mode)
        os.chown(root / sub, AGENT_UID, AGENT_UID)
        (root / sub).chmod(mode)
    ws = root / "workspace"
    for name, data in task.files.items():
        (ws / name).write_bytes(data)
        os.chown(ws / name, AGENT_UID, AGENT_UID)
        (ws / name).chmod(0o644)
    return (Mount(source=ws, target=SANDBOX_WORKSPACE, read_only=False),), root / "tmp"


def _status(conv: Conversation, max_reply_bytes: int) -> tuple[str, bytes | None]:
    if conv.termination == "timeout":
        return "timeout", None
    if conv.termination == "sandbox_ended":
        return "exit_nonzero", None
    if conv.reply is None:
        return "no_reply", None
    reply = conv.reply.encode("utf-8", "replace")
    return ("reply_too_large", None) if len(reply) > max_reply_bytes else ("ok", reply)


def _turn_rows(key: dict, conv: Conversation, contract: EvalContract, temperature: float, seed: int) -> list[TurnRow]:
    from validate.eval.agent import cap

    lim = contract.limits
    rows = []
    for i, t in enumerate(conv.turns):
        c = t.completion
        rows.append(TurnRow(**key, turn=i, system=cap(conv.system, lim.stored_message_bytes) if i == 0 else "",
                            user=cap(conv.user, lim.stored_message_bytes) if i == 0 else "",
                            content=None if t.content is None else cap(t.content, lim.stored_message_bytes),
                            content_bytes=len((t.content or "").encode("utf-8", "replace")), tool_calls=t.calls,
                            finish_reason=c.finish_reason, prompt_tokens=c.prompt_tokens,
                            completion_tokens=c.completion_tokens, latency_s=c.latency_s, tries=c.tries,
                            wait_s=c.wait_s, faults=c.faults, temperature=temperature, seed=seed))
    return rows


def _sum(values: list[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else sum(values)


def _converse(ec: EvalContext, task: Task, conv: Conversation, play: EvalPlay, seed: int, row: dict,
              stats: dict) -> None:
    """Materialise, start the session, play, stop: fills `conv`, `row` and `stats`."""
    ctx, contract = ec.run, ec.contract
    limits = ctx.manifest.execution.limits.model_copy(update={"timeout_s": contract.limits.attempt_timeout_s})
    name = f"{task.idx}-model-{play.phase}-{uuid.uuid4().hex[:8]}"
    make = ctx.storage or (lambda n, lim, gid: attempt_storage(ctx.run_id, n, lim, gid=gid))
    with make(name, limits, AGENT_UID) as root:
        mounts, tmp = lay_out(Path(root), task)
        request = RunRequest(argv=(), mounts=mounts, env={"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
                             workdir=SANDBOX_WORKSPACE, limits=limits, name=name, user=f"{AGENT_UID}:{AGENT_UID}",
                             tmp=tmp)
        t0 = time.monotonic()
        session = ctx.sandbox.session(request)
        try:
            session.start()
            stats["sandbox_s"] = time.monotonic() - t0
            converse(ec.client, contract, session, conv, play.temperature, seed, session.deadline)
        finally:
            t1 = time.monotonic()
            session.stop()
            stats["sandbox_s"] = stats.get("sandbox_s", 0.0) + time.monotonic() - t1
    status, reply = _status(conv, ctx.manifest.execution.max_reply_bytes)
    row["status"] = status
    if conv.termination == "sandbox_ended":  # the model's command ended it: over, scored as it stands
        row.update(error_class="SandboxEnded", error_message=conv.turns[-1].calls[-1].error)
    elif status != "ok":
        row.update(error_class=conv.termination, error_message=f"the conversation ended: {conv.termination}"
                   + (f" (reply over {ctx.manifest.execution.max_reply_bytes} bytes)" if status == "reply_too_large"
                      else ""))
    if reply is not None:
        text = reply[: ctx.manifest.execution.max_reply_text_bytes].decode("utf-8", "replace")
        # The whole reply is kept (reply_text is capped): the eval audit re-scores from these bytes.
        row.update(reply_sha256=store_reply(ctx.paths, reply), reply_bytes=len(reply), reply_text=text,
                   reply_truncated=len(reply) > ctx.manifest.execution.max_reply_text_bytes)
    stats["reply"] = reply


def _fault(row: dict, stats: dict, e: Exception) -> None:
    """Record an exception as the attempt's status (see the module docstring)."""
    infra = isinstance(e, SandboxError | ScorerUnavailable | EndpointUnavailable) or \
        (isinstance(e, EndpointRejected) and e.auth)
    if isinstance(e, EndpointUnavailable):
        stats["endpoint_wait_s"] = stats.get("endpoint_wait_s", 0.0) + e.wait_s
        stats["endpoint_tries"] = stats.get("endpoint_tries", 0) + e.tries
        stats["endpoint_faults"] = stats.get("endpoint_faults", 0) + e.tries
    status = "infrastructure_error" if infra else "scorer_error" if stats.get("scoring") else "harness_error"
    row.update(status=status, error_class=type(e).__name__, error_message=str(e)[:2000])


def attempt_once(ec: EvalContext, play: EvalPlay, task: Task, sample: int, number: int) -> tuple[Attempt, Entry]:
    """One try, as rows that exist before anything runs and are complete whatever happens."""
    ctx, contract = ec.run, ec.contract
    key = dict(run_id=ctx.run_id, phase=play.phase, task_id=task.id, idx=task.idx, task_hash=task.hash,
               agent=MODEL_AGENT, sample=sample, attempt=number)
    row: dict = dict(key, role="model", started_at=_now(), status="harness_error",
                     workspace_sha256=workspace_sha256(dict(task.files)), backend=ctx.sandbox.backend,
                     image_digest=ctx.manifest.execution.image_digest)
    seed = request_seed(contract.sampling.seed, task.id, sample)
    conv = opening(contract, task.prompt, dict(task.meta))
    stats: dict = {}
    t0 = time.monotonic()
    try:
        _converse(ec, task, conv, play, seed, row, stats)
        stats["scoring"], t1 = True, time.monotonic()
        scored = ctx.taskset.score(task, stats["reply"] or b"", ctx.paths.scorer_cache)
        stats["score_s"] = time.monotonic() - t1
        row.update(reward=scored.reward, metrics=dict(scored.metrics))
    except EvidenceError:
        raise  # the reply could not be kept: the evidence itself fails, as a journal write does
    except Exception as e:  # noqa: BLE001 - one attempt's trouble stays in that attempt's row
        _fault(row, stats, e)
    row.update(finished_at=_now(), runtime_s=time.monotonic() - t0)
    attempt = Attempt(**row)
    return attempt, Entry(sample=sample_row(key, task, conv, attempt, stats, contract, play.temperature, seed),
                          turns=_turn_rows(key, conv, contract, play.temperature, seed))


def sample_row(key: dict, task: Task, conv: Conversation, a: Attempt, stats: dict, contract: EvalContract,
               temperature: float, seed: int) -> SampleRow:
    calls = [c for t in conv.turns for c in t.calls]
    comps = [t.completion for t in conv.turns]
    s = SampleRow(**key, family=task.family, termination=conv.termination, turns=len(conv.turns),
                  tool_calls=len(calls), malformed_tool_calls=sum(not c.well_formed for c in calls),
                  tool_failures=sum(c.well_formed and (c.exit_code != 0 or c.timed_out or c.oom_killed) for c in calls),
                  tool_timeouts=sum(c.timed_out for c in calls),
                  prompt_tokens=_sum([c.prompt_tokens for c in comps]),
                  completion_tokens=_sum([c.completion_tokens for c in comps]),
                  endpoint_tries=sum(c.tries for c in comps) + stats.get("endpoint_tries", 0),
                  endpoint_faults=sum(len(c.faults) for c in comps) + stats.get("endpoint_faults", 0),
                  model_s=sum(c.latency_s for c in comps),
                  endpoint_wait_s=sum(c.wait_s for c in comps) + stats.get("endpoint_wait_s", 0.0),
                  tool_s=conv.tool_s, sandbox_s=stats.get("sandbox_s", 0.0), score_s=stats.get("score_s", 0.0),
                  wall_s=a.runtime_s or 0.0, temperature=temperature, seed=seed,
                  solved=solved(a.status, a.reward, contract.reward.pass_threshold),
                  parsed=a.metrics.get("parsed_ok"))
    cls, rule = classes.classify(facts_of(a, s))
    return s.model_copy(update={"failure_class": cls, "failure_rule": rule})


def facts_of(a, s: SampleRow) -> classes.Facts:
    """What the failure rules read, from an attempt and its sample row (also used by audit)."""
    reward = None if a.reward is None or a.reward != a.reward else float(a.reward)
    return classes.Facts(status=a.status, reward=reward, solved=s.solved, termination=s.termination, parsed=s.parsed,
                         tool_calls=s.tool_calls, malformed_tool_calls=s.malformed_tool_calls, model_s=s.model_s,
                         tool_s=s.tool_s)


def unsupported(ec: EvalContext, play: EvalPlay, task: Task, sample: int, number: int) -> tuple[Attempt, Entry]:
    ctx = ec.run
    key = dict(run_id=ctx.run_id, phase=play.phase, agent=MODEL_AGENT, role="model", sample=sample, attempt=number)
    a = unsupported_row(ctx, task, key, ctx.manifest.execution.image_digest)
    seed = request_seed(ec.contract.sampling.seed, task.id, sample)
    conv = opening(ec.contract, task.prompt, dict(task.meta))
    row_key = dict(run_id=ctx.run_id, phase=play.phase, task_id=task.id, idx=task.idx, task_hash=task.hash,
                   agent=MODEL_AGENT, sample=sample, attempt=number)
    return a, Entry(sample=sample_row(row_key, task, conv, a, {}, ec.contract, play.temperature, seed), turns=[])


def play_task(ec: EvalContext, play: EvalPlay, task: Task, sample: int, first: int) -> list[tuple[Attempt, Entry]]:
    """Every try of one (task, sample): retried only on infrastructure faults."""
    ctx = ec.run
    if task.requires_network_isolation and not ctx.sandbox.isolates_network:
        return [unsupported(ec, play, task, sample, first)]
    return with_retries(ctx, ctx.manifest.execution.infra_retries,
                        lambda n: attempt_once(ec, play, task, sample, first + n),
                        lambda r: r[0].status == "infrastructure_error")


def pending(done: Iterable[Attempt], play: EvalPlay) -> list[tuple[int, int, int]]:
    """(idx, sample, next try number) with no final attempt yet."""
    keys = [(idx, MODEL_AGENT, sample) for idx in play.idx for sample in range(play.samples)]
    return [(idx, sample, n) for idx, _, sample, n in pending_keys(done, play.phase, keys)]


def execute(ec: EvalContext, journal: Journal, play: EvalPlay, concurrency: int = 1,
            hooks: Hooks | None = None) -> None:
    """Play every pending (task, sample) and journal it (see `validate.runner.run_pool`)."""
    ctx, hooks = ec.run, hooks or {}
    task_of = lru_cache(maxsize=max(8, 4 * concurrency))(ctx.taskset.task)

    def record(results: list[tuple[Attempt, Entry]]) -> None:
        for _, entry in results:
            ec.journal.append(entry)
        journal.append([a for a, _ in results])
        for a, _ in results:
            if "on_attempt" in hooks:
                hooks["on_attempt"](a)

    run_pool(ctx, pending(journal, play), lambda item: play_task(ec, play, task_of(item[0]), item[1], item[2]),
             record, concurrency, hooks, resume="`validate eval run --resume`")
