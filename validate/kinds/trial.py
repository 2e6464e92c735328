"""The ``trial`` attempt kind: a task directory's own image, the agent in it, then the task's
own verifier inside a fresh container of what the agent left (`validate.taskdir.trial`).

Per task, once per run: the task's image is built from its ``environment/`` against the
profile's base-image map (`validate.taskdir.images`; cached by content across runs, the bases
built on first use into the image store's ``task-images/``), and a separate verifier's
image from its ``tests/`` the same way (``tests/Dockerfile``; without one, the task's own
image serves, fresh). A task naming its image (``[environment].docker_image``) runs in the
base the map serves for that reference, recorded as a ``FROM`` of it is. A task the profile
cannot run — several steps, a separate verifier from a compose file or a prebuilt image, extra
``artifacts`` for one, a compose environment, a GPU, a base (or
``[environment].docker_image``) the map does not serve — is
``unsupported_execution_contract`` with its reason, never played. A build that fails
otherwise is the task's error (``scorer_error``, which the verdict reads as
``invalid_task_or_verifier``), with the log's tail.

Every trial runs with the harness's resolver (`validate.taskdir.trial.network`, from the contract's
sandbox image): the reference solution's trial that gets no pass and looked a name up, in
``solve.sh`` or in ``test.sh``, is ``unsupported_execution_contract`` naming the hosts; any
agent's lookups are kept in its row's ``stderr``.

One try is one trial. Its row: the agent's status (``ok``, ``timeout``, ``oom``: the agent's
exit code is data, as Harbor ignores it: ``exit_nonzero`` still carries its reward), the reward
the verifier wrote under the contract's key, the agent's output and the verifier's. A verifier
that gave no usable reward (missing, unparsable, out of range, hung) is ``scorer_error``, never
a pass and never a 0 blamed on the agent; a docker fault, known from docker's own answers, is
``infrastructure_error`` (retried). The reply kept for the attempt is the harness's
`VerifierRecord` of the reward files' bytes and the task image's id, from which the audit reads
the reward again by the same rule.

A contract that froze the task images (``execution.task_images``, `validate.taskdir.images.frozen`)
routes each task: a frozen refusal is the task's outcome as frozen (nothing is built), a
frozen image is taken from the cache and must be that image id (else `TaskImageMismatch`, an
infrastructure fault), and the row's ``image_digest`` is that id. Without it (a contract
frozen before the field) the image is built here and the row names the sandbox image.
"""

from __future__ import annotations

import threading

from pydantic import ValidationError

from environment.harbor.env import HarborTaskRef
from environment.harbor.reward import VerifierFailed, VerifierRecord, read_record, score_record
from environment.protocol import AgentSpec, sha256_tag
from validate.contract.manifest import verifier_mode_of
from validate.core.errors import SandboxError
from validate.core.paths import task_image_store
from validate.core.records import (
    AGENT_STATUSES,
    CONTROL,
    ORACLE,
    SCORER_ERROR,
    Attempt,
    PathChange,
    TrialEvidence,
    planted_words,
)
from validate.evidence.verdicts import as_expected
from validate.kinds.base import ReplyKind, Tried, attempt_key, failed, keep_replies, now, started_row
from validate.run.context import Play, RunContext
from validate.run.workspace import workspace_sha256
from validate.taskdir.images.basemap import BaseImageMap
from validate.taskdir.images.bases import build_base_map, needed_recipes, task_refs
from validate.taskdir.images.build import TaskImage, TaskImageRefusal, build_task_image
from validate.taskdir.images.docker import DockerImages, images_for
from validate.taskdir.images.frozen import keep_run_log, pins_of, routed
from validate.taskdir.trial import network
from validate.taskdir.trial.agents import plan as agent_plan
from validate.taskdir.trial.docker import DockerFault
from validate.taskdir.trial.players import TrialRequest, play as play_trial
from validate.taskdir.trial.result import TrialLimits, TrialResult
from validate.taskdir.trial.run import HarnessFault
from validate.taskdir.trial.support import unsupported

#: The trial's statuses as attempt statuses (the rest: the verifier's or the task's error).
STATUS = {"ok": "ok", "agent_timeout": "timeout", "agent_oom": "oom",
          "infrastructure_error": "infrastructure_error"}


class TrialKind(ReplyKind):
    name = "trial"
    trial_profile = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._task_locks: dict[tuple[int, str], threading.Lock] = {}
        self._images: dict[tuple[int, str], TaskImage | TaskImageRefusal] = {}
        self._bases: BaseImageMap | None = None
        self._builder: DockerImages | None = None

    def _image(self, ctx: RunContext, task: HarborTaskRef,
               context: str = "environment") -> TaskImage | TaskImageRefusal:
        """The task's image (or its separate verifier's, from `context` ``tests``), built once
        per run (and cached by content across runs)."""
        key = (task.idx, context)
        with self._lock:
            lock = self._task_locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._images:
                # The contract routes the task's own image (`validate.taskdir.images.frozen`); a
                # separate verifier's image from tests/ is built (or taken from the cache) here.
                frozen = ctx.manifest.execution.task_images if context == "environment" else None
                got = None if frozen is None else routed(frozen, task.id, lambda: self._build(ctx, task),
                                                         self._daemon(ctx.sandbox.backend), ctx.fetch_image)
                self._images[key] = got if got is not None else self._build(ctx, task, context)
            return self._images[key]

    def prepared(self, ctx: RunContext, task: HarborTaskRef,
                 row: dict) -> tuple[TaskImage | None, str | None]:
        """The task's image and its separate verifier's (or None), ready for a trial; or
        (None, None) with `row` saying why the task is not played: a profile that cannot run
        it (``unsupported_execution_contract``) or a build that failed (the task's error)."""
        why = unsupported(task.parsed, ctx.sandbox.backend, verifier_mode_of(ctx.manifest.execution)) \
            if task.parsed is not None else "the task did not load"
        image, verifier = (None, None) if why else self._images_of(ctx, task)
        if isinstance(image, TaskImageRefusal) and image.reason == "unsupported_execution_contract":
            why = image.detail
        if why:
            row.update(status="unsupported_execution_contract", error_class="UNSUPPORTED_TASK",
                       error_message=why)
        # the machine's
        elif isinstance(image, TaskImageRefusal) and image.reason == "infrastructure_failure":
            row.update(status="infrastructure_error", error_class="BuildInfrastructure",
                       error_message=image.detail)
        elif isinstance(image, TaskImageRefusal):
            failed(row, "scorer_error", "BuildFailed", f"{image.detail}\n{image.log_tail or ''}")
        else:
            return image, verifier
        return None, None

    def _images_of(self, ctx: RunContext,
                   task: HarborTaskRef) -> tuple[TaskImage | TaskImageRefusal, str | None]:
        """The task's image and, for a separate verifier, its image's id (or the refusal)."""
        image = self._image(ctx, task)
        if task.parsed.verifier != "separate" or isinstance(image, TaskImageRefusal):
            return image, None
        if task.parsed.verifier_build == "environment":
            return image, image.image_id  # a fresh container of the task's own image
        verifier = self._image(ctx, task, "tests")
        return (verifier, None) if isinstance(verifier, TaskImageRefusal) else (image, verifier.image_id)

    def _build(self, ctx: RunContext, task: HarborTaskRef,
               context: str = "environment") -> TaskImage | TaskImageRefusal:
        builder, bases = self._base_map(ctx)
        config = task.parsed.config.environment
        if context == "tests":  # a separate verifier's own environment, if it has one
            config = task.parsed.config.verifier.environment or config
        prebuilt = context == "environment" and task.parsed.environment == "image"
        image = task.parsed.docker_image if prebuilt else None
        frozen = ctx.manifest.execution.task_images
        return build_task_image(ctx.taskset.task_dir(task), bases, builder, task_image_store(),
                                build_timeout_s=config.build_timeout_sec, context=context, docker_image=image,
                                **({} if frozen is None else {"policy": frozen.build_policy,
                                                              "pins": pins_of(frozen.tasks.get(task.id))}))

    def _daemon(self, backend: str) -> DockerImages:
        """The task images' engine (the one the backend declares, `Capabilities.images`: its
        trials run in images that engine built), with no base built."""
        with self._lock:
            if self._builder is None:
                self._builder = images_for(backend)
            return self._builder

    def _base_map(self, ctx: RunContext) -> tuple[DockerImages, BaseImageMap]:
        """The daemon and the base-image map (the core bases and those the contract's tasks
        need), built on first use (a build needs them; a trial routed to a frozen image, e.g. on
        a cluster's node, does not)."""
        builder = self._daemon(ctx.sandbox.backend)
        with self._lock:
            if self._bases is None:
                tasks = (ctx.taskset.task(t.idx) for t in ctx.manifest.tasks)
                self._bases = build_base_map(builder, task_image_store() / "bases", log=lambda m: None,
                                             needed=needed_recipes(task_refs(tasks)))
            return builder, self._bases

    def once(self, ctx: RunContext, play: Play, task: HarborTaskRef, agent, sample: int,
             number: int) -> Tried:
        row = started_row(attempt_key(ctx, play, agent.name, agent.role, sample, number), task,
                          workspace_sha256=workspace_sha256({}), backend=ctx.sandbox.backend,
                          image_digest=self.image_digest(play, task))
        reply = None
        try:
            image, verifier = self.prepared(ctx, task, row)
            if image is not None:
                reply = self._trial(ctx, play, task, agent, image, verifier, row)
        except SandboxError as e:
            failed(row, "infrastructure_error", type(e).__name__, str(e))
        except Exception as e:  # noqa: BLE001 - one attempt's trouble stays in that attempt's row
            failed(row, "harness_error", type(e).__name__, f"harness: {e}")
        row["finished_at"] = now()
        return Tried(Attempt(**row), reply)

    def _trial(self, ctx: RunContext, play: Play, task: HarborTaskRef, agent, image: TaskImage,
               verifier: str | None, row: dict) -> bytes | None:
        """Run the trial; fill `row`; return the verifier record's bytes (the reply), if any."""
        m = play.manifest
        lim = m.execution.limits
        limits = TrialLimits(cpus=lim.cpus, memory_mb=lim.memory_mb, pids=lim.pids,
                             verifier_mode=verifier_mode_of(m.execution), storage_mb=lim.storage_mb,
                             storage_inodes=lim.storage_inodes)
        rule = ctx.taskset.config.reward_key  # the contract's key rule, frozen in the Harbor config
        task_dir = ctx.taskset.task_dir(task)
        plan = agent_plan(agent.name, task.parsed, task_dir, spec=agent if isinstance(agent, AgentSpec)
                          else None)
        # the reference solution's trusted verifier that does not pass is replayed in its own
        # container when it changed paths outside its work paths: does the task need them?
        replay = m.expectations.pass_threshold if agent.role == ORACLE else None
        result = play_trial(ctx.sandbox, self._daemon(ctx.sandbox.backend).client, TrialRequest(
            task=task.parsed, task_dir=task_dir, image=image.image_id, agent=agent.name, plan=plan,
            limits=limits, contract=lim, run_label=ctx.run_id, reward_key=rule,
            resolver_image=m.execution.image, verifier_image=verifier, replay_below=replay))
        _outputs(row, result, agent.role)
        record = None if result.record is None else result.record.model_copy(update={
            "image": image.image_id, "key": rule,
            "replayed": None if result.shared_record is None else result.shared_record.model_copy(
                update={"image": image.image_id, "key": rule})})
        if (result.verifier_error is not None and result.verifier_error.kind == "missing_key"
                and record is not None):
            # The key rule is the record's to apply (`score_record`, below and in the audit): the
            # trial knows one key only, not 'all'; a key the rule names but the reward lacks is
            # a verifier error there too.
            status = _agent_status(result) if result.status == "verifier_error" else result.status
            try:
                got = read_record(record.to_bytes(), rule)
                read = {"reward": got.reward, "reward_decimal": got.exact, "rewards": got.values}
            except VerifierFailed:
                read = {}
            result = result.model_copy(update={"verifier_error": None, "status": status, **read})
        offline = network.offline_reason(result.lookups, agent.role == ORACLE,
                                         result.passed(m.expectations.pass_threshold))
        reply = record.to_bytes() if record is not None else None
        if reply is not None:
            row.update(reply_sha256=sha256_tag(reply), reply_bytes=len(reply),
                       reply_text=reply.decode()[:65536])
        if result.status == "infrastructure_error":
            failed(row, "infrastructure_error", DockerFault.__name__, result.infrastructure_error or "")
            return None
        if result.status == "harness_error":  # the harness cannot vouch for the verifier's run
            failed(row, "harness_error", HarnessFault.__name__, result.harness_error or "")
            return reply
        if offline is not None:  # the harness's own resolver saw the lookups: not the task's text
            row.update(status="unsupported_execution_contract", error_class="NetworkLookup",
                       error_message=offline)
            return reply
        if result.status not in STATUS or result.verifier_error is not None:
            what = result.task_error or (f"{result.verifier_error.kind}: {result.verifier_error.detail}"
                                         if result.verifier_error else result.status)
            failed(row, "scorer_error", "VerifierError", what)
            return reply
        try:
            got = read_record(reply or b"", rule)
        except VerifierFailed as e:  # the record and the trial disagree: the record is what the audit reads
            failed(row, "scorer_error", "VerifierError", str(e))
            return reply
        rule = play.manifest.expectations.rules()[agent.name]
        # The agent's exit code is data (Harbor ignores it; the verifier decides the reward),
        # but the status says it, as for every attempt.
        status = "exit_nonzero" if result.status == "ok" and row["exit_code"] != 0 else STATUS[result.status]
        row.update(status=status, reward=got.reward, reward_decimal=got.exact,
                   as_expected=as_expected(rule, status, got.reward,
                                           play.manifest.expectations.pass_threshold, got.exact))
        return reply

    def image_digest(self, play: Play, task: HarborTaskRef) -> str:
        """The task's own frozen image (or the contract's sandbox image when none is routed)."""
        return routed_digest(play.manifest, task.id)

    def keep(self, ctx: RunContext, results: list[Tried]) -> None:
        """The replies, and the build log of each frozen image a trial ran in (into the run's
        ``build-logs/``, where the audit looks for it), written here on the driver."""
        keep_replies(ctx, results)
        frozen = ctx.manifest.execution.task_images
        if frozen is not None:
            for task_id in sorted({r.row.task_id for r in results if r.reply is not None}):
                keep_run_log(frozen, task_id, task_image_store(), ctx.paths.root)


def _agent_status(result: TrialResult) -> str:
    """The trial's status from its agent phase alone (the verifier's reward read apart)."""
    a = result.agent_run
    return "agent_timeout" if a.timed_out else "agent_oom" if a.oom_killed else "ok"


def routed_digest(m, task_id: str) -> str:
    """The image the contract routes the task to (its frozen id), else the sandbox image."""
    frozen = m.execution.task_images
    return (frozen.digest_of(task_id) if frozen is not None else None) or m.execution.image_digest


def evidence_of(result: TrialResult) -> TrialEvidence:
    """What the harness observed of the trial, as the attempt's typed `TrialEvidence`."""
    looked = result.lookups
    left = [f"{f.path} ({f.size} B)" for f in result.left_in_verifier_dir]
    handed = result.artifacts
    note = None
    if looked is not None and (looked.overflow or looked.problem):
        note = "; ".join(b for b in (f"{looked.overflow} more not named" if looked.overflow else "",
                                     looked.problem or "") if b)
    return TrialEvidence(
        verifier_mode=result.verifier_mode, work_paths=list(result.work_paths),
        named_paths=list(result.named_paths), carried=list(result.carried),
        carried_total=result.carried_total, dropped=[*result.dropped, *(handed.dropped if handed else [])],
        outside=[PathChange(path=c.path, kind=c.kind) for c in result.outside_changes],
        outside_total=result.outside_changes_total, processes_killed=result.agent_processes_killed,
        left_in_verifier=left, verifier_exit_code=result.verifier_run.exit_code,
        lookups_agent=list(looked.agent) if looked else [], lookups_verifier=list(looked.verifier) if looked
        else [], pid1_guarded=result.pid1_guarded, shared_replayed=result.shared_replayed, lookups_note=note,
        storage_bounded=result.storage_bounded)


def planted_of(trial: TrialEvidence, role: str) -> str | None:
    """`Attempt.planted`: a control's paths its verifier may have seen (trusted: what was carried;
    otherwise every change it made), None for anything else."""
    if role != CONTROL:
        return None
    if trial.verifier_mode == "trusted":
        return planted_words(trial.carried, trial.carried_total)
    paths = [c.path for c in trial.outside] + trial.carried
    return planted_words(paths, trial.outside_total + trial.carried_total)


def _outputs(row: dict, result: TrialResult, role: str) -> None:
    a, v = result.agent_run, result.verifier_run
    # An agent that runs no command (nop) ran a program that does nothing: it exited 0.
    exit_code = a.exit_code if a.exit_code is not None or a.timed_out or a.oom_killed else 0
    trial = evidence_of(result)
    row.update(runtime_s=result.runtime_s, exit_code=exit_code, oom_killed=a.oom_killed,
               timed_out=a.timed_out, stdout=a.stdout, stderr=f"{trial.lines()}{v.stdout}\n{v.stderr}",
               trial=trial, shared_reward=result.shared_reward, planted=planted_of(trial, role))


def evidence_problems(row: dict, reply: bytes | None, manifest) -> list[str]:
    """What does not hold of a trial attempt's typed evidence (`Attempt.trial`) against the rest
    of its row, its stored reply and its contract (the audit's check; [] when all holds): the
    head of its ``stderr`` is the evidence in words, its ``planted`` is derived from it, its
    ``shared_reward`` is what the reply's replayed record scores to, its verifier mode is the
    contract's (a task's separate verifier aside)."""
    data = row.get("trial")
    if data is None:
        played = row.get("status") in (*AGENT_STATUSES, SCORER_ERROR) and reply is not None
        return ["a played trial without its trial evidence"] if played and manifest.execution.trial else []
    try:
        trial = TrialEvidence.model_validate(data)
    except ValidationError as e:
        return [f"its trial evidence does not read ({str(e)[:200]})"]
    problems = []
    if not (row.get("stderr") or "").startswith(trial.lines()):
        problems.append("the head of its stderr is not its trial evidence in words")
    if row.get("planted") != planted_of(trial, row.get("role", "")):
        problems.append(f"planted {row.get('planted')!r} is not what its trial evidence names")
    mode = verifier_mode_of(manifest.execution)
    if trial.verifier_mode != mode and trial.verifier_mode != "separate":
        problems.append(f"verifier mode {trial.verifier_mode} but the contract's is {mode}")
    replayed = None
    if reply is not None:
        try:
            replayed = VerifierRecord.model_validate_json(reply).replayed
        except ValidationError:
            replayed = None
    if trial.shared_replayed != (replayed is not None):
        problems.append("its trial evidence and its stored reply disagree on whether the "
                        "verifier was replayed")
    expected = None
    if replayed is not None:
        try:
            expected, _ = score_record(replayed.to_bytes(), replayed.key)
        except VerifierFailed:
            expected = None
    if (row.get("shared_reward") is None) != (expected is None) or \
            (expected is not None and abs(float(row["shared_reward"]) - expected) > 1e-9):
        problems.append(f"shared_reward {row.get('shared_reward')} but its stored reply's replay "
                        f"scores {expected}")
    return problems
