"""The ``program`` attempt kind: an agent program in a fresh sandbox, its reply scored on the host.

The workspace is materialised in fresh storage, the agent runs in a fresh sandbox, the reply
is read back (size-capped, regular files only), then scored on the host by the environment's
own scorer. A try's result is its row and the reply's bytes (`Tried`): the worker that made it
never writes the run directory (it may run on another node); `keep`, on the driver, stores
each reply whole under its sha256 before the row naming it is journaled. Whatever goes wrong
ends up in the attempt's row: an infrastructure fault (`SandboxError`, a scorer's
`ScorerUnavailable`) as ``infrastructure_error``, the scorer raising on this reply as
``scorer_error``, anything else of ours as ``harness_error``. An agent's own failure (exit code,
timeout, OOM, a missing or odd reply) is data.
"""

from __future__ import annotations

import uuid

from environment.protocol import AgentSpec, ScorerUnavailable, Task, sha256_tag
from validate.agents import source_files
from validate.core.errors import SandboxError
from validate.core.paths import SANDBOX_WORKSPACE
from validate.core.records import Attempt
from validate.evidence.verdicts import as_expected
from validate.kinds.base import ReplyKind, Tried, attempt_key, failed, now, started_row
from validate.run.context import Play, RunContext
from validate.run.workspace import NotAReply, ReplyTooLarge, materialise, read_reply, workspace_sha256
from validate.sandbox import RunRequest
from validate.sandbox.storage import attempt_storage


def _text(data: bytes, cap: int) -> tuple[str, bool]:
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def _run_agent(ctx: RunContext, play: Play, task: Task, agent: AgentSpec, row: dict) -> bytes | None:
    """Materialise, run, read back; fill `row` with what happened; return the reply."""
    ex = play.manifest.execution
    source = source_files(ctx.env) if agent.sees_source else None
    name = f"{task.idx}-{agent.name}-{uuid.uuid4().hex[:8]}"
    make = ctx.storage or (lambda n, lim, gid: attempt_storage(ctx.sandbox.run_label, n, lim, gid=gid))
    with materialise(task, agent, play.manifest.opaque_id(task.id), lambda gid: make(name, ex.limits, gid),
                     source) as m:
        request = RunRequest(argv=tuple(ex.agent_command), mounts=m.mounts, env=m.env,
                             workdir=SANDBOX_WORKSPACE, limits=ex.limits, name=name, user=m.user, tmp=m.tmp)
        result = ctx.sandbox.run(request)
        row.update(runtime_s=result.runtime_s, exit_code=result.exit_code, oom_killed=result.oom_killed,
                   timed_out=result.timed_out, stdout=result.stdout.decode("utf-8", "replace"),
                   stderr=result.stderr.decode("utf-8", "replace"))
        status = ("timeout" if result.timed_out else "oom" if result.oom_killed
                  else "exit_nonzero" if result.exit_code != 0 else "ok")
        try:
            reply = read_reply(m.reply_path, ex.max_reply_bytes)
        except ReplyTooLarge as e:
            row.update(status="reply_too_large", error_class=type(e).__name__, error_message=str(e))
            return None
        except NotAReply as e:
            row.update(status="no_reply" if status == "ok" else status, error_class=type(e).__name__,
                       error_message=str(e))
            return None
    if reply is None:
        row.update(status="no_reply" if status == "ok" else status)
        if status == "ok":
            row.update(error_class="NoReply", error_message="the agent left no reply.txt")
        return None
    text, cut = _text(reply, ex.max_reply_text_bytes)
    # The whole reply is kept (reply_text is capped) by `ProgramKind.keep`: the audit re-scores
    # from these bytes; the tag is the one `store_reply` gives them.
    row.update(status=status, reply_sha256=sha256_tag(reply), reply_bytes=len(reply),
               reply_text=text, reply_truncated=cut)
    return reply


class ProgramKind(ReplyKind):
    name = "program"

    # Narrower than the base's Player: this kind plays only the contract's agent programs.
    def once(self, ctx: RunContext, play: Play, task: Task, agent: AgentSpec,  # type: ignore[override]
             sample: int, number: int) -> Tried:
        """One try, as a row that exists before anything runs and is complete whatever happens."""
        rule = play.manifest.expectations.rules()[agent.name]
        row = started_row(attempt_key(ctx, play, agent.name, agent.role, sample, number), task,
                          workspace_sha256=workspace_sha256(dict(task.files)), backend=ctx.sandbox.backend,
                          image_digest=self.image_digest(play, task))
        scoring, reply = False, None
        try:
            reply = _run_agent(ctx, play, task, agent, row)
            scoring = True
            scored = play.taskset.score(task, reply or b"", ctx.paths.scorer_cache)
            row.update(reward=scored.reward, reward_decimal=scored.exact, metrics=dict(scored.metrics),
                       as_expected=as_expected(rule, row["status"], scored.reward,
                                               play.manifest.expectations.pass_threshold, scored.exact))
        except (SandboxError, ScorerUnavailable) as e:
            failed(row, "infrastructure_error", type(e).__name__, str(e))
        except Exception as e:  # noqa: BLE001 - one attempt's trouble stays in that attempt's row
            # The scorer raising on this reply is the environment's fault; anything before it is ours.
            failed(row, "scorer_error" if scoring else "harness_error", type(e).__name__,
                   str(e) if scoring else f"harness: {e}")
        row["finished_at"] = now()
        attempt = Attempt(**row)
        return Tried(attempt, reply if attempt.reply_sha256 is not None else None)


__all__ = ["ProgramKind", "Tried"]
