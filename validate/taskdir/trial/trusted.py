"""The trusted verifier: a Harbor trial verified in a fresh container of the task's pristine
image, into which only the agent's changes under the task's work paths are carried
(`validate.taskdir.trial.workpaths`), so that nothing the agent did to the system — a replaced
interpreter, a shell earlier on PATH, a ``.pth`` or ``conftest.py`` hook, ``/etc/ld.so.preload``
— is in the verifier's way. Harbor's shared verifier (the agent's own container) stays
available as the contract's explicit choice (`validate.taskdir.trial.run`).

The sequence, over the Docker API (docker and rootless podman alike; nothing of the host is
bound but the harness's program, read-only, and the trial resolver's files):

1. **Agent phase.** A container of the task image, PID 1 the harness's program
   (`validate.taskdir.trial.tool`), Harbor's log directories and the agent's files put in by the
   daemon; the agent's command run as its user; then the container killed (everything the
   phase started dies with it).
2. **Between.** What the agent left in ``/logs/verifier`` read and recorded; the daemon's
   diff of the container split into the changes carried (under a work path) and the rest,
   recorded as evidence (`Change`); the carried subtrees read out of the stopped container.
3. **Verifier phase.** A second container of the same pristine image, PID 1 the harness's
   program; the agent's deletions under the work paths removed (by the harness's program),
   its carried subtrees put in (devices, fifos and sockets dropped, named), fresh
   ``/logs/verifier`` and the task's ``tests/`` at ``/tests``; ``test.sh`` run by the
   harness's program against the verifier timeout; the container killed before its files are
   read; the reward read with the shared rule (`validate.taskdir.trial.run._verified`).
4. **Replay in the agent's environment** (only when asked, for the reference solution whose
   trusted verifier did not pass while it changed paths outside its work paths): the agent's
   container started again (no process of its phase is left: it was killed), its
   ``/logs/verifier`` and ``/tests`` fresh, the verifier run there: its reward
   (`TrialResult.shared_reward`) says whether the task needs the agent's system changes.
"""

from __future__ import annotations

import os
import posixpath
import tarfile
import threading
from dataclasses import replace
from pathlib import Path

from environment.harbor.reward import MAX_REWARD_BYTES
from environment.harbor.taskdir import HarborTask
from validate.sandbox.storage import remove_tree
from validate.taskdir.trial import docker as dk, layers, tool as harness_tool, workpaths
from validate.taskdir.trial.agents import tree_entries
from validate.taskdir.trial.result import TrialLimits, TrialResult

#: Entries of the carried changes listed on an attempt, at most (the count is kept whole).
MAX_LISTED = 200


def local_trial(core, res: dk.Resources, task: HarborTask, task_dir: Path, image: str, plan,
                result: TrialResult, limits: TrialLimits, drive, own, users: dict[str, str],
                work: workpaths.WorkPaths, reward_key: str, reward_range: tuple[float, float],
                replay_below: float | None) -> None:
    """The trusted trial on this machine's own daemon (root, the overlay2 driver): the agent's
    container with the harness's host directories bound (as the shared trial's), killed whole
    when the agent is done — every process of the phase dead; its writable layer read where
    it lies (`layers.diff`: the changes the daemon's diff would list, without the daemon
    mounting the container for it) and made to hold only the carried changes (`layers.revert`:
    everything else moved aside, so the image's own files show again); the container started
    again with a fresh PID 1 of the harness's, fresh /logs/verifier and /tests: the task's
    pristine image with only the agent's work, where the verifier runs as in every mode. The
    reference solution that does not pass there and changed the system gets its own layer back
    and the verifier again (its reward: `TrialResult.shared_reward`)."""
    host = own.host
    agent = core._shared_agent_phase(res, task, image, plan, result, limits, None, drive, host, own, users,
                                     kill=True)
    upper, lowers = _layers(res, agent.cid)
    changes, cut = layers.diff(upper, lowers)
    carry = workpaths.plan(changes, work)
    _record_plan(result, work, carry, cut)
    reverted = layers.revert(upper, upper.parent / STASH, (*carry.copy, *carry.delete), work.all())
    result.dropped = [*result.dropped, *reverted.dropped]
    _fresh_logs(own.host / "logs")
    maybe = replay_below is not None and result.outside_changes_total > 0  # else nothing plays after it
    _verify_again(core, res, task, task_dir, agent, result, limits, reward_key, reward_range, own, users,
                  keep=maybe)
    if not maybe or result.passed(replay_below):
        return
    if not reverted.restore():  # the agent's own layer again: does the task need what it changed?
        return  # what ran since changed a directory it goes back into: no replay, nothing followed
    shadow = result.model_copy(deep=True)
    _verify_again(core, res, task, task_dir, agent, shadow, limits, reward_key, reward_range, own, users,
                  replay=True)
    result.shared_replayed, result.shared_record = True, shadow.record
    result.shared_reward = shadow.reward if shadow.verifier_error is None else None


STASH = dk.STASH


def _fresh_logs(logs: Path) -> None:
    """/logs as a trusted verifier finds it: the agent's artifacts and the harness's
    /logs/verifier (a mount point of its own), an empty /logs/agent, nothing else the agent put
    there (read already: its output is on the attempt)."""
    fd = os.open(logs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        names = sorted(os.listdir(fd))
    finally:
        os.close(fd)
    for name in names:
        if name not in ("artifacts", "verifier"):
            remove_tree(logs / name)
    (logs / "agent").mkdir(mode=0o777)
    os.chmod(logs / "agent", 0o777)


def _verify_again(core, res: dk.Resources, task: HarborTask, task_dir: Path, agent, result: TrialResult,
                  limits: TrialLimits, reward_key: str, reward_range: tuple[float, float], own,
                  users: dict[str, str], replay: bool = False, keep: bool = True) -> None:
    """The (stopped) container started again — PID 1 the harness's program, fresh /logs/verifier
    and /tests of the harness's — and the verifier run in it, then the container stopped (`keep`)
    or removed with everything in it (one call fewer)."""
    harness = own.host / core.HARNESS
    own.rewrite()
    core._fresh_dir(harness / "verifier", core.VERIFIER_DIR, 0o777, keep=False)
    core._fresh_dir(harness / "tests", core.TESTS_DIR, 0o755, keep=False)
    dk.write_host_tree(harness / "tests", tree_entries(task_dir / "tests", "tests"))
    pid, oom_before, since = core._started(res, agent.cid)
    box = core.AgentContainer(agent.cid, pid, oom_before, since)
    box.guarded = result.pid1_guarded = dk.settle_pid1(pid, own.tool)
    if replay:
        own.follow(pid)  # the same verifier's phase for the resolver's log: no new boundary
    else:
        own.boundary(pid)
    core._alone(box, own.tool)
    end = (lambda: core._stop(res, agent.cid, pid, oom_before, since)) if keep else \
        (lambda: core._remove(res, box, oom_before, since))
    core._verify_in(res, task, box, result, limits, reward_key, reward_range, users, own.tool, end,
                    lambda: dk.read_host_tree(harness, "verifier",
                                              max(limits.max_output_bytes, MAX_REWARD_BYTES + 1),
                                              limits.max_listing_bytes))


def changes_of(res: dk.Resources, cid: str) -> tuple[list[dict], bool]:
    """A container's changes (and whether the listing was cut): read from its writable layer on
    this machine's disk (overlay2), else the daemon's diff. Its agent's processes are dead."""
    try:
        upper, lowers = _layers(res, cid)
    except dk.DockerFault:
        return dk.call("diff the agent's container", res.api.diff, cid) or [], False
    return layers.diff(upper, lowers)


def _layers(res: dk.Resources, cid: str) -> tuple[Path, list[Path]]:
    """A container's writable layer and its lower layers on this machine's disk (overlay2)."""
    graph = dk.call("inspect a container", res.api.inspect_container, cid).get("GraphDriver") or {}
    data = graph.get("Data") or {}
    if graph.get("Name") != "overlay2" or not data.get("UpperDir"):
        raise dk.DockerFault(f"docker: the container's layers are not overlay2's ({graph.get('Name')!r})")
    return Path(data["UpperDir"]), [Path(p) for p in str(data.get("LowerDir") or "").split(":") if p]


def _record_plan(result: TrialResult, work: workpaths.WorkPaths, carry: workpaths.Plan, cut: bool) -> None:
    result.work_paths, result.named_paths = list(work.full), list(work.named)
    result.carried, result.carried_total = list(carry.copy[:MAX_LISTED]), len(carry.copy)
    result.outside_changes, result.outside_changes_total = (
        list(carry.outside[:MAX_LISTED]),
        len(carry.outside),
    )
    if cut:
        result.dropped = [f"(the agent's changes past {layers.MAX_ENTRIES} entries were not read)"]


def agent_phase(core, res: dk.Resources, task: HarborTask, image: str, plan, result: TrialResult,
                limits: TrialLimits, resolver, drive, own, users: dict[str, str]):
    """Run the agent in its own container; return it, stopped (`core` is `validate.taskdir.trial.run`)."""
    a = result.applied
    spec = replace(core._spec(task, image, result, a.agent_timeout_s, plan.env), tool=own.tool,
                   mounts=own.mounts(), hostname=own.hostname)
    agent = core.start_agent(res, spec, plan.uploads, resolver)
    own.started(agent.pid)
    result.pid1_guarded = agent.guarded
    run = core.play_agent(res, agent, task, plan, drive, users, result, lambda: core.stop_agent(res, agent))
    if plan.command is not None:
        out = dk.read_tree(res.api, agent.cid, plan.output, limits.max_output_bytes,
                           limits.max_output_bytes * 2)
        run.stdout, run.truncated = core._text(out, ".", limits.max_output_bytes)
    result.agent_run = run
    core._record_left(result, dk.read_tree(res.api, agent.cid, core.VERIFIER_DIR, MAX_REWARD_BYTES + 1,
                                            limits.max_listing_bytes))
    return agent


def verifier_phase(core, res: dk.Resources, task: HarborTask, task_dir: Path, image: str, agent,
                   result: TrialResult, limits: TrialLimits, reward_key: str,
                   reward_range: tuple[float, float], own, users: dict[str, str],
                   work: workpaths.WorkPaths) -> None:
    """The verifier in a fresh container of `image` with the agent's carried changes."""
    a = result.applied
    diff = dk.call("diff the agent's container", res.api.diff, agent.cid) or []
    carry = workpaths.plan(diff, work)
    result.work_paths, result.named_paths = list(work.full), list(work.named)
    result.outside_changes = list(carry.outside[:MAX_LISTED])
    result.outside_changes_total = len(carry.outside)
    spec = replace(core._spec(task, image, result, a.verifier_timeout_s, {}), tool=own.tool,
                   mounts=own.mounts(), hostname=own.hostname)
    cid = dk.create(res, spec, "verifier")
    pid, oom_before, since = core._started(res, cid)
    box = core.AgentContainer(cid, pid, oom_before, since)
    box.guarded = dk.settle_pid1(pid, own.tool)
    own.boundary(pid)
    # whatever the image holds at /logs/verifier and /tests goes (a stale reward baked in), and
    # what the agent deleted under its work paths; then the fresh directories and the tests
    _remove_in(res, cid, [core.VERIFIER_DIR, core.TESTS_DIR, *carry.delete])
    dk.put_tree(res.api, cid, "/",
                core._LOG_DIRS + tree_entries(task_dir / "tests", core.TESTS_DIR.lstrip("/")))
    result.carried, result.dropped = list(carry.copy[:MAX_LISTED]), carry_over(res.api, agent.cid, cid,
                                                                               carry.copy)
    result.carried_total = len(carry.copy)
    core._verify_in(res, task, box, result, limits, reward_key, reward_range, users, own.tool,
                    lambda: core._stop(res, cid, pid, oom_before, since), read=_reader(res, cid, limits))


def replay_shared(core, res: dk.Resources, task: HarborTask, task_dir: Path, agent, result: TrialResult,
                  limits: TrialLimits, reward_key: str, reward_range: tuple[float, float], own,
                  users: dict[str, str]) -> None:
    """The verifier again, in the agent's own (stopped) container started again: the reward it
    gives there is `TrialResult.shared_reward` (the trusted result stays the trial's)."""
    pid, oom_before, since = core._started(res, agent.cid)
    box = core.AgentContainer(agent.cid, pid, oom_before, since)
    box.guarded = dk.settle_pid1(pid, own.tool)
    own.follow(pid)
    _remove_in(res, agent.cid, [core.VERIFIER_DIR, core.TESTS_DIR])
    dk.put_tree(res.api, agent.cid, "/", [e for e in core._LOG_DIRS if e[0] in ("logs", "logs/verifier")]
                + tree_entries(task_dir / "tests", core.TESTS_DIR.lstrip("/")))
    shadow = result.model_copy(deep=True)
    core._verify_in(res, task, box, shadow, limits, reward_key, reward_range, users, own.tool,
                    lambda: core._stop(res, agent.cid, pid, oom_before, since),
                    read=_reader(res, agent.cid, limits))
    result.shared_replayed = True
    result.shared_reward = shadow.reward if shadow.verifier_error is None else None
    result.shared_record = shadow.record


def _remove_in(res: dk.Resources, cid: str, paths: list[str]) -> None:
    """`paths` removed in `cid` (running, nothing of the agent's alive in it) by the harness's
    program, as root, never following a link; its failure is the harness's (`DockerFault`)."""
    done = dk.run_exec(res.api, cid, [harness_tool.BINARY, "rm", *paths], "0", None, {}, 120)
    if done.exit_code != 0:
        raise dk.DockerFault(f"docker: the harness's program could not remove {', '.join(paths[:5])} "
                             f"(exit {done.exit_code})")


def _reader(res: dk.Resources, cid: str, limits: TrialLimits):
    per_file = max(limits.max_output_bytes, MAX_REWARD_BYTES + 1)
    return lambda: dk.read_tree(res.api, cid, "/logs/verifier", per_file, limits.max_listing_bytes)


def carry_over(api, src: str, dst: str, paths: tuple[str, ...]) -> list[str]:
    """Copy each of `paths` (a subtree) from container `src` into `dst` in one archive, streamed
    through a pipe (the harness holds no more than a chunk); return the devices, fifos and
    sockets left out. Links stay links; a hard link's target is renamed with its subtree."""
    if not paths:
        return []
    dropped: list[str] = []
    failed: list[BaseException] = []
    read_fd, write_fd = os.pipe()

    def produce() -> None:
        try:
            with os.fdopen(write_fd, "wb") as sink, tarfile.open(fileobj=sink, mode="w|",
                                                                 format=tarfile.PAX_FORMAT) as out:
                for path in paths:
                    _copy_one(api, src, path, out, dropped)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer's thread
            failed.append(e)

    writer = threading.Thread(target=produce, name="carry", daemon=True)
    writer.start()
    try:
        with os.fdopen(read_fd, "rb") as source:
            dk.call("put the agent's changes into the verifier's container", api.put_archive, dst, "/",
                    source)
    finally:
        writer.join()
    if failed:
        e = failed[0]
        raise e if isinstance(e, dk.DockerFault) else dk.fault("read the agent's changes", e)
    return sorted(dropped)


def _copy_one(api, src: str, path: str, out: tarfile.TarFile, dropped: list[str]) -> None:
    try:
        stream, _ = api.get_archive(src, path, chunk_size=1 << 16)
    except dk.NotFound:
        return
    except dk.DOCKER_ERRORS as e:
        raise dk.fault(f"read {path}", e) from None
    parent = posixpath.dirname(path).lstrip("/")
    raw = dk._Budget(iter(stream), 1 << 62)
    try:
        with tarfile.open(fileobj=_Buffered(raw), mode="r|") as tf:
            for m in tf:
                name = posixpath.join(parent, m.name)
                if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
                    dropped.append("/" + name)
                    continue
                m.name = name
                if m.islnk():
                    m.linkname = posixpath.join(parent, m.linkname)
                out.addfile(m, tf.extractfile(m) if m.isreg() else None)
    finally:
        close = getattr(stream, "close", None)
        if close:
            close()


class _Buffered:
    """A `dk._Budget` as the minimal file object tarfile's stream mode reads."""

    def __init__(self, raw) -> None:
        import io
        self._f = io.BufferedReader(raw)

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)
