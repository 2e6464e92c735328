"""The container mechanics of a Harbor trial, over the Docker API: what is created, how a
command runs against the harness's clock, how files go in and come out, and the cleanup.

Everything a trial creates — containers, the snapshot image, volumes — carries the run's
label (`validate.sandbox.docker.wire.LABEL`) and the trial's own (`TRIAL_LABEL`), is
tracked by `Resources` as soon as docker names it, and is removed by `Resources.close`,
which also sweeps by the trial's label (a Ctrl-C between docker creating a thing and the
harness learning its id leaves nothing behind either). `sweep` removes what a killed run
left, by the run's label.

A container's PID 1 is the harness's own program (`validate.taskdir.trial.tool`, bound read-only
at `tool.MOUNT` and named by its absolute path: nothing the image's PATH, shell or dynamic
linker resolves starts it), which reaps every orphan and exits after the phase's time plus
`BACKSTOP_S`: the harness kills the container before that, but a harness that dies leaves
nothing running past it. It starts as root and runs under ids of the harness's
(`pid1_entrypoint`), out of every process's reach. PID 1 of a pid namespace cannot be killed
from inside it, so a container that stops on its own was stopped by the kernel (OOM), the
daemon or someone else: the harness asks docker which. Where the agent and the verifier
share one container, between the phases every other process of the container is killed
from the host (`sweep_all_but_pid1`).

Files go in as tar archives the harness builds (`put_tree`) and come out as archives the
harness reads with byte caps (`read_tree`): nothing the agent wrote is followed (a link is
read as a link), nothing is read past a cap, and the daemon does the copying, so no command
of the (agent-modified) image runs on the harness's behalf. A trial's own host directories,
bound into its container, are read, emptied and written the same way from the host
(`read_host_tree`, `empty_host_dir`, `write_host_tree`).
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import stat
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from docker.errors import APIError, DockerException, NotFound
from docker.types import Mount

from validate.core.errors import DaemonError, SandboxError, TaskError
from validate.sandbox.base import Limits
from validate.sandbox.cgroups import group_of_pid, procs_of
from validate.sandbox.docker.wire import LABEL
from validate.sandbox.storage import ensure_room, mount_tmpfs, remove_tree, unmount as storage_unmount
from validate.taskdir.trial import tool as harness_tool

TRIAL_LABEL = f"{LABEL}.trial"
#: Beside a capped container's writable layer: where the trusted verifier moves aside what it
#: must not see (`validate.taskdir.trial.layers.revert`); removed with the layer.
STASH = "dv-stash"
BACKSTOP_S = 60
#: Capabilities of docker's default set a task's agent or verifier never needs here.
CAP_DROP = ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "SYS_CHROOT"]
#: An exec's polls: the first soon (most commands of a trial take well under a second), then
#: slower by `_POLL_GROWTH` each, up to the second figure.
_POLL_S = (0.01, 0.25)
_POLL_GROWTH = 1.2
#: A guarded PID 1's real and effective uid (and gid): two ids, so that no process matches
#: all of PID 1's (real, effective, saved) as ptrace and ``/proc/1/mem`` demand without
#: CAP_SYS_PTRACE, which no container here has; and a credential change makes it non-dumpable.
PID1_IDS = (2147483001, 2147483002)
#: How long the harness waits for a guarded PID 1 to settle, and for a swept cgroup to empty.
SETTLE_S = 10.0


class DockerFault(DaemonError):
    """Docker failed the harness (an infrastructure error, never the agent's or verifier's)."""


class TaskFault(TaskError):
    """Docker refused what the task's own configuration asks for (a user its image lacks):
    the task's error, not the infrastructure's and not the agent's."""


def fault(what: str, error: BaseException) -> DockerFault:
    return DockerFault(f"docker: {what}: {type(error).__name__}: {str(error)[:300]}")


DOCKER_ERRORS = (DockerException, requests.RequestException)


@dataclass
class Resources:
    """What one trial created, removed by `close` whatever happened."""

    api: object
    run_label: str
    trial: str
    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    #: The kinds of thing this trial asked docker for (containers always): what `close` sweeps.
    kinds: list[str] = field(default_factory=lambda: ["containers"])
    #: Containers whose writable layer is on a tmpfs of the harness's (`cap_layer`): its layer
    #: directory, unmounted once the container is stopped and before it is removed.
    caps: dict[str, Path] = field(default_factory=dict)
    #: How many containers this trial created, and how many of them with a capped layer.
    made: int = 0
    made_capped: int = 0

    @property
    def capped(self) -> bool:
        """Every container of the trial had its writable layer capped (`cap_layer`)."""
        return self.made > 0 and self.made_capped == self.made

    def labels(self) -> dict[str, str]:
        return {LABEL: self.run_label, TRIAL_LABEL: self.trial}

    def uncap(self, cid: str) -> None:
        """Stop `cid` (if it runs) and unmount the tmpfs under its writable layer: the daemon
        can then remove the layer's directory as its own."""
        layer = self.caps.pop(cid, None)
        if layer is None:
            return
        try:
            if self.api.inspect_container(cid)["State"].get("Running"):
                self.api.kill(cid)
                self.api.wait(cid, timeout=60)
        finally:
            storage_unmount(layer)

    def remove(self, cid: str) -> None:
        """Remove `cid` with everything in it (its capped layer released first)."""
        if cid in self.caps:
            call("stop a capped container", self.uncap, cid)
        call("remove a container", self.api.remove_container, cid, force=True, v=True)
        if cid in self.containers:
            self.containers.remove(cid)

    def close(self) -> list[str]:
        """Remove containers (with their anonymous volumes), then volumes and images; then
        sweep by the trial's label. Returns what could not be removed (empty when clean)."""
        errors: list[str] = []
        # the task containers before the resolver whose network namespace they joined
        for cid in reversed(self.containers):
            if cid in self.caps:
                _try(errors, f"container {cid[:12]}", self.uncap, cid)
            _try(errors, f"container {cid[:12]}", self.api.remove_container, cid, force=True, v=True)
        for name in self.volumes:
            _try(errors, f"volume {name}", self.api.remove_volume, name, force=True)
        for image in self.images:
            # noprune: removing the snapshot must not take its parent, an untagged task image
            _try(errors, f"image {image[:19]}", self.api.remove_image, image, force=True, noprune=True)
        if not errors:
            errors += sweep(self.api, f"{TRIAL_LABEL}={self.trial}", tuple(self.kinds))
        return errors


def _try(errors: list[str], what: str, call, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except NotFound:
        pass
    except DOCKER_ERRORS as e:
        errors.append(f"{what}: {type(e).__name__}: {str(e)[:200]}")


def _uncap_left(api, cid: str) -> None:
    """A container a killed harness left with its writable layer on a tmpfs (`cap_layer`):
    stopped, and the tmpfs unmounted, so the daemon can remove it."""
    data = (api.inspect_container(cid).get("GraphDriver") or {}).get("Data") or {}
    layer = Path(data["UpperDir"]).parent if data.get("UpperDir") else None
    if layer is not None and os.path.ismount(layer):
        if api.inspect_container(cid)["State"].get("Running"):
            api.kill(cid)
            api.wait(cid, timeout=60)
        storage_unmount(layer)


def sweep(api, label_filter: str, kinds: tuple[str, ...] = ("containers", "volumes", "images")) -> list[str]:
    """Remove every container, volume and image (of `kinds`) carrying `label_filter` (``key=value``)."""
    errors: list[str] = []
    filters = {"label": label_filter}
    try:
        for c in api.containers(all=True, quiet=True, filters=filters) if "containers" in kinds else []:
            _try(errors, f"container {c['Id'][:12]}", _uncap_left, api, c["Id"])
            _try(errors, f"container {c['Id'][:12]}", api.remove_container, c["Id"], force=True, v=True)
        for v in (api.volumes(filters=filters) or {}).get("Volumes") or [] if "volumes" in kinds else []:
            _try(errors, f"volume {v['Name']}", api.remove_volume, v["Name"], force=True)
        for image in api.images(all=True, quiet=True, filters=filters) if "images" in kinds else []:
            _try(errors, f"image {image[:19]}", api.remove_image, image, force=True, noprune=True)
    except DOCKER_ERRORS as e:
        errors.append(f"sweep {label_filter}: {type(e).__name__}: {str(e)[:200]}")
    return errors


@dataclass(frozen=True)
class Spec:
    """One phase's container: its image, user, directory, environment, limits and mounts."""

    image: str
    lifetime_s: float
    user: str | None
    workdir: str | None
    env: dict[str, str]
    cpus: float
    memory_mb: int
    pids: int
    volumes: tuple[tuple[str, str], ...] = ()  # (volume name, mount point)
    binds: tuple[tuple[str, str], ...] = ()  # (host directory, mount point)
    #: The host directory of the harness's own program (`validate.taskdir.trial.tool.tool_dir`), bound
    #: read-only at `tool.MOUNT`: PID 1 runs it, started as root and guarded (`pid1_entrypoint`)
    tool: str | None = None
    #: "none", or "container:<id>": the namespace of the trial's resolver (`validate.taskdir.trial.network`)
    network: str = "none"
    #: further mounts (the harness's resolv.conf and hosts: `validate.taskdir.trial.nsresolver.mounts`)
    mounts: tuple = ()
    #: the container's hostname (None: docker's, its id's head)
    hostname: str | None = None
    #: (MiB, inodes): the container's writable layer on a tmpfs of that size (`cap_layer`)
    cap: tuple[int, int] | None = None


def cap_layer(res: Resources, cid: str, size_mb: int, inodes: int) -> bool:
    """Before `cid`'s first start: its writable layer (overlay2's ``diff`` and ``work``, with the
    layer's ``link`` and ``lower``) moved onto a tmpfs of `size_mb` MiB and `inodes` inodes
    mounted over the layer's directory, so that everything the container writes anywhere in
    its own filesystem counts against the contract's storage (and, being memory, its memory):
    a full layer is the trial's own ENOSPC, never the host disk's. False (nothing done) where the
    daemon's layers are not overlay2 directories of this machine."""
    graph = call("inspect a container", res.api.inspect_container, cid).get("GraphDriver") or {}
    data = graph.get("Data") or {}
    upper = data.get("UpperDir")
    if graph.get("Name") != "overlay2" or not upper or not os.path.isdir(upper):
        return False
    layer = Path(upper).parent
    kept = {name: (layer / name).read_bytes() for name in ("link", "lower") if (layer / name).is_file()}
    mount_tmpfs(layer, Limits(storage_mb=size_mb, storage_inodes=max(inodes, 16)), noexec=False)
    res.caps[cid] = layer
    os.chmod(layer, 0o710)
    for name, data_ in kept.items():
        (layer / name).write_bytes(data_)
    (layer / "diff").mkdir(mode=0o755)
    (layer / "work").mkdir(mode=0o700)
    # what the daemon and the harness make there later, made now: an agent that spends every
    # inode of its layer cannot keep the container from starting again, nor its changes from
    # being moved aside (`layers.revert`)
    (layer / "work" / "work").mkdir(mode=0o700)
    (layer / "merged").mkdir(mode=0o700)
    (layer / STASH).mkdir(mode=0o700)
    return True


#: What a capped layer keeps free for the harness each time its container starts: overlayfs
#: makes its work directory and probes again at every mount, and an agent may have spent
#: every inode and byte of the contract's storage.
START_ROOM = (64, 1 << 20)


def make_room(res: Resources, cid: str) -> bool:
    """Before `cid` starts (again): its capped layer (`cap_layer`) given `START_ROOM` free, grown
    past the contract's storage by at most that much a start. Whether it had to grow."""
    layer = res.caps.get(cid)
    if layer is None:
        return False
    try:
        return ensure_room(layer, *START_ROOM, noexec=False)
    except SandboxError as e:
        raise DockerFault(f"docker: {e}") from None


def create(res: Resources, spec: Spec, name: str) -> str:
    """Create (not start) a phase's container: no network (at most the resolver's loopback),
    the limits, PID 1 a backstop sleep."""
    api = res.api
    mounts = [Mount(target=target, source=vol, type="volume", no_copy=True) for vol, target in spec.volumes]
    mounts += [Mount(target=target, source=host, type="bind") for host, target in spec.binds]
    mounts += list(spec.mounts)
    if spec.tool is not None:
        mounts.append(Mount(target=harness_tool.MOUNT, source=spec.tool, type="bind", read_only=True))
    try:
        host = api.create_host_config(network_mode=spec.network, mem_limit=f"{spec.memory_mb}m",
                                      memswap_limit=f"{spec.memory_mb}m", nano_cpus=int(spec.cpus * 1e9),
                                      pids_limit=spec.pids, cap_drop=CAP_DROP, mounts=mounts,
                                      security_opt=["no-new-privileges"])
        # PID 1 starts as root to take the harness's ids; every exec names its own user
        user = "0" if spec.tool is not None else (spec.user or "")
        cid = api.create_container(spec.image,
                                   entrypoint=pid1_entrypoint(spec.lifetime_s, spec.tool is not None),
                                   command=[], name=f"dv-{res.trial}-{name}", labels=res.labels(), user=user,
                                   working_dir=spec.workdir or "", environment=dict(sorted(spec.env.items())),
                                   network_disabled=spec.network == "none", hostname=spec.hostname,
                                   host_config=host)["Id"]
    except DOCKER_ERRORS as e:
        raise fault(f"create the {name} container from {spec.image[:19]}", e) from None
    res.containers.append(cid)
    if spec.cap is not None and not cap_layer(res, cid, *spec.cap):
        raise DockerFault(f"docker: the {name} container's writable layer cannot be capped (not overlay2 on "
                          "this machine)")
    res.made += 1
    res.made_capped += spec.cap is not None
    return cid


def pid1_entrypoint(lifetime_s: float, tool: bool) -> list[str]:
    """PID 1: the harness's own program (`validate.taskdir.trial.tool`, by its absolute path on its
    read-only mount) for the phase's time plus `BACKSTOP_S`, dropping to real ids and
    effective ids `PID1_IDS` (no capabilities, non-dumpable, no uid a process can take matches
    all of its ids): no process of the container can ptrace it or write its memory; it reaps
    every orphan. Without the tool (a caller that binds none): a plain ``sleep``."""
    n = str(int(lifetime_s) + BACKSTOP_S)
    if not tool:
        return ["sleep", n]
    r, e = PID1_IDS
    return [harness_tool.BINARY, "init", n, str(r), str(e)]


def settle_pid1(pid: int, tool: str | None = None) -> bool:
    """Wait (bounded by `SETTLE_S`) until a started container's PID 1 (host pid `pid`) is ready:
    the harness's program (`tool`: its executable's inode, `validate.taskdir.trial.tool.is_tool`) once it
    has taken its ids (it names itself then), or a plain ``sleep``; whether it runs under
    `PID1_IDS`. `DockerFault` if it never is: no command of a phase runs before."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        try:
            status = read_status(pid)
        except OSError as e:
            raise DockerFault(f"docker: the container's PID 1 ({pid}) cannot be read: {e}") from None
        name = status.get("Name")
        ready = (name == harness_tool.READY and harness_tool.is_tool(pid, Path(tool))) if tool is not None \
            else name == "sleep"
        if ready:
            uids = status.get("Uid", "").split()
            return uids[:2] == [str(i) for i in PID1_IDS]
        if time.monotonic() > deadline:
            raise DockerFault(f"docker: the container's PID 1 ({pid}) is still {name!r} "
                              f"after {SETTLE_S:g} s")
        time.sleep(0.005)


def read_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as a dict of its fields."""
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in f)}


def pid_alive(pid: int) -> bool:
    """Whether host pid `pid` is a live process (not gone, not a zombie waiting to be reaped):
    a container whose PID 1 is not alive is stopping, whatever its daemon says for the moment
    it takes to hear of the exit (through the runtime's shim)."""
    try:
        return not read_status(pid).get("State", "").startswith(("Z", "X"))
    except OSError:
        return False


def sweep_all_but_pid1(api, cid: str, pid: int) -> int:
    """Every process of `cid` but its PID 1 (host pid `pid`) killed from the host: the
    container paused (the cgroup freezer: nothing forks or exits meanwhile), its cgroup's
    processes listed and SIGKILLed, unpaused, then waited for (bounded) until the cgroup
    holds PID 1 alone. Returns how many were killed; `DockerFault` naming what is left."""
    group = group_of_pid(pid)
    if group is None:
        raise DockerFault(f"docker: the cgroup of the container's PID 1 ({pid}) cannot be read")
    call("pause the container", api.pause, cid)
    try:
        frozen = [p for p in procs_of(group) if p != pid]
        for p in frozen:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        call("unpause the container", api.unpause, cid)
    deadline = time.monotonic() + SETTLE_S
    while True:
        held = procs_of(group)
        if held == [pid]:
            return len(frozen)
        if pid not in held or time.monotonic() > deadline:
            raise DockerFault(f"docker: the container's cgroup holds {held} after the sweep "
                              f"(PID 1 is {pid}; {len(frozen)} killed)")
        time.sleep(0.01)


def unreaped(pid: int, wait_s: float = 0.5) -> int:
    """How many tasks besides PID 1 (host pid `pid`) its container's pids controller still
    counts once the cgroup holds PID 1 alone: zombies of killed processes that were
    reparented to PID 1 (a ``sleep`` reaps none), which hold the container's pids limit.
    Waits up to `wait_s` for those the runtime reaps; 0 when unreadable."""
    group = group_of_pid(pid)
    deadline = time.monotonic() + wait_s
    while group is not None:
        try:
            left = int((group / "pids.current").read_text()) - 1
        except (OSError, ValueError):
            return 0
        if left <= 0 or time.monotonic() > deadline:
            return max(left, 0)
        time.sleep(0.02)
    return 0


def volume(res: Resources, name: str) -> str:
    vol = f"dv-{res.trial}-{name}"
    if "volumes" not in res.kinds:
        res.kinds.append("volumes")
    try:
        res.api.create_volume(vol, labels=res.labels())
    except DOCKER_ERRORS as e:
        raise fault(f"create volume {vol}", e) from None
    res.volumes.append(vol)
    return vol


def call(what: str, fn, *args, **kwargs):
    """A docker call whose failure is the infrastructure's: `DockerFault` naming `what`."""
    try:
        return fn(*args, **kwargs)
    except DOCKER_ERRORS as e:
        raise fault(what, e) from None


@dataclass
class Exec:
    exit_code: int | None
    timed_out: bool
    runtime_s: float
    #: The daemon's id of the exec (what its events name).
    exec_id: str = ""


def _exec_create(api, cid: str, argv: list[str], user: str | None, workdir: str | None,
                 env: dict[str, str]) -> str:
    """An exec created in `cid`. The harness pauses a container only to sweep it, and unpauses it
    before anything runs; a daemon that still says it is paused (seen once in 472 trials) is
    asked to unpause again, a few times, before that is a fault."""
    for tries in range(4):
        try:
            return api.exec_create(cid, argv, user=user or "", workdir=workdir,
                                   environment=dict(sorted(env.items())))["Id"]
        except APIError as e:
            if e.status_code != 409 or "paused" not in str(e.explanation or e) or tries == 3:
                raise fault("exec create", e) from None
            try:
                api.unpause(cid)
            except DOCKER_ERRORS:
                time.sleep(0.05 * (tries + 1))
        except DOCKER_ERRORS as e:
            raise fault("exec create", e) from None
    raise AssertionError("unreachable")


def run_exec(api, cid: str, argv: list[str], user: str | None, workdir: str | None, env: dict[str, str],
             timeout_s: float) -> Exec:
    """Start `argv` detached in `cid` and wait for it by the harness's clock: a command that
    has not ended by `timeout_s` is ``timed_out`` (the caller kills the container; processes it
    left in the background do not hold the wait, only the command itself does). A client
    whose service never reports a detached exec as ended (``exec_attached``: podman's,
    `validate.sandbox.podman.limits.PodmanAPI`) is waited for attached (`_attached`)."""
    eid = _exec_create(api, cid, argv, user, workdir, env)
    t0 = time.monotonic()
    attached = getattr(api, "exec_attached", False)  # podman: `_attached`
    try:
        stream = api.exec_start(eid, stream=True) if attached else api.exec_start(eid, detach=True)
    except APIError as e:
        if "unable to find user" in str(e.explanation or e):
            raise TaskFault(f"user {user!r} is not in the image ({str(e.explanation or e)[:200]})") from None
        raise fault("exec start", e) from None
    except DOCKER_ERRORS as e:
        raise fault("exec start", e) from None
    if attached:
        return _attached(api, eid, stream, t0, timeout_s)
    pause = _POLL_S[0]
    while True:
        info = call("exec inspect", api.exec_inspect, eid)
        runtime = time.monotonic() - t0
        if not info.get("Running") and info.get("ExitCode") is not None:
            return Exec(exit_code=int(info["ExitCode"]), timed_out=False, runtime_s=runtime, exec_id=eid)
        if runtime >= timeout_s:
            return Exec(exit_code=None, timed_out=True, runtime_s=runtime, exec_id=eid)
        time.sleep(min(pause, max(0.0, timeout_s - runtime)))
        pause = min(pause * _POLL_GROWTH, _POLL_S[1])


def _attached(api, eid: str, stream, t0: float, timeout_s: float) -> Exec:
    """Wait for an attached exec by the harness's clock: its output stream (drained and
    dropped: the harness's commands write theirs to files) ends when the command ends —
    the service closes it then, even while processes the command left in the background
    hold the same pipe — and exec inspect then gives the exit code. A command still
    running at `timeout_s` is ``timed_out``; the reader ends when the caller kills the
    container."""
    ended = threading.Event()
    failed: list[BaseException] = []

    def drain() -> None:
        try:
            for _chunk in stream:
                pass
        except (*DOCKER_ERRORS, OSError) as e:  # OSError: the connection dropped under the reader
            failed.append(e)
        finally:
            ended.set()

    threading.Thread(target=drain, name=f"exec-{eid[:12]}", daemon=True).start()
    ended.wait(max(0.0, timeout_s - (time.monotonic() - t0)))
    pause = _POLL_S[0]
    while True:
        runtime = time.monotonic() - t0
        if ended.is_set():
            info = call("exec inspect", api.exec_inspect, eid)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return Exec(exit_code=int(info["ExitCode"]), timed_out=False, runtime_s=runtime, exec_id=eid)
            if failed:
                raise fault("exec output", failed[0])
        if runtime >= timeout_s:
            return Exec(exit_code=None, timed_out=True, runtime_s=runtime, exec_id=eid)
        time.sleep(min(pause, max(0.0, timeout_s - runtime)))
        pause = min(pause * 1.5, _POLL_S[1])


def docker_time(t: float) -> str:
    """A wall-clock time as the daemon's API reads one: seconds, then nanoseconds (its parser
    reads the digits after the point as nanoseconds, so ``1.5`` would be 1 s and 5 ns)."""
    seconds = int(t)
    return f"{seconds}.{int((t - seconds) * 1e9):09d}"


def foreign_execs(api, cid: str, since: float, own: set[str]) -> list[str]:
    """The execs started in `cid` since `since` (the daemon's own events) that are not in
    `own`, sorted; `DockerFault` when the daemon's events cannot be read."""
    try:
        events = api.events(since=docker_time(since), until=docker_time(time.time()), decode=True,
                            filters={"type": "container", "container": cid})
        started = {str((e.get("Actor") or {}).get("Attributes", {}).get("execID", "")) for e in events
                   if str(e.get("Action", "")).startswith("exec_start")}
    except DOCKER_ERRORS as e:
        raise fault("read the container's events", e) from None
    return sorted(x for x in started if x not in own)


def tar_of(entries: list[tuple[str, int, bytes | None]]) -> bytes:
    """A tar of (path, mode, bytes) entries, owned by root (bytes None: a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path, mode, data in entries:
            info = tarfile.TarInfo(path)
            info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime = mode, 0, 0, "root", "root", 0
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def put_tree(api, cid: str, where: str, entries: list[tuple[str, int, bytes | None]]) -> None:
    if not call(f"upload to {where}", api.put_archive, cid, where, tar_of(entries)):
        raise DockerFault(f"docker: upload to {where} was refused")


@dataclass(frozen=True)
class Found:
    """An entry read out of a container: its path below the directory asked for."""

    path: str
    kind: str  # file, dir, symlink, other
    size: int
    data: bytes | None  # the first `per_file` bytes of a regular file
    mode: int = 0o644  # the permission bits the archive gave it


@dataclass
class Tree:
    entries: list[Found]
    truncated: bool = False

    def files(self) -> dict[str, bytes]:
        return {f.path: f.data for f in self.entries if f.kind == "file" and f.data is not None}

    def sha256(self, f: Found) -> str | None:
        return (
            None if f.data is None or len(f.data) < f.size else "sha256:" + hashlib.sha256(f.data).hexdigest()
        )


class _Budget(io.RawIOBase):
    """The archive stream as a file, ending (as if truncated) after `budget` bytes."""

    def __init__(self, chunks, budget: int) -> None:
        self.chunks, self.left, self.buf, self.cut = chunks, budget, b"", False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self.buf:
            if self.left <= 0:
                self.cut = True
                return 0
            chunk = next(self.chunks, b"")
            if not chunk:
                return 0
            self.buf, self.left = chunk[: self.left], self.left - len(chunk)
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n


def read_tree(api, cid: str, path: str, per_file: int, budget: int) -> Tree:
    """Every entry under `path` in `cid` (running or stopped), links as links, regular files
    read up to `per_file` bytes, the stream cut after `budget` bytes (`Tree.truncated`). A
    missing `path` is an empty tree."""
    try:
        stream, _stat = api.get_archive(cid, path, chunk_size=1 << 16)
    except NotFound:
        return Tree(entries=[])
    except DOCKER_ERRORS as e:
        raise fault(f"read {path}", e) from None
    raw = _Budget(iter(stream), budget)
    tree = Tree(entries=[])
    try:
        with tarfile.open(fileobj=io.BufferedReader(raw), mode="r|") as tf:
            for m in tf:
                _, _, rel = m.name.partition("/")
                kind = "file" if m.isreg() else "dir" if m.isdir() else "symlink" if m.issym() else "other"
                data = tf.extractfile(m).read(per_file) if m.isreg() else None
                tree.entries.append(Found(path=rel or ".", kind=kind, size=m.size, data=data,
                                          mode=m.mode & 0o7777))
    except (tarfile.TarError, EOFError, OSError) as e:
        if not raw.cut:
            raise fault(f"read {path}", e) from None
    except DOCKER_ERRORS as e:
        raise fault(f"read {path}", e) from None
    finally:
        close = getattr(stream, "close", None)
        if close:
            close()
    tree.truncated = raw.cut
    return tree


# --- a trial's own host directories, bind-mounted into its container ---------------------------
#
# The agent phase wrote into them: every name is opened relative to its directory's
# descriptor with O_NOFOLLOW (a link is read as a link, never followed out onto the host), a
# regular file is opened O_NONBLOCK and read only when its descriptor is one (a fifo never
# blocks the harness), and nothing is read past `per_file` per file nor `budget` in all.

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: What one entry costs of a listing's budget besides its bytes (as a tar header would).
ENTRY_COST = 512
#: Directory levels below the read one that a host listing goes (one descriptor held each).
MAX_DEPTH = 64


def _kind(mode: int) -> str:
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else \
        "symlink" if stat.S_ISLNK(mode) else "other"


def _read_file(dir_fd: int, name: str, st: os.stat_result, per_file: int) -> bytes | None:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return None
        chunks, left = [], per_file
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _open_parent(root: Path, rel: str) -> tuple[int, str] | None:
    """A descriptor of the directory holding `rel` (below `root`, every component opened
    without following a link) and the last name; None when a component is missing or no dir."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError:
        os.close(fd)
        return None
    return fd, (parts[-1] if parts else ".")


def read_host_tree(root: Path, rel: str, per_file: int, budget: int) -> Tree:
    """Every entry at and under `rel` in the host directory `root`, as `read_tree` gives a
    container's (paths below `rel`, ``.`` for itself, sorted; a missing `rel` is empty).
    A directory's descriptor is closed once its entries are read, and nothing deeper than
    `MAX_DEPTH` below `rel` is listed (``truncated``): the descriptors held at once are
    bounded however many directories, or how deep a chain of them, the agent made."""
    tree = Tree(entries=[])
    opened = _open_parent(root, rel)
    if opened is None:
        return tree
    parent, name = opened
    spent = 0
    # (directory descriptor, name in it, path in the tree, depth below `rel`)
    stack: list[tuple[int, str, str, int]] = [(parent, name, ".", 0)]
    pending = {parent: 1}  # each open directory's entries not yet read
    try:
        while stack:
            dir_fd, entry, path, depth = stack.pop()
            try:
                try:
                    st = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                if spent + ENTRY_COST > budget:
                    tree.truncated = True
                    break
                spent += ENTRY_COST
                kind = _kind(st.st_mode)
                data = _read_file(dir_fd, entry, st,
                                  min(per_file, budget - spent)) if kind == "file" else None
                if data is not None:
                    spent += len(data)
                    if len(data) < min(per_file, st.st_size):
                        tree.truncated = True
                tree.entries.append(Found(path=path, kind=kind, size=st.st_size if kind == "file" else 0,
                                          data=data, mode=st.st_mode & 0o7777))
                if kind != "dir":
                    continue
                if depth >= MAX_DEPTH:
                    tree.truncated = True
                    continue
                try:
                    sub = os.open(entry, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError:
                    continue
                names = sorted(os.listdir(sub), reverse=True)
                if not names:
                    os.close(sub)
                    continue
                pending[sub] = len(names)
                stack += [(sub, n, n if path == "." else f"{path}/{n}", depth + 1) for n in names]
            finally:
                pending[dir_fd] -= 1
                if pending[dir_fd] == 0:
                    del pending[dir_fd]
                    os.close(dir_fd)
    finally:
        for fd in pending:
            os.close(fd)
    tree.entries.sort(key=lambda f: (f.path != ".", f.path))
    return tree


def empty_host_dir(path: Path) -> None:
    """Remove everything in the host directory `path`, never following a link, however deep
    (`validate.sandbox.storage.remove_tree`; the directory itself stays: it is a container's
    mount point)."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        names = sorted(os.listdir(fd))
    finally:
        os.close(fd)
    for name in names:
        remove_tree(path / name)


def write_host_tree(root: Path, entries: list[tuple[str, int, bytes | None]]) -> None:
    """`entries` (as `tar_of` takes them, their first component `root` itself) written into
    the host directory `root`: files created new (O_EXCL, no link followed), directories
    made or, when there, given the entry's mode."""
    for path, mode, data in entries:
        rel = path.partition("/")[2]
        if not rel:
            os.chmod(root, mode)
            continue
        opened = _open_parent(root, rel)
        if opened is None:
            raise DockerFault(f"docker: cannot write {rel} into a trial directory")
        dir_fd, name = opened
        try:
            if data is None:
                try:
                    os.mkdir(name, mode, dir_fd=dir_fd)
                except FileExistsError:  # one the harness made: the entry's mode below
                    if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                        raise
                sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    os.fchmod(sub, mode)  # the umask left out of mkdir's
                finally:
                    os.close(sub)
            else:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                             dir_fd=dir_fd)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fchmod(fd, mode)
                finally:
                    os.close(fd)
        finally:
            os.close(dir_fd)
