"""The ``chat`` attempt kind: the model agent converses on a task in a live session, rows first.

Each attempt's `Attempt` row (role ``model``) exists before anything runs. The task's
workspace is materialised in fresh storage, a live sandbox session is started on it, the
conversation is played (`validate.eval.agent.converse`), the session is stopped, and the
final message is scored on the host by the environment's own scorer. The attempt's
`SampleRow` and turns go to the eval journal first, then its row to the attempts journal.

Errors land in the row like the dataset runner's (`validate.run.runner`): a sandbox that died
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

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from environment.protocol import ScorerUnavailable, Task
from validate.core.errors import EvidenceError, SandboxError
from validate.core.paths import SANDBOX_WORKSPACE
from validate.core.records import MODEL, Attempt
from validate.eval import classes
from validate.eval.agent import Conversation, cap, converse, opening
from validate.eval.client import ChatClient, EndpointRejected, EndpointUnavailable
from validate.eval.contract import CHAT_AGENT, EvalContract, request_seed
from validate.eval.evidence import Entry, EvalJournal
from validate.eval.metrics import solved
from validate.eval.records import SampleRow, TurnRow
from validate.evidence.journal import store_reply
from validate.kinds import KINDS
from validate.kinds.base import attempt_key, failed, now, unsupported_row
from validate.run.context import AttemptKind, Play, RunContext
from validate.run.workspace import AGENT_UID, lay_out_workspace, workspace_sha256
from validate.sandbox import Mount, RunRequest
from validate.sandbox.base import SandboxEnded
from validate.sandbox.storage import attempt_storage

MODEL_AGENT = "model"


@dataclass(frozen=True)
class ModelAgent:
    """The evaluated model, as a play's agent: its name and role in the attempt rows."""

    name: str = MODEL_AGENT
    role: str = MODEL


MODEL_PLAYER = ModelAgent()


@dataclass
class EvalContext:
    run: RunContext
    contract: EvalContract
    client: ChatClient
    journal: EvalJournal


def lay_out(root: Path, task: Task) -> tuple[tuple[Mount, ...], Path]:
    """The task's files in ``root/workspace`` and an empty ``root/tmp``, both owned by the
    sandbox's user: the workspace mount (read-write) and the request's /tmp. The model agent
    gets no /agent directory: its view (prompt and public meta) reaches it as messages."""
    ws, tmp = lay_out_workspace(root, task, AGENT_UID)
    return (Mount(source=ws, target=SANDBOX_WORKSPACE, read_only=False),), tmp


def _status(conv: Conversation, max_reply_bytes: int) -> tuple[str, bytes | None]:
    if conv.termination == "timeout":
        return "timeout", None
    if conv.termination == "sandbox_ended":
        return "exit_nonzero", None
    if conv.reply is None:
        return "no_reply", None
    reply = conv.reply.encode("utf-8", "replace")
    return ("reply_too_large", None) if len(reply) > max_reply_bytes else ("ok", reply)


def _turn_rows(key: dict, conv: Conversation, contract: EvalContract, temperature: float,
               seed: int) -> list[TurnRow]:
    lim = contract.limits
    rows = []
    for i, t in enumerate(conv.turns):
        c = t.completion
        rows.append(TurnRow(**key, turn=i, system=cap(conv.system, lim.stored_message_bytes) if i == 0
                            else "", user=cap(conv.user, lim.stored_message_bytes) if i == 0 else "",
                            content=None if t.content is None else cap(t.content, lim.stored_message_bytes),
                            content_bytes=len((t.content or "").encode("utf-8", "replace")),
                            tool_calls=t.calls, finish_reason=c.finish_reason, prompt_tokens=c.prompt_tokens,
                            completion_tokens=c.completion_tokens, latency_s=c.latency_s, tries=c.tries,
                            wait_s=c.wait_s, faults=c.faults, temperature=temperature, seed=seed))
    return rows


def _sum(values: list[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def _converse(ec: EvalContext, task: Task, conv: Conversation, play: Play, temperature: float, seed: int,
              row: dict, stats: dict) -> None:
    """Materialise, start the session, play, stop: fills `conv`, `row` and `stats`."""
    ctx, contract = ec.run, ec.contract
    limits = ctx.manifest.execution.limits.model_copy(update={"timeout_s": contract.limits.attempt_timeout_s})
    name = f"{task.idx}-model-{play.phase}-{uuid.uuid4().hex[:8]}"
    make = ctx.storage or (lambda n, lim, gid: attempt_storage(ctx.sandbox.run_label, n, lim, gid=gid))
    with make(name, limits, AGENT_UID) as root:
        mounts, tmp = lay_out(Path(root), task)
        request = RunRequest(argv=(), mounts=mounts, env={"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
                             workdir=SANDBOX_WORKSPACE, limits=limits, name=name,
                             user=f"{AGENT_UID}:{AGENT_UID}", tmp=tmp)
        t0 = time.monotonic()
        session = ctx.sandbox.session(request)
        try:
            session.start()
            stats["sandbox_s"] = time.monotonic() - t0
            converse(ec.client, contract, session, conv, temperature, seed, session.deadline)
        finally:
            t1 = time.monotonic()
            session.stop()
            stats["sandbox_s"] = stats.get("sandbox_s", 0.0) + time.monotonic() - t1
    status, reply = _status(conv, ctx.manifest.execution.max_reply_bytes)
    row["status"] = status
    if conv.termination == "sandbox_ended":  # the model's command ended it: over, scored as it stands
        row.update(error_class=SandboxEnded.__name__, error_message=conv.turns[-1].calls[-1].error)
    elif status != "ok":
        row.update(error_class=conv.termination, error_message=f"the conversation ended: {conv.termination}"
                   + (f" (reply over {ctx.manifest.execution.max_reply_bytes} bytes)"
                      if status == "reply_too_large"
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
    failed(row, status, type(e).__name__, str(e))


def attempt_once(ec: EvalContext, play: Play, temperature: float, task: Task, sample: int,
                 number: int) -> tuple[Attempt, Entry]:
    """One try, as rows that exist before anything runs and are complete whatever happens."""
    ctx, contract = ec.run, ec.contract
    key = dict(run_id=ctx.run_id, phase=play.phase, task_id=task.id, idx=task.idx, task_hash=task.hash,
               agent=MODEL_AGENT, sample=sample, attempt=number)
    row: dict = dict(key, role=MODEL, started_at=now(), status="harness_error",
                     workspace_sha256=workspace_sha256(dict(task.files)), backend=ctx.sandbox.backend,
                     image_digest=ctx.manifest.execution.image_digest)
    seed = request_seed(contract.sampling.seed, task.id, sample)
    conv = opening(contract, task.prompt, dict(task.meta))
    stats: dict = {}
    t0 = time.monotonic()
    try:
        _converse(ec, task, conv, play, temperature, seed, row, stats)
        stats["scoring"], t1 = True, time.monotonic()
        scored = ctx.taskset.score(task, stats["reply"] or b"", ctx.paths.scorer_cache)
        stats["score_s"] = time.monotonic() - t1
        row.update(reward=scored.reward, reward_decimal=scored.exact, metrics=dict(scored.metrics))
    except EvidenceError:
        raise  # the reply could not be kept: the evidence itself fails, as a journal write does
    except Exception as e:  # noqa: BLE001 - one attempt's trouble stays in that attempt's row
        _fault(row, stats, e)
    row.update(finished_at=now(), runtime_s=time.monotonic() - t0)
    attempt = Attempt(**row)
    return attempt, Entry(sample=sample_row(key, task, conv, attempt, stats, contract, temperature, seed,
                                            getattr(ec.run.taskset, "parse_metric", None)),
                          turns=_turn_rows(key, conv, contract, temperature, seed))


def sample_row(key: dict, task: Task, conv: Conversation, a: Attempt, stats: dict, contract: EvalContract,
               temperature: float, seed: int, parse_metric: str | None = None) -> SampleRow:
    """The sample's row; `parse_metric`: the metric the taskset declares says whether the reply
    parsed (its ``parse_metric``; None: it has none), which the failure rules read."""
    calls = [c for t in conv.turns for c in t.calls]
    comps = [t.completion for t in conv.turns]
    s = SampleRow(**key, family=task.family, termination=conv.termination, turns=len(conv.turns),
                  tool_calls=len(calls), malformed_tool_calls=sum(not c.well_formed for c in calls),
                  tool_failures=sum(c.well_formed and (c.exit_code != 0 or c.timed_out or c.oom_killed)
                                    for c in calls),
                  tool_timeouts=sum(c.timed_out for c in calls),
                  prompt_tokens=_sum([c.prompt_tokens for c in comps]),
                  completion_tokens=_sum([c.completion_tokens for c in comps]),
                  endpoint_tries=sum(c.tries for c in comps) + stats.get("endpoint_tries", 0),
                  endpoint_faults=sum(len(c.faults) for c in comps) + stats.get("endpoint_faults", 0),
                  model_s=sum(c.latency_s for c in comps),
                  endpoint_wait_s=sum(c.wait_s for c in comps) + stats.get("endpoint_wait_s", 0.0),
                  tool_s=conv.tool_s, sandbox_s=stats.get("sandbox_s", 0.0),
                  score_s=stats.get("score_s", 0.0), wall_s=a.runtime_s or 0.0, temperature=temperature,
                  seed=seed, solved=solved(a.status, a.reward, contract.reward.pass_threshold,
                                           a.reward_decimal),
                  parsed=a.metrics.get(parse_metric) if parse_metric else None)
    cls, rule = classes.classify(facts_of(a, s))
    return s.model_copy(update={"failure_class": cls, "failure_rule": rule})


def facts_of(a, s: SampleRow) -> classes.Facts:
    """What the failure rules read, from an attempt and its sample row (also used by audit)."""
    reward = None if a.reward is None or a.reward != a.reward else float(a.reward)
    return classes.Facts(status=a.status, reward=reward, solved=s.solved, termination=s.termination,
                         parsed=s.parsed, tool_calls=s.tool_calls,
                         malformed_tool_calls=s.malformed_tool_calls, model_s=s.model_s, tool_s=s.tool_s,
                         verified=s.verifier is not None)


class ModelKind:
    """What the kinds that play a model share (this module's and `validate.kinds.task_shell`'s):
    made with the eval's context and a temperature; results are (attempt row, eval journal
    entry), the entry (sample row and turns) kept before the attempt row is journaled; a try
    the backend cannot make has both. A kind says the image digest its rows name."""

    name: ClassVar[str]
    ec: EvalContext | None
    temperature: float

    def _ec(self) -> EvalContext:
        if self.ec is None:
            raise TypeError(f"the {self.name} kind plays with an eval context: "
                            f"{type(self).__name__}(ec, temperature)")
        return self.ec

    def image_digest(self, play: Play, task: Task) -> str:
        raise NotImplementedError

    def unsupported(self, ctx: RunContext, play: Play, task: Task, agent, sample: int,
                    number: int) -> tuple[Attempt, Entry]:
        ec = self._ec()
        a = unsupported_row(ctx, task, attempt_key(ctx, play, MODEL_AGENT, MODEL, sample, number),
                            self.image_digest(play, task))
        seed = request_seed(ec.contract.sampling.seed, task.id, sample)
        conv = opening(ec.contract, task.prompt, dict(task.meta))
        row_key = dict(run_id=ctx.run_id, phase=play.phase, task_id=task.id, idx=task.idx,
                       task_hash=task.hash, agent=MODEL_AGENT, sample=sample, attempt=number)
        return a, Entry(sample=sample_row(row_key, task, conv, a, {}, ec.contract, self.temperature, seed),
                        turns=[])

    def row(self, result: tuple[Attempt, Entry]) -> Attempt:
        return result[0]

    def keep(self, ctx: RunContext, results: list[tuple[Attempt, Entry]]) -> None:
        for _, entry in results:  # a model's replies were stored as each attempt ended
            self._ec().journal.append([entry])


class ChatKind(ModelKind, AttemptKind[tuple[Attempt, Entry]]):
    """One pass of the model at one temperature: each try a conversation in a live session.
    Its results are (attempt row, eval journal entry); the entry (sample row and turns) is
    kept before the attempt row is journaled."""

    name = "chat"
    standalone = False
    #: The agent it plays the model as: a conversation with a bash tool, scored on the host.
    agent = CHAT_AGENT

    def __init__(self, ec: EvalContext | None = None, temperature: float = 0.0) -> None:
        # Registered by name like every kind; a usable one is made with the eval's context.
        self.ec, self.temperature = ec, temperature

    def image_digest(self, play: Play, task: Task) -> str:
        """The contract's sandbox image: the conversation's live session runs in it."""
        return play.manifest.execution.image_digest

    def once(self, ctx: RunContext, play: Play, task: Task, agent, sample: int,
             number: int) -> tuple[Attempt, Entry]:
        return attempt_once(self._ec(), play, self.temperature, task, sample, number)



def model_kind_class(attempt_kind: str) -> type[AttemptKind]:
    """The kind that plays a model on environments played by `attempt_kind`: the registered
    kind that declares it ``evaluates`` it (task directories, ``trial``:
    `validate.kinds.task_shell`), else this module's conversation scored on the host."""
    for name in KINDS.names():
        cls = KINDS.load(name)
        if cls.evaluates == attempt_kind:
            return cls
    return ChatKind


def model_kind(ec: EvalContext, temperature: float) -> AttemptKind:
    """The kind that plays the model on this environment (`model_kind_class`), made."""
    return model_kind_class(ec.run.env.attempt_kind)(ec, temperature)  # type: ignore[call-arg]


def model_play(ec: EvalContext, phase: str, temperature: float, samples: int, idx: list[int]) -> Play:
    """One pass: `samples` samples of every task of `idx` at `temperature`."""
    ctx = ec.run
    return Play(phase, ctx.manifest, ctx.taskset, idx, [MODEL_PLAYER], model_kind(ec, temperature), samples,
                skips=False)
