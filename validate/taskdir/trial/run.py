"""One Harbor trial on docker: the agent phase, the verifier phase, the result.

Inputs are plain data (a parsed task and its directory, an image id, an agent name, the
profile's `TrialLimits`, a docker client), so the attempt kind that wires trials into a run
stays thin. Where the verifier runs is the profile's `TrialLimits.verifier_mode`:

- ``trusted`` (the default): a fresh container of the task's pristine image, into which only
  the agent's changes under the task's work paths are carried (`validate.taskdir.trial.trusted`,
  `validate.taskdir.trial.workpaths`): nothing the agent did to the system is in the verifier's way;
- ``shared``: Harbor's, the agent's own container once every process of its phase is dead
  (below): the reward channel is the harness's, but the verifier runs the agent's binaries
  and imports, so it is not hack-resistant and the claim says so;
- a task's own separate verifier runs in its own image, handed only ``/logs/artifacts``.

In every mode, every process the harness starts in a trial container — PID 1 and the
verifier — is the harness's own static program (`validate.taskdir.trial.tool`), named by its
absolute path on a read-only mount: nothing the image's PATH, shell or dynamic linker
resolves. Before the verifier starts, its container's cgroup holds PID 1 alone (the shared
mode sweeps it, again after any restart); when it ends, the harness checks that PID 1 is
still its program and that no exec it did not make ran in the container (the daemon's own
events): else the trial is a ``harness_error`` naming what it saw (`HarnessFault`).

The shared one-container sequence, and why:

0. **Resolver** (when the caller names an image for it): still no network, but every name
   either phase looks up is logged where the harness reads it. In one container with a root
   harness, the harness's own sockets on 127.0.0.1:53 in the container's namespace
   (`validate.taskdir.trial.nsresolver`: its ``resolv.conf`` and ``hosts`` mounted at creation, the
   sockets opened once PID 1 runs and before any command, the boundary below, the files
   written again there; about a millisecond a trial); otherwise (a separate verifier, a
   client that cannot play one container, a harness that is not root) the resolver sidecar
   (`validate.taskdir.trial.network`), whose network namespace the trial's containers join.
1. **Agent phase.** One container of the task image (no network, the task's limits capped
   by the profile) with two directories of the harness's own, fresh for the trial in a
   private temporary directory on the host, bound at ``/logs`` (``agent``, ``artifacts`` and
   ``verifier`` made in it, as Harbor's container has them) and at ``/tests`` (empty): mount
   points, so the agent can neither move them nor ``/logs/verifier``'s parent away; the
   agent's files written there (``/solution`` for the oracle only, a directory of the
   harness's bound there too; never ``tests/``); its command run as the task's agent user
   until it ends or the agent timeout passes. PID 1 is the harness's program, started as
   root, running with two ids of the harness's (`validate.taskdir.trial.docker.PID1_IDS`, real and
   effective): no process can hold all three of its uids, so ptrace and ``/proc/1/mem`` need
   CAP_SYS_PTRACE, which no container here has (the change of ids also makes it
   non-dumpable). It reaps every orphan and forks nothing: it cannot be a vehicle for the
   agent. The directories bound at /logs and /tests live on the trial's own capped tmpfs
   (`TrialLimits.storage_mb`): filling them fills nothing else.
2. **Between the phases**, on the host: the container paused (the cgroup freezer: nothing
   forks or exits), every process of its cgroup but PID 1 SIGKILLed from the host, unpaused,
   and waited for until the cgroup holds PID 1 alone (else a `DockerFault` naming the pids;
   the count killed is `TrialResult.agent_processes_killed`); background rewriters, double
   forks and new sessions included. PID 1 reaps the killed orphans; should zombies still hold
   the pids limit, or the container have stopped (OOM), it starts again (a fresh PID 1 of the
   harness's, never a program of the image's; the files stay) and is swept again. Then,
   from the host directories, never following a
   link (`validate.taskdir.trial.docker.read_host_tree`): what the agent left in ``/logs/verifier``
   recorded, both directories emptied and made the harness's again (mode, owner: the agent
   may have changed them), the task's ``tests/`` written into ``/tests``; the resolver's
   boundary (what was asked until now was the agent's). (For a separate verifier: the agent's container
   killed, its ``/logs/artifacts`` read, `validate.taskdir.trial.artifacts`, and removed.)
3. **Verifier phase.** ``test.sh`` run by the harness's program in the same container, as the verifier user,
   against the verifier timeout (a separate verifier: a fresh container of its own image,
   fresh volumes at ``/logs/verifier``, ``/tests`` unless its image owns it, and
   ``/logs/artifacts`` with what was handed); the container removed (a separate one killed)
   before its files are read, so nothing the verifier started rewrites them; the reward read
   with `environment.harbor.reward` from the host directory; the resolver's log read.
4. **Cleanup**, always (an exception, a Ctrl-C): every container (the resolver too), volume
   and the host directories.

Why one container: the snapshot (``docker commit``), a second container, volumes and the
archive uploads cost three times a bare trial (`bench/harbor_bench.py`); the channel stays
one the agent cannot touch: no process of its phase is alive when the verifier starts, and
the reward is read from a directory the harness emptied after the last of them died.

What the shared mode does not defend: a verifier sharing the agent's environment runs the
agent's binaries and imports (a trojaned ``python3`` or a ``conftest.py`` at ``/``); that is
Harbor's design, and why ``trusted`` is the default. Residual: a user namespace without
`PID1_IDS` (rootless) leaves PID 1 under its own ids (`TrialResult.pid1_guarded` False). The
host side of the shared mode needs the daemon on this machine and the harness able to
signal the container's processes (root).
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from environment.harbor.config import TaskConfig
from environment.harbor.reward import (
    MAX_REWARD_BYTES,
    REWARD_JSON,
    REWARD_TXT,
    RewardError,
    VerifierRecord,
    read_reward,
)
from environment.harbor.taskdir import HarborTask
from validate.core.errors import AgentError, TaskError
from validate.sandbox.base import Limits
from validate.sandbox.cgroups import group_of_pid, oom_kills_of_pid, procs_of
from validate.sandbox.storage import attempt_storage, mount_tmpfs
from validate.taskdir.trial import (
    artifacts,
    docker as dk,
    network,
    nsresolver,
    tool as harness_tool,
    trusted,
    workpaths,
)
from validate.taskdir.trial.agents import AgentPlan, plan as agent_plan, tree_entries
from validate.taskdir.trial.result import Applied, LeftFile, PhaseRun, TrialLimits, TrialResult, VerifierError

VERIFIER_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
VERIFIER_STDOUT, VERIFIER_STDERR = "test-stdout.txt", "test-stderr.txt"
#: What makes two runs of a trial differ, pinned for both phases (the task's env may override).
PINNED_ENV = {"LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "TZ": "UTC"}
_LOG_DIRS = [("logs", 0o755, None), ("logs/agent", 0o777, None), ("logs/artifacts", 0o777, None),
             ("logs/verifier", 0o777, None)]
_MOUNT_POINTS = [("logs", 0o755, None), ("logs/verifier", 0o777, None), ("tests", 0o755, None)]
#: The verifier: the harness's program runs ``/tests/test.sh`` with the image's bash (else sh),
#: by absolute paths, its output in /logs/verifier (`validate.taskdir.trial.tool`).
VERIFY = [harness_tool.BINARY, "run", f"{VERIFIER_DIR}/{VERIFIER_STDOUT}",
          f"{VERIFIER_DIR}/{VERIFIER_STDERR}"]
#: The trial's host storage when only the resolver's files live there (a trusted trial).
_ETC_STORAGE = Limits(storage_mb=1, storage_inodes=64)


@dataclass(frozen=True)
class LiveAgent:
    """The agent phase's live container as a driver sees it: where and as whom its commands
    run (the task's agent user, its working directory, the phase's environment) and the
    phase's time. The harness starts and stops the container; a driver only runs commands."""

    api: object
    cid: str
    user: str | None
    workdir: str | None
    env: dict[str, str]
    timeout_s: float


#: Plays the agent phase in place of an agent's command (e.g. a model whose shell commands run
#: in the container): given the live container, it returns what the phase did. Raising
#: `validate.taskdir.trial.docker.DockerFault` makes the trial an infrastructure error; any other
#: exception leaves the trial (cleanup done) to the caller.
AgentDriver = Callable[[LiveAgent], PhaseRun]


class UnsupportedTask(TaskError):
    """The task needs what a single-container trial does not do (the caller excludes it)."""


class HarnessFault(AgentError):
    """The harness cannot vouch for the verifier's run (a process it did not start in the
    container, PID 1 no longer its program): the trial's result is void (``harness_error``)."""


def apply_limits(config: TaskConfig, limits: TrialLimits) -> Applied:
    """The task's limits and timeouts, capped by the profile; the users as docker wants them."""
    env = config.environment
    agent_t = (config.agent.timeout_sec or limits.agent_timeout_s) * limits.timeout_multiplier
    verifier_t = config.verifier.timeout_sec * limits.timeout_multiplier

    def user(u):
        return None if u is None else str(u)

    return Applied(cpus=min(env.cpus or limits.cpus, limits.cpus),
                   memory_mb=min(env.memory_mb or limits.memory_mb, limits.memory_mb), pids=limits.pids,
                   agent_timeout_s=min(agent_t, limits.max_agent_timeout_s),
                   verifier_timeout_s=min(verifier_t, limits.max_verifier_timeout_s),
                   agent_user=user(config.agent.user), verifier_user=user(config.verifier.user),
                   pinned_env=dict(PINNED_ENV))


def run_trial(client, task: HarborTask, task_dir: Path, image: str, agent: str,
              limits: TrialLimits = TrialLimits(), *, run_label: str = "adhoc", reward_key: str = "reward",
              reward_range: tuple[float, float] = (0.0, 1.0), resolver_image: str | None = None,
              verifier_image: str | None = None, drive: AgentDriver | None = None,
              plan: AgentPlan | None = None, replay_below: float | None = None) -> TrialResult:
    """Run `agent` on `task` (its files in `task_dir`) in `image`; never leaves a container,
    volume or snapshot behind (`TrialResult.cleanup_errors` says so if docker refused).
    `resolver_image` (one with python3): run the trial's resolver from it and record every
    name looked up (`TrialResult.lookups`); `verifier_image`: a separate verifier's image.
    With `drive`, the agent phase is that driver's (`agent` only names it): nothing is uploaded.
    `plan`: the agent's files and command (default: `validate.taskdir.trial.agents.plan` of `agent`).
    `replay_below` (trusted mode): when the trusted verifier's reward stays under it and the
    agent changed paths outside its work paths, the verifier is replayed in the agent's own
    container (`TrialResult.shared_reward`): what the reference solution asks for."""
    if task.steps:
        raise UnsupportedTask(f"{task.id}: multi-step tasks are not run by this harness")
    separate = task.verifier == "separate"
    if separate and (verifier_image is None or task.verifier_build not in ("dockerfile", "environment")):
        raise UnsupportedTask(f"{task.id}: a separate verifier built from "
                              f"{task.verifier_build} needs its image")
    if plan is None:
        plan = agent_plan(agent, task, Path(task_dir)) if drive is None else AgentPlan(name=agent,
                                                                                       command=None,
                                                                                       output="")
    t0 = time.monotonic()
    res = dk.Resources(client.api, run_label, secrets.token_hex(6))
    mode = "separate" if separate else limits.verifier_mode
    result = TrialResult(task_id=task.id, task_hash=task.hash, agent=agent, image=image, status="ok",
                         reward_key=reward_key, applied=apply_limits(task.config, limits),
                         verifier_image=verifier_image if separate else None, verifier_mode=mode)
    resolver, mark, own, storage = None, None, _OwnResolver(), None
    # a client whose daemon is the harness's own machine's and root's (not a rootless service):
    # it can play one container, and bind the trial's own host files (`one_container`)
    local = getattr(client.api, "one_container", True)
    one = mode == "shared" and local
    # trusted on this machine's own daemon, as root, over overlay2: the agent's writable layer is
    # read, and the verifier's written, where they lie (`validate.taskdir.trial.trusted.local_trial`)
    near = mode == "trusted" and local and os.geteuid() == 0 and _driver(client.api) == "overlay2"
    try:
        own.tool = str(harness_tool.tool_dir())
        users, workdir = _image_defaults(res, image, result.applied)
        # A root harness: the harness's own sockets in the container's namespace
        # (`validate.taskdir.trial.nsresolver`); otherwise the resolver sidecar
        # (`validate.taskdir.trial.network`).
        own.wanted = (one or mode == "trusted" and local) and resolver_image is not None and os.geteuid() == 0
        if resolver_image is not None and not own.wanted:
            resolver = network.Resolver(res, resolver_image)
        bound = one or near  # the harness's host directories bound into the trial's containers
        if bound or own.wanted:  # the trial's own capped storage: bound files never fill a host disk
            sized = Limits(storage_mb=limits.storage_mb, storage_inodes=limits.storage_inodes) if bound \
                else _ETC_STORAGE
            storage = attempt_storage(run_label, f"trial-{res.trial}", sized, noexec=False)
            host = storage.__enter__()
            if bound:
                (host / HARNESS).mkdir(mode=0o755)
                mount_tmpfs(host / HARNESS, sized, noexec=False)
                os.chmod(host / HARNESS, 0o755)
                # the resolver's files on a tmpfs of their own: an agent filling the writable
                # /etc/hosts fills nothing the harness writes next (the tests, the reward's dir)
                (host / HARNESS / "etc").mkdir(mode=0o755)
                mount_tmpfs(host / HARNESS / "etc", _ETC_STORAGE, noexec=True)
                os.chmod(host / HARNESS / "etc", 0o755)
            own.prepare(host, host / HARNESS / "etc" if bound else host / "etc", f"dv-{res.trial}")
        work = workpaths.work_paths(
            workdir,
            [a.source for a in task.config.artifacts],
            workpaths.named_paths(workpaths.task_texts(Path(task_dir), task.instruction)),
        )
        if near:
            trusted.local_trial(_core(), res, task, Path(task_dir), image, plan, result, limits, drive, own,
                                users, work, reward_key, reward_range, replay_below)
        elif mode == "trusted":
            box = trusted.agent_phase(_core(), res, task, image, plan, result, limits, resolver, drive, own,
                                      users)
            if resolver is not None:
                mark = network.boundary(res, resolver.id)
            trusted.verifier_phase(_core(), res, task, Path(task_dir), image, box, result, limits, reward_key,
                                   reward_range, own, users, work)
            if replay_below is not None and result.outside_changes_total and not result.passed(replay_below):
                trusted.replay_shared(_core(), res, task, Path(task_dir), box, result, limits, reward_key,
                                      reward_range, own, users)
        elif not one:
            handed = _agent_phase(res, task, image, plan, result, limits, resolver, drive, separate, own,
                                  users, work)
            if resolver is not None:
                mark = network.boundary(res, resolver.id)
            _verifier_phase(res, task, Path(task_dir), verifier_image if separate else handed, result, limits,
                            reward_key, reward_range, network.mode(resolver.id) if resolver else "none",
                            handed if separate else None, own, users)
        else:
            host = own.host
            box = _shared_agent_phase(res, task, image, plan, result, limits, resolver, drive, host, own,
                                      users)
            _seen(result, work, *trusted.changes_of(res, box.cid))
            if resolver is not None:
                mark = network.boundary(res, resolver.id)
            own.boundary(box.pid)
            _shared_verifier_phase(res, task, Path(task_dir), box, result, limits, reward_key, reward_range,
                                   host, own, users)
        result.status = _status(result)
        result.storage_bounded = res.capped
    except dk.DockerFault as e:
        result.status, result.infrastructure_error = "infrastructure_error", str(e)
    except dk.TaskFault as e:
        result.status, result.task_error = "task_error", str(e)
    except HarnessFault as e:
        result.status, result.harness_error = "harness_error", str(e)
    finally:
        try:
            if resolver is not None:
                result.lookups = network.lookups(res, resolver.id, mark)
            elif own.resolver is not None:
                result.lookups = own.resolver.lookups()
        finally:
            own.close()
            result.cleanup_errors = res.close()
            if storage is not None:
                try:
                    storage.__exit__(None, None, None)  # unmounted: however deep the agent made it
                except Exception as e:  # noqa: BLE001 - a cleanup error is recorded, never raised
                    result.cleanup_errors.append(f"trial storage: {type(e).__name__}: {str(e)[:200]}")
            result.runtime_s = round(time.monotonic() - t0, 3)
    return result


_DRIVERS: dict[str, str] = {}


def _driver(api) -> str:
    """The daemon's storage driver (asked once per daemon)."""
    where = str(getattr(api, "base_url", ""))
    if where not in _DRIVERS:
        _DRIVERS[where] = str(dk.call("ask the daemon for its storage driver", api.info).get("Driver", ""))
    return _DRIVERS[where]


def _core():
    """This module, as `validate.taskdir.trial.trusted` uses its pieces (imported there lazily: no circle)."""
    import sys
    return sys.modules[__name__]


def _image_defaults(res: dk.Resources, image: str, applied: Applied) -> tuple[dict[str, str], str | None]:
    """Who runs each phase's command ({"agent": ..., "verifier": ...}: the task's users, else
    the image's own ``USER``; PID 1 starts as root, so every exec names its user) and the
    image's working directory."""
    config = dk.call("inspect the task image", res.api.inspect_image, image).get("Config") or {}
    default = str(config.get("User") or "")
    return ({"agent": applied.agent_user or default, "verifier": applied.verifier_user or default},
            config.get("WorkingDir") or None)


def _seen(result: TrialResult, work: workpaths.WorkPaths, changes: list[dict], cut: bool) -> None:
    """The agent's changes as a verifier that sees them all (shared, separate) records them:
    those under its work paths and those outside (evidence only: nothing is carried or left)."""
    seen = workpaths.plan(changes, work)
    result.work_paths, result.named_paths = list(work.full), list(work.named)
    result.carried, result.carried_total = list(seen.copy[:trusted.MAX_LISTED]), len(seen.copy)
    result.outside_changes = list(seen.outside[:trusted.MAX_LISTED])
    result.outside_changes_total = len(seen.outside)
    if cut:
        result.dropped = [*result.dropped, "(the agent's changes past the listing's cap were not read)"]


def _record_left(result: TrialResult, left: dk.Tree) -> None:
    """What the agent left in /logs/verifier ("." is the directory itself: recorded only when
    the agent replaced it by a file or a link)."""
    result.left_in_verifier_dir = [LeftFile(path=f.path, kind=f.kind, size=f.size, sha256=left.sha256(f))
                                   for f in left.entries if f.path != "." or f.kind != "dir"]
    result.left_listing_truncated = left.truncated


def _verify_in(res: dk.Resources, task: HarborTask, box: AgentContainer, result: TrialResult,
               limits: TrialLimits, reward_key: str, reward_range: tuple[float, float], users: dict[str, str],
               tool: str | None, stop: Callable[[], bool], read: Callable[[], dk.Tree],
               env: dict[str, str] | None = None) -> None:
    """The verifier in `box` (running, PID 1 the harness's program and, before, nothing else
    the agent could have left): ``test.sh`` run by the harness's program as the verifier user,
    the container stopped (`stop`, whether anything was OOM-killed), then checked: PID 1 is
    still the harness's program and no exec the harness did not make ran in the container
    (else `HarnessFault`); then the verifier's files read (`read`) and the reward taken."""
    a = result.applied
    if env is None:
        env = {**a.pinned_env, **task.config.environment.env, **task.config.verifier.env}
    since = time.time()
    ex = dk.run_exec(res.api, box.cid, VERIFY, users["verifier"], None, env, a.verifier_timeout_s)
    foreign = dk.foreign_execs(res.api, box.cid, since, {ex.exec_id})
    still = tool is None or harness_tool.is_tool(box.pid, Path(tool))
    oom = stop()
    if foreign:
        raise HarnessFault("verifier: execs the harness did not make ran in the verifier's container during "
                           f"its phase ({', '.join(e[:12] for e in foreign)}): its result "
                           "cannot be vouched for")
    if not still and not oom:
        raise HarnessFault(f"verifier: the container's PID 1 ({box.pid}) was no longer the harness's program "
                           "when the verifier ended")
    # (PID 1 gone and an OOM kill in the phase: the kernel took it, under the verifier's memory:
    # a verifier OOM, whatever made it)
    _verified(result, read(), ex, oom, limits, reward_key, reward_range)


def _alone(box: AgentContainer, tool: str | None) -> None:
    """Before a shared verifier: the container's cgroup holds PID 1 alone and PID 1 is the
    harness's program (`HarnessFault` naming what is there instead)."""
    group = group_of_pid(box.pid)
    held = procs_of(group) if group is not None else None
    if held != [box.pid]:
        raise HarnessFault(f"verifier: the container's cgroup holds {held} before the verifier "
                           f"(PID 1 is {box.pid}): a process of the agent phase may be alive")
    if tool is not None and not harness_tool.is_tool(box.pid, Path(tool)):
        raise HarnessFault(f"verifier: the container's PID 1 ({box.pid}) is not the harness's program")


def _status(result: TrialResult) -> str:
    if result.verifier_error is not None:
        return "verifier_error"
    if result.agent_run.timed_out:
        return "agent_timeout"
    return "agent_oom" if result.agent_run.oom_killed else "ok"


def _spec(task: HarborTask, image: str, result: TrialResult, lifetime_s: float, env: dict[str, str],
          volumes: tuple = ()) -> dk.Spec:
    a = result.applied
    return dk.Spec(image=image, lifetime_s=lifetime_s, user=None, workdir=task.config.environment.workdir,
                   env={**a.pinned_env, **task.config.environment.env, **env}, cpus=a.cpus,
                   memory_mb=a.memory_mb, pids=a.pids, volumes=volumes)


def _started(res: dk.Resources, cid: str) -> tuple[int, int | None, float]:
    """Start `cid`; its PID 1 on the host, its OOM-kill counter now, and when (wall clock)."""
    dk.make_room(res, cid)
    since = time.time()
    dk.call("start a container", res.api.start, cid)
    pid = int(dk.call("inspect a container", res.api.inspect_container, cid)["State"].get("Pid") or 0)
    return pid, oom_kills_of_pid(pid), since


def _stop(res: dk.Resources, cid: str, pid: int, oom_before: int | None, since: float) -> bool:
    """Kill `cid` (every process in it) and say whether anything in it was OOM-killed.
    A container that stopped before the harness killed it was stopped by someone else or
    by the kernel: the daemon's state and events say which (`DockerFault` unless OOM)."""
    oom_after = oom_kills_of_pid(pid)
    state = dk.call("inspect a container", _state_once_heard, res, cid, pid)
    if not state.get("Running"):
        return _stopped_before(res, cid, state, since)
    try:
        dk.call("kill a container", res.api.kill, cid)
    except dk.DockerFault:
        state = dk.call("inspect a container", _state_once_heard, res, cid, pid)
        if state.get("Running"):
            raise
        return _stopped_before(res, cid, state, since)  # it stopped between the look and the kill
    dk.call("wait for a container", res.api.wait, cid, timeout=60)
    oom = oom_before is not None and oom_after is not None and oom_after > oom_before
    return oom or bool(
        dk.call("inspect a container", res.api.inspect_container, cid)["State"].get("OOMKilled")
    )


def _stopped_before(res: dk.Resources, cid: str, state: dict, since: float) -> bool:
    """A container that stopped before the harness killed it: OOM (True), or a `DockerFault`."""
    if state.get("OOMKilled"):
        return True
    raise dk.DockerFault(f"docker: the container stopped before the harness killed it "
                         f"(exit {state.get('ExitCode')}, error {state.get('Error')!r}, "
                         f"kills by others: {_outside_kills(res, cid, since) or 'none'})")


def _outside_kills(res: dk.Resources, cid: str, since: float) -> str:
    try:
        events = res.api.events(since=since, until=time.time() + 0.1, decode=True,
                                filters={"type": "container", "container": cid})
        return ", ".join(str(e.get("Actor", {}).get("Attributes", {}).get("signal", "?"))
                         for e in events if e.get("Action") == "kill")
    except dk.DOCKER_ERRORS:
        return "unknown (the daemon's events could not be read)"


@dataclass
class AgentContainer:
    """A running agent container: its id, its PID 1 on the host, its OOM-kill counter at the
    start, and when it started (what `stop_agent` needs to tell who stopped it)."""

    cid: str
    pid: int
    oom_before: int | None
    since: float
    #: Whether PID 1 runs under `dk.PID1_IDS` (None: no harness program bound, `dk.Spec.tool`).
    guarded: bool | None = None


def start_agent(res: dk.Resources, spec: dk.Spec, uploads: list,
                resolver: network.Resolver | None = None) -> AgentContainer:
    """Create the agent's container (`spec`; joining `resolver`'s network namespace if
    given), make Harbor's log directories, upload `uploads` (tar entries extracted at ``/``),
    start it once the resolver answers. Any driver of an agent phase starts here, runs its
    commands with `dk.run_exec`, and ends with `stop_agent`."""
    if resolver is not None:
        spec = replace(spec, network=network.mode(resolver.id))
    cid = dk.create(res, spec, "agent")
    if not spec.binds:  # else the harness made them in the directory bound at /logs
        dk.put_tree(res.api, cid, "/", _LOG_DIRS)
    if uploads:
        dk.put_tree(res.api, cid, "/", uploads)
    if resolver is not None:
        resolver.started()
    started = AgentContainer(cid, *_started(res, cid))
    if spec.tool is not None:  # no command runs before PID 1 is the harness's program, its ids settled
        started.guarded = dk.settle_pid1(started.pid, spec.tool)
    if resolver is not None:
        network.wait_ready(res, resolver.id)  # no early question goes unlogged
    return started


def stop_agent(res: dk.Resources, agent: AgentContainer) -> bool:
    """Kill the agent's container (every process of the phase); whether anything was OOM-killed.
    A docker call that failed because the container was stopped under it (an exec that could
    not start, say) is named by the container's state and events, not by the call."""
    try:
        return _stop(res, agent.cid, agent.pid, agent.oom_before, agent.since)
    except dk.DockerFault as fault:
        return stopped_under(res, agent, fault)


def stopped_under(res: dk.Resources, agent: AgentContainer, fault: dk.DockerFault) -> bool:
    """After `fault` (a docker call in the agent's container failed): raise it if the
    container still runs, else say who stopped it (`_stopped_before`: OOM, or a `DockerFault`)."""
    try:
        state = _state_once_heard(res, agent.cid, agent.pid)
    except dk.DOCKER_ERRORS:
        raise fault from None
    if state.get("Running"):
        raise fault
    return _stopped_before(res, agent.cid, state, agent.since)


def _state_once_heard(res: dk.Resources, cid: str, pid: int) -> dict:
    """The daemon's state of `cid`, once it has heard of its PID 1's end: a container whose PID 1
    (host pid `pid`) is gone or a zombie has stopped, but the daemon says Running until the
    runtime's shim has reaped it and reported the exit. Waited for up to `dk.SETTLE_S`; then
    whatever the daemon says (a container still Running is the caller's fault to raise). No
    pid (0: the daemon gave none) is no sign of an end: nothing is waited for."""
    state = res.api.inspect_container(cid)["State"]
    if state.get("Running") and pid > 0 and not dk.pid_alive(pid):
        try:
            res.api.wait(cid, timeout=dk.SETTLE_S)
        except dk.DOCKER_ERRORS:
            pass  # not stopped in time, or the wait failed: the state below says which
        state = res.api.inspect_container(cid)["State"]
    return state


def _agent_phase(res: dk.Resources, task: HarborTask, image: str, plan, result: TrialResult,
                 limits: TrialLimits, resolver: network.Resolver | None, drive: AgentDriver | None,
                 separate: bool, own: _OwnResolver, users: dict[str, str], work: workpaths.WorkPaths):
    """The agent phase in a container of its own: run the agent; record what it left in
    /logs/verifier; return the artifacts to hand a separate verifier (`validate.taskdir.trial.artifacts`),
    or else a snapshot of the agent's filesystem for a fresh verifier container (a client that
    cannot play one container: `one_container`, e.g. rootless podman on cgroup v1, no freezer)."""
    a = result.applied
    spec = replace(_spec(task, image, result, a.agent_timeout_s, plan.env), tool=own.tool)
    agent = start_agent(res, spec, plan.uploads, resolver)
    result.pid1_guarded = agent.guarded
    run = PhaseRun()
    try:
        if drive is not None:
            run = drive(LiveAgent(api=res.api, cid=agent.cid, user=users["agent"],
                                  workdir=task.config.environment.workdir,
                                  env={**a.pinned_env, **task.config.environment.env, **plan.env},
                                  timeout_s=a.agent_timeout_s))
        elif plan.command is not None:
            ex = dk.run_exec(res.api, agent.cid, plan.command, users["agent"], None,
                             {**a.pinned_env, **task.config.environment.env, **plan.env}, a.agent_timeout_s)
            run = PhaseRun(exit_code=ex.exit_code, timed_out=ex.timed_out, runtime_s=round(ex.runtime_s, 3))
    except dk.DockerFault as fault:
        run.oom_killed = stopped_under(res, agent, fault)
    else:
        run.oom_killed = stop_agent(res, agent)
    cid = agent.cid
    if plan.command is not None:
        out = dk.read_tree(res.api, cid, plan.output, limits.max_output_bytes, limits.max_output_bytes * 2)
        run.stdout, run.truncated = _text(out, ".", limits.max_output_bytes)
    result.agent_run = run
    _record_left(result, dk.read_tree(res.api, cid, VERIFIER_DIR, MAX_REWARD_BYTES + 1,
                                      limits.max_listing_bytes))
    _seen(result, work, *trusted.changes_of(res, cid))
    if separate:
        handed, result.artifacts = artifacts.collect(res.api, cid, limits.max_artifact_bytes)
    else:
        # The verifier's mount points made directories again (a file or a link the agent put
        # there would fail the verifier's start: the agent's doing, not the infrastructure's).
        dk.put_tree(res.api, cid, "/", _MOUNT_POINTS)
        handed = dk.call("commit the agent's container", res.api.commit, cid,
                         conf={"Labels": res.labels()})["Id"]
        res.images.append(handed)
    dk.call("remove the agent's container", res.api.remove_container, cid, force=True, v=True)
    res.containers.remove(cid)
    return handed


def _verifier_phase(res: dk.Resources, task: HarborTask, task_dir: Path, image: str, result: TrialResult,
                    limits: TrialLimits, reward_key: str, reward_range: tuple[float, float], net: str,
                    handed: list | None, own: _OwnResolver, users: dict[str, str]) -> None:
    """`image` is the snapshot, or a separate verifier's image (`handed`: the artifacts)."""
    a = result.applied
    # A separate verifier built from tests/ owns /tests (Harbor uploads nothing there).
    bundled = handed is not None and task.verifier_build == "dockerfile"
    volumes = [(dk.volume(res, "verifier"), VERIFIER_DIR)]
    points = list(_MOUNT_POINTS[:2])
    if not bundled:
        volumes.append((dk.volume(res, "tests"), TESTS_DIR))
        points.append(_MOUNT_POINTS[2])
    if handed is not None:
        volumes.append((dk.volume(res, "artifacts"), artifacts.ARTIFACTS_DIR))
    env_config = _verifier_environment(task) if handed is not None else task.config.environment
    spec = _spec(task, image, result, a.verifier_timeout_s, task.config.verifier.env, tuple(volumes))
    if handed is not None:  # a separate verifier's own limits, capped by the profile as the agent's are
        spec = replace(spec, cpus=min(env_config.cpus or limits.cpus, limits.cpus),
                       memory_mb=min(env_config.memory_mb or limits.memory_mb, limits.memory_mb))
    cid = dk.create(res, replace(spec, network=net, workdir=env_config.workdir, tool=own.tool,
                                 env={**a.pinned_env, **env_config.env, **task.config.verifier.env}),
                    "verifier")
    dk.put_tree(res.api, cid, "/", points)  # the fresh volumes' roots, writable by any verifier user
    if not bundled:
        dk.put_tree(res.api, cid, "/", tree_entries(task_dir / "tests", TESTS_DIR.lstrip("/")))
    if handed is not None:
        dk.put_tree(res.api, cid, "/", handed)
    pid, oom_before, since = _started(res, cid)
    box = AgentContainer(cid, pid, oom_before, since)
    box.guarded = dk.settle_pid1(pid, own.tool)
    if handed is not None:  # a separate verifier's own image: its user, unless the task names one
        user = a.verifier_user or _image_defaults(res, image, a)[0]["verifier"]
        users = {**users, "verifier": user}
    _verify_in(res, task, box, result, limits, reward_key, reward_range, users, own.tool,
               lambda: _stop(res, cid, pid, oom_before, since),
               lambda: dk.read_tree(res.api, cid, VERIFIER_DIR,
                                    max(limits.max_output_bytes, MAX_REWARD_BYTES + 1),
                                    limits.max_listing_bytes),
               env={**a.pinned_env, **env_config.env, **task.config.verifier.env})


def _shared_verifier_phase(res: dk.Resources, task: HarborTask, task_dir: Path, box: AgentContainer,
                           result: TrialResult, limits: TrialLimits, reward_key: str,
                           reward_range: tuple[float, float], host: Path, own: _OwnResolver,
                           users: dict[str, str]) -> None:
    """The verifier in the agent's container (every process of the agent phase gone, /logs/verifier
    and /tests fresh): the task's tests/ written into /tests, ``test.sh`` run by the harness's
    program as the verifier user, the container killed, then the reward and the verifier's
    output read from the host directory bound at /logs/verifier."""
    dk.write_host_tree(host / HARNESS / "tests", tree_entries(task_dir / "tests", "tests"))
    _alone(box, own.tool)
    oom_before, since = oom_kills_of_pid(box.pid), time.time()
    _verify_in(res, task, box, result, limits, reward_key, reward_range, users, own.tool,
               lambda: _remove(res, box, oom_before, since),
               lambda: dk.read_host_tree(host / HARNESS, "verifier",
                                         max(limits.max_output_bytes, MAX_REWARD_BYTES + 1),
                                         limits.max_listing_bytes))


def _verified(result: TrialResult, tree: dk.Tree, ex: dk.Exec, oom: bool, limits: TrialLimits,
              reward_key: str, reward_range: tuple[float, float]) -> None:
    """The verifier phase's run, its files and the reward, from what it left in /logs/verifier."""
    out, cut_out = _text(tree, VERIFIER_STDOUT, limits.max_output_bytes)
    err, cut_err = _text(tree, VERIFIER_STDERR, limits.max_output_bytes)
    result.verifier_run = PhaseRun(exit_code=ex.exit_code, timed_out=ex.timed_out, oom_killed=oom,
                                   runtime_s=round(ex.runtime_s, 3), stdout=out, stderr=err,
                                   truncated=cut_out or cut_err)
    result.verifier_files = sorted(f.path for f in tree.entries if f.path != ".")
    _reward(result, tree, reward_key, reward_range)


LOGS_DIR = "/logs"
#: Below a shared trial's storage: the harness's own storage (a tmpfs of its own), holding what
#: the verifier's phase needs fresh: /logs/verifier, /tests and the resolver's files.
HARNESS = "harness"
#: The host directories of a one-container trial (below its private temporary directory):
#: bound at /logs (Harbor's log directories in it) and at /tests, made by the harness.
_HOST_DIRS = [("logs", 0o755), ("logs/agent", 0o777), ("logs/artifacts", 0o777), ("logs/verifier", 0o777),
              (f"{HARNESS}/verifier", 0o777), (f"{HARNESS}/tests", 0o755)]


class _OwnResolver:
    """What the harness binds into a trial's containers besides its host directories: its
    program (`tool`, the host directory of `validate.taskdir.trial.tool`) and, when `wanted`, the
    trial's own resolver (`validate.taskdir.trial.nsresolver`): its files written into the trial's
    capped storage (`prepare`) and mounted at the containers' creation, its sockets opened in
    a container's network namespace once PID 1 runs (before any command), the boundary once
    the agent's processes are dead (the files written again, and the namespace of a container
    started again, or of the verifier's own, attached), closed always."""

    def __init__(self) -> None:
        self.wanted = False
        self.tool: str | None = None
        self.host: Path | None = None
        self.hostname: str | None = None
        self.resolver: nsresolver.Resolver | None = None
        self.files: Path | None = None
        self.pid: int | None = None
        self._mounts: tuple = ()

    def prepare(self, host: Path, etc: Path, hostname: str) -> None:
        """The trial's storage is `host`; the resolver's files go to `etc` (hosts writable, as
        docker's own is: a task may add a name; written again at the boundary)."""
        self.host = host
        if self.wanted:
            self.files, self.hostname = etc, hostname
            self._mounts = tuple(nsresolver.mounts(self.files, hostname, hosts_writable=True))

    def mounts(self) -> tuple:
        return self._mounts

    def rewrite(self) -> None:
        """The resolver's files written again (what the agent made of them gone)."""
        if self.files is not None:
            nsresolver.mounts(self.files, self.hostname, hosts_writable=True)

    def started(self, pid: int) -> None:
        if self.wanted:
            try:
                self.resolver, self.pid = nsresolver.open(pid), pid
            except nsresolver.NamespaceError as e:
                raise dk.DockerFault(f"the trial's resolver: {e}") from None

    def boundary(self, pid: int) -> None:
        """The agent's lookups end here; the verifier's container is `pid`'s."""
        if self.resolver is None:
            return
        self.resolver.boundary()
        self.rewrite()
        self.follow(pid)

    def follow(self, pid: int) -> None:
        """Answer in `pid`'s network namespace from now on (a container started again, or the
        verifier's own): the same log, no new boundary."""
        if self.resolver is not None and pid != self.pid:
            try:
                self.resolver.attach(pid)
            except nsresolver.NamespaceError as e:
                raise dk.DockerFault(f"the trial's resolver: {e}") from None
            self.pid = pid

    def close(self) -> None:
        if self.resolver is not None:
            self.resolver.close()


def _shared_agent_phase(res: dk.Resources, task: HarborTask, image: str, plan, result: TrialResult,
                        limits: TrialLimits, resolver: network.Resolver | None, drive: AgentDriver | None,
                        host: Path, own: _OwnResolver, users: dict[str, str],
                        kill: bool = False) -> AgentContainer:
    """The agent phase of a trial whose verifier shares its environment: one container, the
    harness's host directories bound at /logs and /tests (empty), PID 1 the harness's program;
    the agent run; then every process but PID 1 killed (again after any restart), what the
    agent left recorded, both directories emptied. Returns the container, still running; with
    `kill` (a trusted trial), killed whole instead, and stopped."""
    a = result.applied
    for rel, mode in _HOST_DIRS:
        (host / rel).mkdir(exist_ok=True)
        os.chmod(host / rel, mode)
    # /logs/verifier and /tests on the harness's own storage (`HARNESS`), mounted in the
    # trial's: whatever the agent wrote anywhere it may, the harness can still make them
    # fresh and write the tests (the agent's own directories can be full)
    harness = host / HARNESS
    binds = [(host / "logs", LOGS_DIR), (harness / "verifier", VERIFIER_DIR), (harness / "tests", TESTS_DIR)]
    uploads = []
    # what goes under /logs is written there by the harness; a top directory of the uploads
    # (the oracle's /solution) is a directory of the harness's too, bound there: no archive
    # goes through the daemon; anything else (none of this harness's agents has one) does
    tops = sorted(p for p, _, data in plan.uploads if "/" not in p and data is None
                  and p not in ("logs", "tests"))
    for top in tops:
        (host / "uploads" / top).mkdir(parents=True)
        binds.append((host / "uploads" / top, f"/{top}"))
    for path, mode, data in plan.uploads:
        top, _, rest = path.partition("/")
        if top == "logs" and rest:
            dk.write_host_tree(host / "logs", [(path, mode, data)])
        elif top in tops:
            dk.write_host_tree(host / "uploads" / top, [(path, mode, data)])
        else:
            uploads.append((path, mode, data))
    spec = replace(_spec(task, image, result, a.agent_timeout_s + a.verifier_timeout_s, {}),
                   binds=tuple((str(h), c) for h, c in binds), tool=own.tool, mounts=own.mounts(),
                   hostname=own.hostname, cap=(limits.storage_mb, limits.storage_inodes))
    agent = start_agent(res, spec, uploads, resolver)
    own.started(agent.pid)
    result.pid1_guarded = agent.guarded
    run = play_agent(res, agent, task, plan, drive, users, result,
                     lambda: stop_agent(res, agent) if kill else _end_agent_processes(res, agent, result))
    running = not kill and dk.call("inspect a container", res.api.inspect_container,
                                   agent.cid)["State"].get("Running")
    if kill:
        pass
    elif running and dk.unreaped(agent.pid):
        # zombies PID 1 has not reaped would hold the pids limit in the verifier phase: the
        # container stops (everything dies with PID 1) and starts again
        dk.call("kill the container", res.api.kill, agent.cid)
        dk.call("wait for the container", res.api.wait, agent.cid, timeout=60)
        running = False
    if not running and not kill:
        # (or it was stopped by the kernel's OOM killer, else `_stopped_before` raised):
        # everything of the phase died with its PID 1; the container starts again with the
        # harness's program as PID 1 (never a program of the image's, which the agent may have
        # replaced), and is swept again: nothing may have started with it
        agent = AgentContainer(agent.cid, *_started(res, agent.cid))
        agent.guarded = result.pid1_guarded = dk.settle_pid1(agent.pid, own.tool)
        killed = dk.sweep_all_but_pid1(res.api, agent.cid, agent.pid)
        if killed:
            result.agent_processes_killed = (result.agent_processes_killed or 0) + killed
    logs = host / "logs"
    if plan.command is not None:
        out = _read_logs(res, agent.cid, logs, plan.output, limits.max_output_bytes,
                         limits.max_output_bytes * 2)
        run.stdout, run.truncated = _text(out, ".", limits.max_output_bytes)
    result.agent_run = run
    _record_left(result, dk.read_host_tree(harness, "verifier", MAX_REWARD_BYTES + 1,
                                           limits.max_listing_bytes))
    _fresh_dir(logs, LOGS_DIR, 0o755, keep=True)
    _fresh_dir(harness / "verifier", VERIFIER_DIR, 0o777, keep=False)
    _fresh_dir(harness / "tests", TESTS_DIR, 0o755, keep=False)
    return agent


def play_agent(res: dk.Resources, agent: AgentContainer, task: HarborTask, plan: AgentPlan,
               drive: AgentDriver | None, users: dict[str, str], result: TrialResult,
               stop: Callable[[], bool]) -> PhaseRun:
    """The agent phase in `agent`: its driver, else its plan's command (as the agent user,
    against its timeout); then `stop`, which says whether anything was OOM-killed. A daemon's
    fault meanwhile is named as `stopped_under` names it (OOM, or a `DockerFault`)."""
    a = result.applied
    env = {**a.pinned_env, **task.config.environment.env, **plan.env}
    run = PhaseRun()
    try:
        if drive is not None:
            run = drive(
                LiveAgent(
                    api=res.api,
                    cid=agent.cid,
                    user=users["agent"],
                    workdir=task.config.environment.workdir,
                    env=env,
                    timeout_s=a.agent_timeout_s,
                )
            )
        elif plan.command is not None:
            ex = dk.run_exec(res.api, agent.cid, plan.command, users["agent"], None, env, a.agent_timeout_s)
            run = PhaseRun(exit_code=ex.exit_code, timed_out=ex.timed_out, runtime_s=round(ex.runtime_s, 3))
    except dk.DockerFault as fault:
        run.oom_killed = stopped_under(res, agent, fault)
    else:
        run.oom_killed = stop()
    return run


def _end_agent_processes(res: dk.Resources, agent: AgentContainer, result: TrialResult) -> bool:
    """Every process of the agent phase but PID 1 killed (`dk.sweep_all_but_pid1`, counted in
    `TrialResult.agent_processes_killed`); whether anything was OOM-killed. A container
    that stopped before is named as `_stop` names it (OOM, or a `DockerFault`)."""
    oom_after = oom_kills_of_pid(agent.pid)
    state = dk.call("inspect a container", _state_once_heard, res, agent.cid, agent.pid)
    if not state.get("Running"):
        return _stopped_before(res, agent.cid, state, agent.since)
    try:
        result.agent_processes_killed = dk.sweep_all_but_pid1(res.api, agent.cid, agent.pid)
    except dk.DockerFault as fault:
        return stopped_under(res, agent, fault)
    if agent.oom_before is not None and oom_after is not None:
        return oom_after > agent.oom_before
    return bool(state.get("OOMKilled"))


def _remove(res: dk.Resources, box: AgentContainer, oom_before: int | None, since: float) -> bool:
    """The verifier's end: the container removed (every process in it killed; its files, in
    the harness's directories, stay); whether anything was OOM-killed in the verifier phase.
    A container that stopped before is named as `_stop` names it (OOM, or a `DockerFault`)."""
    oom_after = oom_kills_of_pid(box.pid)
    state = dk.call("inspect a container", _state_once_heard, res, box.cid, box.pid)
    if not state.get("Running"):
        return _stopped_before(res, box.cid, state, since)
    res.remove(box.cid)
    if oom_before is not None and oom_after is not None:
        return oom_after > oom_before  # (the daemon's flag may be the agent phase's, same container)
    return bool(state.get("OOMKilled"))


def _fresh_dir(path: Path, where: str, mode: int, *, keep: bool) -> None:
    """`path` a directory again, the harness's, `mode` (the agent may have chmodded, chowned,
    emptied or replaced it: a directory bound as a mount point cannot be replaced, its
    contents can); emptied unless `keep`. An error here is the harness's (`DockerFault`)."""
    try:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            os.mkdir(path)
        else:
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(path)
                os.mkdir(path)
            elif not keep:
                dk.empty_host_dir(path)
        os.chown(path, os.geteuid(), os.getegid(), follow_symlinks=False)
        os.chmod(path, mode)  # a directory now, not a link: no agent process is left to swap it
    except OSError as e:
        raise dk.DockerFault(
            f"docker: making {where} fresh for the verifier: {type(e).__name__}: {e}"
        ) from None


def _read_logs(res: dk.Resources, cid: str, logs: Path, path: str, per_file: int, budget: int) -> dk.Tree:
    """`path` of the container, read from the host directory bound at /logs when it is there."""
    if path.startswith(LOGS_DIR + "/"):
        return dk.read_host_tree(logs, path[len(LOGS_DIR) + 1:], per_file, budget)
    return dk.read_tree(res.api, cid, path, per_file, budget)


def _verifier_environment(task: HarborTask):
    """A separate verifier's environment: its own ``[verifier.environment]``, else a fresh
    copy of the task's (Harbor's rule)."""
    return task.config.verifier.environment or task.config.environment


def _reward(result: TrialResult, tree: dk.Tree, key: str, bounds: tuple[float, float]) -> None:
    """The reward, or the verifier error that stands in for it (never a pass, never a 0); and
    the record of what was read (`VerifierRecord`), which the audit reads again."""
    run = result.verifier_run
    failed = None
    if run.timed_out:
        failed = VerifierError(kind="timeout", detail=f"test.sh ran past its "
                               f"{result.applied.verifier_timeout_s:g} s timeout and was killed")
    elif run.oom_killed:
        failed = VerifierError(kind="oom", detail="the verifier ran out of memory")
    elif run.exit_code == harness_tool.KILLED and result.verifier_mode != "separate":
        failed = VerifierError(kind="killed", detail="test.sh was ended by a signal, not by its own exit: "
                                                     "what stands in its reward files is not its word")
    odd = [f for f in tree.entries if f.path in (REWARD_JSON, REWARD_TXT) and f.kind != "file"]
    if failed is None and odd:
        failed = VerifierError(kind="not_regular", file=odd[0].path,
                               detail=f"{odd[0].path} is a {odd[0].kind}, not a regular file")
    if failed is not None:
        result.verifier_error = failed
        result.record = VerifierRecord.of({}, key, *bounds, failed=f"{failed.kind}: {failed.detail}")
        return
    result.record = VerifierRecord.of(tree.files(), key, *bounds)
    got = read_reward(tree.files(), *bounds)
    if isinstance(got, RewardError):
        result.verifier_error = VerifierError(kind=got.kind, file=got.file, detail=got.detail)
    elif key not in got.values:
        result.verifier_error = VerifierError(
            kind="missing_key",
            file=got.source,
            detail=f"no key {key!r} (keys: {', '.join(sorted(got.values))})",
        )
    else:
        result.reward, result.rewards, result.reward_source = got.values[key], dict(got.values), got.source
        result.reward_decimal = got.exact.get(key)


def _text(tree: dk.Tree, path: str, cap: int) -> tuple[str, bool]:
    """A file of `tree` as text, cut at `cap` bytes; (text, whether it was cut)."""
    found = next((f for f in tree.entries if f.path == path), None)
    if found is None:
        return "", False
    if found.kind != "file" or found.data is None:
        return f"(not a regular file: a {found.kind})", False
    return found.data[:cap].decode("utf-8", "replace"), found.size > cap
