"""The ``task-shell`` attempt kind: a model works on a task directory through a shell in the
task's live container, then the task's own verifier decides the reward.

It is the model's side of the ``trial`` kind (`validate.kinds.trial`), and reuses it whole
but for the agent phase: the task's image (built once per run against the base-image map),
a container of it with the network off and the task's limits, then — through the seam
`validate.taskdir.trial.run.AgentDriver` — the conversation of `validate.eval.agent.converse`
instead of an agent's command, then every process of it killed, the verifier in the same
container with ``/logs/verifier`` and ``/tests`` made fresh, and the reward read by the harness from
what the verifier wrote (`environment.harbor.reward`). The kept reply is that
`VerifierRecord`, so the eval audit re-reads every reward by Harbor's rule.

The model sees ``instruction.md`` as its user message (the contract's templates) and has one
tool, ``bash``: each call runs as ``timeout -s KILL T bash -c COMMAND`` in the container, as
the task's agent user, in its working directory, with the phase's pinned environment (`ContainerShell`).
The API key stays in the client on the host: nothing but the command crosses into the
container. Its output is cut at the contract's ``max_tool_output_bytes`` before the model
sees it, and at ``stored_tool_output_bytes`` in the trajectory (with the whole message's
size and sha256). The agent phase ends when the model replies without a tool call, runs out
of turns, or the phase's deadline passes: the contract's ``attempt_timeout_s`` or the
task's own agent timeout, whichever is shorter.

Statuses: the conversation's (``ok``; ``timeout`` when the deadline ended it), with the
verifier's reward; a verifier that gave no usable reward, or a task docker refuses (a user
its image lacks), is ``scorer_error`` (the verifier's failing, never the model's); docker or
the endpoint failing the harness is ``infrastructure_error``; a task this profile cannot run
is ``unsupported_execution_contract``. The verifier's exit code and output go into the
sample row (``verifier``), the reward files' bytes into the reply. The attempt row's
``image_digest`` is the image the contract routes the task to (`validate.kinds.trial.routed_digest`:
its frozen task image, else the sandbox image), as a trial's row.
"""

from __future__ import annotations

import time

from docker.errors import APIError

from environment.harbor.reward import VerifierFailed, read_record
from validate.core.errors import EvidenceError, SandboxError
from validate.eval import classes
from validate.eval.agent import Conversation, cap, converse, opening
from validate.kinds.chat import MODEL_AGENT, EvalContext, ModelKind, _fault, _turn_rows, facts_of, sample_row
from validate.eval.contract import SHELL_AGENT, request_seed
from validate.eval.evidence import Entry
from validate.eval.records import SampleRow
from validate.evidence.journal import store_reply
from validate.kinds.base import failed, now, unsupported_row
from validate.kinds.trial import TrialKind, routed_digest
from validate.core.records import MODEL, Attempt
from validate.sandbox.base import ExecResult
from validate.sandbox.docker import wire
from validate.taskdir.trial import docker as dk
from validate.taskdir.trial import network
from validate.contract.manifest import verifier_mode_of
from validate.taskdir.trial.result import PhaseRun, TrialLimits, TrialResult
from validate.taskdir.trial.run import HarnessFault, LiveAgent, run_trial
from validate.run.workspace import workspace_sha256

#: Seconds past a command's own timeout the harness waits for its stream to end.
STREAM_GRACE_S = 5.0
#: Bytes of the verifier's output kept in the sample row.
VERIFIER_BYTES = 16384


class ContainerShell:
    """The model's ``bash`` in a trial's agent container: the `validate.sandbox.session.Session`
    surface `converse` uses (``exec``), over docker exec."""

    def __init__(self, box: LiveAgent) -> None:
        self.box = box

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float = 30.0,
             max_output_bytes: int = 65536) -> ExecResult:
        box, t0 = self.box, time.monotonic()
        limit = max(0.05, timeout_s)
        try:
            eid = box.api.exec_create(box.cid, ["timeout", "-s", "KILL", f"{limit:.3f}", *argv], user=box.user or "",
                                      workdir=box.workdir, environment=dict(sorted(box.env.items())))["Id"]
            sock = box.api.exec_start(eid, socket=True)
        except APIError as e:
            if "unable to find user" in str(e.explanation or e):
                raise dk.TaskFault(f"user {box.user!r} is not in the image ({str(e.explanation or e)[:200]})") from None
            raise dk.fault("exec a model's command", e) from None
        except dk.DOCKER_ERRORS as e:
            raise dk.fault("exec a model's command", e) from None
        out, err, ended = wire.stream_exec(sock, stdin, limit + STREAM_GRACE_S, max_output_bytes)
        info = self._finished(eid, t0 + limit + STREAM_GRACE_S)
        runtime = time.monotonic() - t0
        code = info.get("ExitCode")
        # Timed out by the harness's clock: the command still running, its stream held open by
        # something it left behind, or killed by `timeout` (137) at its time.
        timed_out = bool(info.get("Running") or not ended or (code == 137 and runtime >= limit))
        return ExecResult(exit_code=None if timed_out else code, timed_out=timed_out, stdout=out, stderr=err,
                          runtime_s=runtime)

    def _finished(self, eid: str, until: float) -> dict:
        while True:
            info = dk.call("inspect a model's command", self.box.api.exec_inspect, eid)
            if not info.get("Running") or time.monotonic() >= until:
                return info
            time.sleep(0.01)


def verifier_text(result: TrialResult) -> str:
    """The verifier's exit code and output, as the sample row keeps them."""
    v = result.verifier_run
    text = (f"[verifier exit {v.exit_code}{', timed out' if v.timed_out else ''}{', OOM' if v.oom_killed else ''}]\n"
            f"[files in /logs/verifier: {', '.join(result.verifier_files) or 'none'}]\n"
            f"[stdout]\n{v.stdout}\n[stderr]\n{v.stderr}")
    return cap(text, VERIFIER_BYTES)


class ShellKind(ModelKind, TrialKind):
    """One pass of the model at one temperature on task directories: each try a trial whose
    agent phase is the conversation. Results are (attempt row, eval journal entry), as the
    ``chat`` kind's; its eval plays environments whose own kind is ``trial``."""

    name = "task-shell"
    standalone = False
    #: The dataset attempt kind whose environments this kind evaluates a model on.
    evaluates = "trial"
    #: The agent it plays the model as: a shell in the task's container, then its verifier.
    agent = SHELL_AGENT

    def __init__(self, ec: EvalContext | None = None, temperature: float = 0.0) -> None:
        super().__init__()
        self.ec, self.temperature = ec, temperature

    image_digest = TrialKind.image_digest  # the task's own frozen image, as the dataset's trials

    def once(self, ctx, play, task, agent, sample: int, number: int) -> tuple[Attempt, Entry]:
        ec = self._ec()
        contract = ec.contract
        key = dict(run_id=ctx.run_id, phase=play.phase, task_id=task.id, idx=task.idx, task_hash=task.hash,
                   agent=MODEL_AGENT, sample=sample, attempt=number)
        row: dict = dict(key, role=MODEL, started_at=now(), status="harness_error",
                         workspace_sha256=workspace_sha256({}), backend=ctx.sandbox.backend,
                         image_digest=routed_digest(play.manifest, task.id))
        seed = request_seed(contract.sampling.seed, task.id, sample)
        conv = opening(contract, task.prompt, dict(task.meta))
        stats: dict = {}
        t0 = time.monotonic()
        try:
            image, verifier = self.prepared(ctx, task, row)
            if image is not None:
                self._trial_of(ec, ctx, play, task, image.image_id, conv, seed, row, stats, verifier)
        except EvidenceError:
            raise  # the reply could not be kept: the evidence itself fails
        except SandboxError as e:
            failed(row, "infrastructure_error", type(e).__name__, str(e))
        except Exception as e:  # noqa: BLE001 - one attempt's trouble stays in that attempt's row
            _fault(row, stats, e)
        row.update(finished_at=now(), runtime_s=time.monotonic() - t0)
        attempt = Attempt(**row)
        s = sample_row(key, task, conv, attempt, stats, contract, self.temperature, seed)
        if "verifier" in stats:  # the class rules read it: set before classifying again
            s = sample_row_verified(s, attempt, stats["verifier"])
        return attempt, Entry(sample=s, turns=_turn_rows(key, conv, contract, self.temperature, seed))

    def _trial_of(self, ec: EvalContext, ctx, play, task, image_id: str, conv: Conversation, seed: int, row: dict,
                  stats: dict, verifier: str | None = None) -> None:
        """The trial with the conversation as its agent phase (`verifier`: a separate
        verifier's image); fills `row` and `stats`."""
        contract, lim = ec.contract, play.manifest.execution.limits
        # the dataset contract's verifier mode: a model is graded by a verifier it cannot reach
        # (trusted), unless the contract chose Harbor's shared mode (or predates the choice)
        limits = TrialLimits(cpus=lim.cpus, memory_mb=lim.memory_mb, pids=lim.pids,
                             verifier_mode=verifier_mode_of(play.manifest.execution), storage_mb=lim.storage_mb,
                             storage_inodes=lim.storage_inodes)

        def drive(box: LiveAgent) -> PhaseRun:
            t = time.monotonic()
            deadline = t + min(contract.limits.attempt_timeout_s, box.timeout_s)
            stats["sandbox_s"] = stats.get("sandbox_s", 0.0) + (t - stats["trial_t0"])
            converse(ec.client, contract, ContainerShell(box), conv, self.temperature, seed, deadline)
            stats["agent_end"] = time.monotonic()
            return PhaseRun(exit_code=0, timed_out=conv.termination == "timeout",
                            runtime_s=round(time.monotonic() - t, 3), stdout=cap(conv.reply or "", 65536))

        stats["trial_t0"] = time.monotonic()
        # The dataset's reward-key rule, as validation reads it (the audit's scorer reads the
        # record under it), and the trial's resolver (the model's lookups kept, deciding nothing).
        result = run_trial(ctx.sandbox.client, task.parsed, ctx.taskset.task_dir(task), image_id, MODEL_AGENT,
                           limits, run_label=ctx.run_id, drive=drive, verifier_image=verifier,
                           reward_key=ctx.taskset.config.reward_key, resolver_image=play.manifest.execution.image)
        end = time.monotonic()
        # What the model did not spend (container start, the sweep between phases, verifier) is the sandbox's time.
        stats["sandbox_s"] = stats.get("sandbox_s", 0.0) + (end - stats.get("agent_end", stats["trial_t0"]))
        stats["score_s"] = result.verifier_run.runtime_s
        stats["sandbox_s"] = max(0.0, stats["sandbox_s"] - stats["score_s"])
        self._result(ctx, result, conv, row, stats)

    def _result(self, ctx, result: TrialResult, conv: Conversation, row: dict, stats: dict) -> None:
        """The trial's outcome as the attempt's status, reward and kept reply."""
        rule = ctx.taskset.config.reward_key
        record = None if result.record is None else result.record.model_copy(update={"image": result.image,
                                                                                      "key": rule})
        reply = None if record is None else record.to_bytes()
        if reply is not None:
            row.update(reply_sha256=store_reply(ctx.paths, reply), reply_bytes=len(reply),
                       reply_text=reply[: ctx.manifest.execution.max_reply_text_bytes].decode("utf-8", "replace"))
        row.update(exit_code=0, timed_out=conv.termination == "timeout", oom_killed=result.agent_run.oom_killed,
                   stdout=cap(conv.reply or "", 65536))
        if result.status == "infrastructure_error":
            failed(row, "infrastructure_error", dk.DockerFault.__name__, result.infrastructure_error or "")
            return
        if result.status == "harness_error":  # the harness cannot vouch for the verifier's run
            failed(row, "harness_error", HarnessFault.__name__, result.harness_error or "")
            return
        stats["verifier"] = verifier_text(result)
        looked = network.describe(result.lookups)
        row["stderr"] = f"{looked}\n{stats['verifier']}" if looked else stats["verifier"]
        # a key the trial did not find is the record's rule to apply (`read_record`, below): 'all'
        keyed = result.verifier_error is not None and result.verifier_error.kind == "missing_key"
        if result.status == "task_error" or (result.verifier_error is not None and not keyed):
            what = result.task_error or f"{result.verifier_error.kind}: {result.verifier_error.detail}"
            failed(row, "scorer_error", "VerifierError", what)
            return
        try:
            got = read_record(reply or b"", rule)
        except VerifierFailed as e:  # the record is what the audit reads: it decides
            failed(row, "scorer_error", "VerifierError", str(e))
            return
        status = "timeout" if conv.termination == "timeout" else "oom" if result.agent_run.oom_killed else "ok"
        row.update(status=status, reward=got.reward, reward_decimal=got.exact)
        if status != "ok":
            row.update(error_class=conv.termination or status, error_message=f"the agent phase ended: {status}")



def sample_row_verified(s: SampleRow, attempt: Attempt, verifier: str) -> SampleRow:
    """The sample row with the verifier's output, its failure class read again with it."""
    s = s.model_copy(update={"verifier": verifier})
    cls, rule = classes.classify(facts_of(attempt, s))
    return s.model_copy(update={"failure_class": cls, "failure_rule": rule})
