"""The ``trial`` attempt kind: a task directory's own image, the agent in it, then the task's
own verifier inside a fresh container of what the agent left (`validate.trial`).

Per task, once per run: the task's image is built from its ``environment/`` against the
profile's base-image map (`validate.taskimage`; cached by content across runs, the bases
built on first use into the image store's ``task-images/``). A task the profile cannot run —
several steps, a separate verifier container, a compose environment, a prebuilt image to
pull, a GPU, a base the map does not serve — is ``unsupported_execution_contract`` with its
reason, never played. A build that fails otherwise is the task's error (``scorer_error``,
which the verdict reads as ``invalid_task_or_verifier``), with the log's tail.

One try is one trial. Its row: the agent's status (``ok``, ``timeout``, ``oom``: the agent's
exit code is data, as Harbor ignores it: ``exit_nonzero`` still carries its reward), the
reward the verifier wrote under the contract's key, the agent's output and the verifier's. A verifier that gave no usable reward (missing, unparsable, out of range,
hung) is ``scorer_error``, never a pass and never a 0 blamed on the agent; a docker fault,
known from docker's own answers, is ``infrastructure_error`` (retried). The reply kept for
the attempt is the harness's `VerifierRecord` of the reward files' bytes and the task image's
id, from which the audit reads the reward again by the same rule. (The task images are not
frozen in the contract yet: the row's ``image_digest`` is the contract's sandbox image.)
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from environment.harbor.env import HarborTaskRef
from environment.protocol import sha256_tag
from environment.harbor.reward import VerifierFailed, score_record
from environment.harbor.taskdir import HarborTask
from validate.context import AttemptKind, Play, RunContext
from validate.errors import SandboxError
from validate.kinds.program import Tried, keep_replies, unsupported_row
from validate.paths import task_image_store
from validate.records import Attempt
from validate.taskimage.bases import build_base_map
from validate.taskimage.basemap import BaseImageMap
from validate.taskimage.build import TaskImage, TaskImageRefusal, build_task_image
from validate.taskimage.docker import DockerImages
from validate.trial.result import TrialLimits, TrialResult
from validate.trial.run import run_trial
from validate.verdicts import as_expected
from validate.workspace import workspace_sha256

#: The trial's statuses as attempt statuses (the rest: the verifier's or the task's error).
STATUS = {"ok": "ok", "agent_timeout": "timeout", "agent_oom": "oom", "infrastructure_error": "infrastructure_error"}


def _now() -> datetime:
    return datetime.now(UTC)


def unsupported(task: HarborTask, backend: str) -> str | None:
    """Why this profile cannot run `task`, or None."""
    if backend != "docker":
        return f"task-directory trials run on the docker backend only; this contract's is {backend}"
    if task.steps:
        return f"a multi-step task ({len(task.steps)} steps): this harness runs one agent phase per trial"
    if task.verifier == "separate":
        return "a separate verifier environment: this harness verifies in the agent's own container"
    if task.environment == "compose":
        return "environment/docker-compose.yaml: this harness runs one image per task"
    if task.environment == "image":
        return f"a prebuilt image ({task.docker_image}) cannot be pulled on this profile"
    gpus = task.config.environment.gpus or 0
    if gpus > 0:
        types = ", ".join(task.config.environment.gpu_types or []) or "any type"
        return f"the task asks for {gpus} GPU(s) ({types}); this profile has none"
    return None


class TrialKind(AttemptKind[Tried]):
    name = "trial"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._task_locks: dict[int, threading.Lock] = {}
        self._images: dict[int, TaskImage | TaskImageRefusal] = {}
        self._bases: BaseImageMap | None = None
        self._builder: DockerImages | None = None

    def _image(self, ctx: RunContext, task: HarborTaskRef) -> TaskImage | TaskImageRefusal:
        """The task's image, built once per run (and cached by content across runs)."""
        with self._lock:
            lock = self._task_locks.setdefault(task.idx, threading.Lock())
        with lock:
            if task.idx not in self._images:
                builder, bases = self._base_map()
                config = task.parsed.config.environment
                self._images[task.idx] = build_task_image(ctx.taskset.task_dir(task), bases, builder,
                                                          task_image_store(), build_timeout_s=config.build_timeout_sec)
            return self._images[task.idx]

    def _base_map(self) -> tuple[DockerImages, BaseImageMap]:
        with self._lock:
            if self._bases is None:
                self._builder = DockerImages()
                self._bases = build_base_map(self._builder, task_image_store() / "bases", log=lambda m: None)
            return self._builder, self._bases

    def once(self, ctx: RunContext, play: Play, task: HarborTaskRef, agent, sample: int, number: int) -> Tried:
        m = play.manifest
        row: dict = dict(run_id=ctx.run_id, phase=play.phase, task_id=task.id, idx=task.idx, task_hash=task.hash,
                         agent=agent.name, role=agent.role, sample=sample, attempt=number, started_at=_now(),
                         status="harness_error", workspace_sha256=workspace_sha256({}), backend=ctx.sandbox.backend,
                         image_digest=m.execution.image_digest)
        reply = None
        try:
            why = unsupported(task.parsed, ctx.sandbox.backend) if task.parsed is not None else "the task did not load"
            image = None if why else self._image(ctx, task)
            if isinstance(image, TaskImageRefusal) and image.reason == "unsupported_execution_contract":
                why = image.detail
            if why:
                row.update(status="unsupported_execution_contract", error_class="UNSUPPORTED_TASK", error_message=why)
            elif isinstance(image, TaskImageRefusal):
                row.update(status="scorer_error", error_class="BuildFailed",
                           error_message=f"{image.detail}\n{image.log_tail or ''}"[:2000])
            else:
                reply = self._trial(ctx, play, task, agent, image, row)
        except SandboxError as e:
            row.update(status="infrastructure_error", error_class=type(e).__name__, error_message=str(e)[:2000])
        except Exception as e:  # noqa: BLE001 - one attempt's trouble stays in that attempt's row
            row.update(status="harness_error", error_class=type(e).__name__, error_message=f"harness: {e}"[:2000])
        row["finished_at"] = _now()
        return Tried(Attempt(**row), reply)

    def _trial(self, ctx: RunContext, play: Play, task: HarborTaskRef, agent, image: TaskImage, row: dict) -> bytes | None:
        """Run the trial; fill `row`; return the verifier record's bytes (the reply), if any."""
        lim = play.manifest.execution.limits
        limits = TrialLimits(cpus=lim.cpus, memory_mb=lim.memory_mb, pids=lim.pids)
        rule = ctx.taskset.config.reward_key  # the contract's key rule, frozen in the Harbor config
        result = run_trial(ctx.sandbox.client, task.parsed, ctx.taskset.task_dir(task), image.image_id, agent.name,
                           limits, run_label=ctx.run_id, reward_key=rule)
        _outputs(row, result)
        record = None if result.record is None else result.record.model_copy(update={"image": image.image_id,
                                                                                      "key": rule})
        if result.verifier_error is not None and result.verifier_error.kind == "missing_key":
            # The key rule is the record's to apply (`score_record`, below and in the audit): the
            # trial knows one key only, not 'all'; a key the rule names but the reward lacks is
            # a verifier error there too.
            status = _agent_status(result) if result.status == "verifier_error" else result.status
            result = result.model_copy(update={"verifier_error": None, "status": status})
        reply = record.to_bytes() if record is not None else None
        if reply is not None:
            row.update(reply_sha256=sha256_tag(reply), reply_bytes=len(reply), reply_text=reply.decode()[:65536])
        if result.status == "infrastructure_error":
            row.update(status="infrastructure_error", error_class="DockerFault",
                       error_message=(result.infrastructure_error or "")[:2000])
            return None
        if result.status not in STATUS or result.verifier_error is not None:
            what = result.task_error or (f"{result.verifier_error.kind}: {result.verifier_error.detail}"
                                         if result.verifier_error else result.status)
            row.update(status="scorer_error", error_class="VerifierError", error_message=what[:2000])
            return reply
        try:
            reward, _ = score_record(reply or b"", rule)
        except VerifierFailed as e:  # the record and the trial disagree: the record is what the audit reads
            row.update(status="scorer_error", error_class="VerifierError", error_message=str(e)[:2000])
            return reply
        rule = play.manifest.expectations.rules()[agent.name]
        # The agent's exit code is data (Harbor ignores it; the verifier decides the reward),
        # but the status says it, as for every attempt.
        status = "exit_nonzero" if result.status == "ok" and row["exit_code"] != 0 else STATUS[result.status]
        row.update(status=status, reward=reward,
                   as_expected=as_expected(rule, status, reward, play.manifest.expectations.pass_threshold))
        return reply

    def unsupported(self, ctx: RunContext, play: Play, task: HarborTaskRef, agent, sample: int, number: int) -> Tried:
        key = dict(run_id=ctx.run_id, phase=play.phase, agent=agent.name, role=agent.role, sample=sample,
                   attempt=number)
        return Tried(unsupported_row(ctx, task, key, play.manifest.execution.image_digest))

    def row(self, result: Tried) -> Attempt:
        return result.row

    def keep(self, ctx: RunContext, results: list[Tried]) -> None:
        keep_replies(ctx, results)


def _agent_status(result: TrialResult) -> str:
    """The trial's status from its agent phase alone (the verifier's reward read apart)."""
    a = result.agent_run
    return "agent_timeout" if a.timed_out else "agent_oom" if a.oom_killed else "ok"


def _outputs(row: dict, result: TrialResult) -> None:
    a, v = result.agent_run, result.verifier_run
    left = ", ".join(f"{f.path} ({f.size} B)" for f in result.left_in_verifier_dir)
    # An agent that runs no command (nop) ran a program that does nothing: it exited 0.
    exit_code = a.exit_code if a.exit_code is not None or a.timed_out or a.oom_killed else 0
    row.update(runtime_s=result.runtime_s, exit_code=exit_code, oom_killed=a.oom_killed, timed_out=a.timed_out,
               stdout=a.stdout,
               stderr=(f"[left in /logs/verifier by the agent phase, removed unread: {left}]\n" if left else "")
               + f"[verifier exit {v.exit_code}]\n{v.stdout}\n{v.stderr}")

