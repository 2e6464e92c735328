"""The container mechanics of a Harbor trial, over the Docker API: what is created, how a
command runs against the harness's clock, how files go in and come out, and the cleanup.

Everything a trial creates — containers, the snapshot image, volumes — carries the run's
label (`validate.sandbox.docker.wire.LABEL`) and the trial's own (`TRIAL_LABEL`), is
tracked by `Resources` as soon as docker names it, and is removed by `Resources.close`,
which also sweeps by the trial's label (a Ctrl-C between docker creating a thing and the
harness learning its id leaves nothing behind either). `sweep` removes what a killed run
left, by the run's label.

A container's PID 1 is ``sleep`` for the phase's time plus `BACKSTOP_S`: the harness kills
the container before that, but a harness that dies leaves nothing running past it. PID 1
of a pid namespace cannot be killed from inside it, so a container that stops on its own
was stopped by the kernel (OOM), the daemon or someone else: the harness asks docker which.

Files go in as tar archives the harness builds (`put_tree`) and come out as archives the
harness reads with byte caps (`read_tree`): nothing the agent wrote is followed (a link is
read as a link), nothing is read past a cap, and the daemon does the copying, so no command
of the (agent-modified) image runs on the harness's behalf.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
import time
from dataclasses import dataclass, field

import requests
from docker.errors import APIError, DockerException, NotFound
from docker.types import Mount

from validate.sandbox.docker.wire import LABEL

TRIAL_LABEL = f"{LABEL}.trial"
BACKSTOP_S = 60
#: Capabilities of docker's default set a task's agent or verifier never needs here.
CAP_DROP = ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "SYS_CHROOT"]
_POLL_S = (0.02, 0.25)


class DockerFault(Exception):
    """Docker failed the harness (an infrastructure error, never the agent's or verifier's)."""


class TaskFault(Exception):
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

    def labels(self) -> dict[str, str]:
        return {LABEL: self.run_label, TRIAL_LABEL: self.trial}

    def close(self) -> list[str]:
        """Remove containers (with their anonymous volumes), then volumes and images; then
        sweep by the trial's label. Returns what could not be removed (empty when clean)."""
        errors: list[str] = []
        # the task containers before the resolver whose network namespace they joined
        for cid in reversed(self.containers):
            _try(errors, f"container {cid[:12]}", self.api.remove_container, cid, force=True, v=True)
        for name in self.volumes:
            _try(errors, f"volume {name}", self.api.remove_volume, name, force=True)
        for image in self.images:
            # noprune: removing the snapshot must not take its parent, an untagged task image
            _try(errors, f"image {image[:19]}", self.api.remove_image, image, force=True, noprune=True)
        if not errors:
            errors += sweep(self.api, f"{TRIAL_LABEL}={self.trial}")
        return errors


def _try(errors: list[str], what: str, call, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except NotFound:
        pass
    except DOCKER_ERRORS as e:
        errors.append(f"{what}: {type(e).__name__}: {str(e)[:200]}")


def sweep(api, label_filter: str) -> list[str]:
    """Remove every container, volume and image carrying `label_filter` (``key=value``)."""
    errors: list[str] = []
    filters = {"label": label_filter}
    try:
        for c in api.containers(all=True, quiet=True, filters=filters):
            _try(errors, f"container {c['Id'][:12]}", api.remove_container, c["Id"], force=True, v=True)
        for v in (api.volumes(filters=filters) or {}).get("Volumes") or []:
            _try(errors, f"volume {v['Name']}", api.remove_volume, v["Name"], force=True)
        for image in api.images(all=True, quiet=True, filters=filters):
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
    #: "none", or "container:<id>": the namespace of the trial's resolver (`validate.trial.network`)
    network: str = "none"


def create(res: Resources, spec: Spec, name: str) -> str:
    """Create (not start) a phase's container: no network (at most the resolver's loopback),
    the limits, PID 1 a backstop sleep."""
    api = res.api
    mounts = [Mount(target=target, source=vol, type="volume", no_copy=True) for vol, target in spec.volumes]
    try:
        host = api.create_host_config(network_mode=spec.network, mem_limit=f"{spec.memory_mb}m",
                                      memswap_limit=f"{spec.memory_mb}m", nano_cpus=int(spec.cpus * 1e9),
                                      pids_limit=spec.pids, cap_drop=CAP_DROP, mounts=mounts,
                                      security_opt=["no-new-privileges"])
        cid = api.create_container(spec.image, entrypoint=["sleep", str(int(spec.lifetime_s) + BACKSTOP_S)],
                                   command=[], name=f"dv-{res.trial}-{name}", labels=res.labels(),
                                   user=spec.user or "", working_dir=spec.workdir or "",
                                   environment=dict(sorted(spec.env.items())),
                                   network_disabled=spec.network == "none",
                                   host_config=host)["Id"]
    except DOCKER_ERRORS as e:
        raise fault(f"create the {name} container from {spec.image[:19]}", e) from None
    res.containers.append(cid)
    return cid


def volume(res: Resources, name: str) -> str:
    vol = f"dv-{res.trial}-{name}"
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


def run_exec(api, cid: str, argv: list[str], user: str | None, workdir: str | None, env: dict[str, str],
             timeout_s: float) -> Exec:
    """Start `argv` detached in `cid` and wait for it by the harness's clock: a command that
    has not ended by `timeout_s` is ``timed_out`` (the caller kills the container; processes it
    left in the background do not hold the wait, only the command itself does). A client
    whose service never reports a detached exec as ended (``exec_attached``: podman's,
    `validate.sandbox.podman.limits.PodmanAPI`) is waited for attached (`_attached`)."""
    eid = call("exec create", api.exec_create, cid, argv, user=user or "", workdir=workdir,
               environment=dict(sorted(env.items())))["Id"]
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
            return Exec(exit_code=int(info["ExitCode"]), timed_out=False, runtime_s=runtime)
        if runtime >= timeout_s:
            return Exec(exit_code=None, timed_out=True, runtime_s=runtime)
        time.sleep(min(pause, max(0.0, timeout_s - runtime)))
        pause = min(pause * 1.5, _POLL_S[1])


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
                return Exec(exit_code=int(info["ExitCode"]), timed_out=False, runtime_s=runtime)
            if failed:
                raise fault("exec output", failed[0])
        if runtime >= timeout_s:
            return Exec(exit_code=None, timed_out=True, runtime_s=runtime)
        time.sleep(min(pause, max(0.0, timeout_s - runtime)))
        pause = min(pause * 1.5, _POLL_S[1])


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
        return None if f.data is None or len(f.data) < f.size else "sha256:" + hashlib.sha256(f.data).hexdigest()


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
                tree.entries.append(Found(path=rel or ".", kind=kind, size=m.size, data=data, mode=m.mode & 0o7777))
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
