"""An attempt kind that lives in tests/ (one module, one entry point, no edit under validate/):
the agent runs in a live session, then a verifier runs **inside the same sandbox after the
agent** and prints the reward, which the harness reads from the verifier's own output — the
shape of every Harbor/Terminal-Bench-style task, whose verdict comes from tests run in the
task's container. `ToyInSandbox` is the toy environment whose tasks are played this way.

The verifier recomputes the toy scorer's rule from the workspace (exact sum 1.0, off by
one 0.5, else 0), so the audit, which re-scores every kept reply on the host, agrees with it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from environment.protocol import AgentSpec, Task
from tests.toyenv import ToyEnvironment
from validate.core.errors import SandboxError
from validate.core.paths import SANDBOX_WORKSPACE
from validate.core.records import Attempt
from validate.evidence.journal import store_reply
from validate.evidence.verdicts import as_expected
from validate.kinds.base import unsupported_row
from validate.run.context import AttemptKind, Play, RunContext
from validate.run.workspace import materialise, read_reply, workspace_sha256
from validate.sandbox import RunRequest
from validate.sandbox.storage import attempt_storage

VERIFY = """
import pathlib
ws = pathlib.Path('/workspace')
total = sum(int(x) for x in (ws / 'numbers.txt').read_text().split())
try:
    got = int((ws / 'reply.txt').read_text().strip())
except (OSError, ValueError):
    print(0.0)
else:
    print(1.0 if got == total else 0.5 if abs(got - total) == 1 else 0.0)
"""


class InSandboxKind(AttemptKind[Attempt]):
    name = "toy-insandbox"

    def once(self, ctx: RunContext, play: Play, task: Task, agent: AgentSpec, sample: int,
             number: int) -> Attempt:
        ex = play.manifest.execution
        now = datetime.now(UTC)
        row: dict = dict(run_id=ctx.run_id, phase=play.phase, task_id=task.id, idx=task.idx,
                         task_hash=task.hash, agent=agent.name, role=agent.role, sample=sample,
                         attempt=number, started_at=now, status="harness_error",
                         workspace_sha256=workspace_sha256(dict(task.files)), backend=ctx.sandbox.backend,
                         image_digest=ex.image_digest)
        name = f"{task.idx}-{agent.name}-{uuid.uuid4().hex[:8]}"
        try:
            with materialise(task, agent, play.manifest.opaque_id(task.id),
                             lambda gid: attempt_storage(ctx.run_id, name, ex.limits, gid=gid)) as m:
                request = RunRequest(argv=tuple(ex.agent_command), mounts=m.mounts, env=m.env,
                                     workdir=SANDBOX_WORKSPACE, limits=ex.limits, name=name, user=m.user,
                                     tmp=m.tmp)
                with ctx.sandbox.session(request) as session:
                    ran = session.exec(request.argv)
                    verdict = session.exec(["python3", "-c", VERIFY], timeout_s=30)
                reply = read_reply(m.reply_path, ex.max_reply_bytes)
            row.update(exit_code=ran.exit_code, timed_out=ran.timed_out, runtime_s=ran.runtime_s,
                       stdout=ran.stdout.decode("utf-8", "replace"),
                       stderr=ran.stderr.decode("utf-8", "replace"),
                       status="timeout" if ran.timed_out else "exit_nonzero" if ran.exit_code else "ok")
            if reply is not None:
                row.update(reply_sha256=store_reply(ctx.paths, reply), reply_bytes=len(reply),
                           reply_text=reply[: ex.max_reply_text_bytes].decode("utf-8", "replace"),
                           reply_truncated=len(reply) > ex.max_reply_text_bytes)
            elif row["status"] == "ok":
                row.update(status="no_reply", error_class="NoReply",
                           error_message="the agent left no reply.txt")
            reward = float(verdict.stdout.decode().strip())
            row.update(reward=reward, metrics={"exact": float(reward == 1.0)},
                       as_expected=as_expected(play.manifest.expectations.rules()[agent.name], row["status"],
                                               reward, play.manifest.expectations.pass_threshold))
        except SandboxError as e:
            row.update(status="infrastructure_error", error_class=type(e).__name__,
                       error_message=str(e)[:2000])
        row["finished_at"] = datetime.now(UTC)
        return Attempt(**row)

    def unsupported(self, ctx: RunContext, play: Play, task: Task, agent: AgentSpec, sample: int,
                    number: int) -> Attempt:
        key = dict(run_id=ctx.run_id, phase=play.phase, agent=agent.name, role=agent.role, sample=sample,
                   attempt=number)
        return unsupported_row(ctx, task, key, play.manifest.execution.image_digest)


class ToyInSandbox(ToyEnvironment):
    """The toy environment, its tasks played by the in-sandbox verifier kind."""

    name = "toy-insandbox"
    attempt_kind = "toy-insandbox"
