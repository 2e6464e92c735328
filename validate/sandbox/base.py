"""The sandbox interface: one class per backend, for one-shot runs and live sessions alike.

A backend turns a `RunRequest` (argv, mounts, environment, limits) into an `ExecResult`.
A failed command is not a failed sandbox: the agent's non-zero exit, OOM kill or timeout
come back as data, and so does a sandbox the agent itself ends (its PID 1 runs as the
agent's uid); a sandbox that cannot start, or that a harness-side cause ends, raises
`SandboxError` (an infrastructure fault, which the runner retries).

Which of the two happened is decided from the harness's own signals (bubblewrap's status
pipe, the Docker daemon's state and events), never from what the agent controls: its exit
code, its output. Every backend runs the agent under a watchdog inside the sandbox
(`watchdog_argv`) that kills it `BACKSTOP_S` after its timeout even if the harness itself
was killed; the harness's own timeout stays the primary one and is what `timed_out` records.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from validate.core.errors import ProfileUnavailable, SandboxError, ValidateError
from validate.core.paths import ImagePaths

#: Seconds past `Limits.timeout_s` after which the watchdog inside the sandbox kills the agent:
#: late enough that the harness's own timeout always comes first while the harness lives.
BACKSTOP_S = 5.0


def watchdog_argv(argv: tuple[str, ...], timeout_s: float) -> list[str]:
    """`argv` under coreutils `timeout` as the sandbox's PID 1: when the backstop fires, or
    whenever PID 1 exits, the kernel kills everything left in the sandbox's pid namespace."""
    return ["/usr/bin/timeout", "-s", "KILL", f"{timeout_s + BACKSTOP_S:.3f}", *argv]


def shield(host_pid: int) -> None:
    """Make `host_pid` and its children exempt from the OOM killer (best effort, root)."""
    pids = [host_pid]
    try:
        pids += [int(p) for p in Path(f"/proc/{host_pid}/task/{host_pid}/children").read_text().split()]
    except (OSError, ValueError):
        pass
    for pid in pids:
        try:
            Path(f"/proc/{pid}/oom_score_adj").write_text("-1000")
        except OSError:
            pass


class Mount(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: Path = Field(description="Host path bound into the sandbox.")
    target: str = Field(description="Absolute path inside the sandbox.")
    read_only: bool = Field(default=True, description="Bind read-only.")


class Limits(BaseModel):
    """Resource limits of one attempt. Units in the names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_mb: int = Field(default=512, ge=16,
                           description="Memory of the sandbox, MiB, no swap (tmpfs pages count).")
    cpus: float = Field(default=1.0, gt=0, description="CPU quota, in cores.")
    pids: int = Field(default=64, ge=4, description="Processes and threads the sandbox may hold at once.")
    timeout_s: float = Field(default=60.0, gt=0, description=(
        "Wall-clock limit, seconds, enforced by the harness (recorded as timed_out) and, "
        "BACKSTOP_S later, by the watchdog inside the sandbox."))
    tmpfs_mb: int = Field(default=64, ge=1, description=(
        "Size, MiB, of the backend's own /tmp tmpfs; unused when the request brings its /tmp "
        "(`RunRequest.tmp`)."))
    max_file_mb: int = Field(default=64, ge=1, description=(
        "Largest file the agent may write, MiB (RLIMIT_FSIZE): bounds a disk filler or a huge reply."))
    max_log_bytes: int = Field(default=4096, ge=0, description=(
        "Bytes of stdout / stderr kept for the evidence (the head); the rest is drained and dropped. "
        "Docker's log driver keeps only the last MiB, so past 1 MiB of output the docker backend "
        "keeps the head of that last MiB."))
    storage_mb: int = Field(default=128, ge=1, description=(
        "Bytes, in MiB, of the attempt's own storage (workspace, /tmp, agent files), all on one "
        "size-capped tmpfs (validate.sandbox.storage): the sum of every file the agent writes."))
    storage_inodes: int = Field(default=4096, ge=16, description=(
        "Inodes (files, directories, symlinks) of the attempt's own storage, the tmpfs's nr_inodes."))


class RunRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    argv: tuple[str, ...] = Field(
        description="The agent's command, run under the watchdog (`watchdog_argv`)."
    )
    mounts: tuple[Mount, ...] = Field(default=(), description="Host paths bound into the sandbox.")
    env: dict[str, str] = Field(default={}, description="The agent's environment (nothing else is passed).")
    workdir: str = Field(default="/workspace",
                         description="The agent's working directory inside the sandbox.")
    limits: Limits = Field(default=Limits(), description="Resource limits of this attempt.")
    name: str = Field(description="A label for the sandbox instance (container name suffix, cgroup name); "
                                  "unique per run.")
    user: str = Field(default="65534:65534", pattern=r"^[1-9][0-9]*:[1-9][0-9]*$", description=(
        "uid:gid the agent runs as; never root (0 is refused)."))
    tmp: Path | None = Field(default=None, description=(
        "A host directory bound read-write at /tmp, so that /tmp counts against the attempt's "
        "storage; None gives the backend's own tmpfs of `limits.tmpfs_mb`."))

    @property
    def uid_gid(self) -> tuple[int, int]:
        uid, gid = self.user.split(":")
        return int(uid), int(gid)


class ExecResult(BaseModel):
    """What happened to the agent, once the harness knows the sandbox itself held."""

    exit_code: int | None = Field(description="The agent's exit status (a signal's is 128 + n); None when it "
                                               "timed out and the harness killed it.")
    timed_out: bool = Field(default=False,
                            description="The harness's own timeout fired and killed the sandbox.")
    oom_killed: bool = Field(default=False,
                             description="The kernel's OOM killer acted in the sandbox's cgroup.")
    stdout: bytes = Field(default=b"", description="The head of stdout, `Limits.max_log_bytes` at most.")
    stderr: bytes = Field(default=b"", description="The head of stderr, `Limits.max_log_bytes` at most.")
    runtime_s: float = Field(description="Wall-clock seconds from the start to the end of the sandbox.")


class Isolation(BaseModel):
    """How a profile isolates beyond what every backend shares: the OCI runtime, whether the
    engine runs without root, what the sandbox's root maps to, and how each limit of the
    contract is enforced there. Recorded by backends whose answer differs from rootful runc."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: str = Field(default="runc", description="the OCI runtime agents run under (runc, runsc)")
    rootless: bool = Field(default=False, description="the engine itself runs as an unprivileged user")
    root_maps_to: str = Field(default="root",
                              description="what the sandbox's uid 0 is on the host, e.g. 'uid 1001'")
    limit_enforcement: dict[str, str] = Field(default_factory=dict, description=(
        "limit name (memory_mb, pids, cpus, ...) → how it is enforced on this profile; a limit "
        "the runtime would silently ignore is enforced another way or the profile is refused"))


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers beyond one agent program in the harness's own image, declared on
    its class (`Sandbox.capabilities`). The harness asks these, never the backend's name: a
    new backend that declares them is played like the others, with no other file touched."""

    #: How it plays a task directory's trial (`validate.taskdir.trial.players`): ``engine``,
    #: containers of the task's own image through the Docker API its ``client`` speaks;
    #: ``overlay``, the image unpacked under an overlay of its own; None: it plays none.
    trials: str | None = None
    #: The engine that builds and holds task images for it (`validate.taskdir.images.docker`):
    #: ``docker`` (the daemon of ``DOCKER_HOST``) or ``podman`` (its rootless service); None:
    #: it needs none.
    images: str | None = None
    #: Its trials may verify in the agent's own container, once every agent process is dead
    #: (Harbor's mode, ``shared``).
    shared_verifier: bool = False
    #: Its trials may verify in a fresh environment of the pristine image with only the
    #: agent's work carried (``trusted``, `validate.taskdir.trial.trusted`).
    trusted_verifier: bool = False
    #: Its trials may verify in the task's own separate verifier environment (``separate``).
    separate_verifier: bool = False

    def verifier_modes(self) -> list[str]:
        """The verifier modes its trials offer, sorted."""
        return sorted(m for m, on in (("shared", self.shared_verifier), ("trusted", self.trusted_verifier),
                                      ("separate", self.separate_verifier)) if on)


class BackendFacts(BaseModel):
    """What a backend reports of itself; the contract's execution profile is checked against it."""

    backend: str = Field(description="registry name of the backend (docker, bwrap, subprocess)")
    image: str = Field(description="the sandbox image's name, e.g. deshuffle-validate-sandbox:bookworm")
    image_digest: str = Field(description="'sha256:<hex>' of the image's root filesystem tarball: docker's "
                                          "layer diff_id, bwrap's rootfs.tar; the same on every machine "
                                          "that built the same package versions ('none' without an image)")
    architecture: str = Field(description="CPU architecture in Docker's names (amd64, arm64)")
    version: str = Field(description="the backend's own version, e.g. 'docker 20.10.24+dfsg1'")
    packages: dict[str, str] = Field(default_factory=dict, description=(
        "the image's Debian packages, name → version, read from the image's dpkg status "
        "(empty for a backend without an image)"))
    python: str = Field(default="",
                        description="the image's Python version, e.g. '3.11.2' ('' without an image)")
    tree_digest: str | None = Field(default=None, description=(
        "bwrap: digest of the unpacked tree it runs, computed from the tree and equal to the "
        "tarball's (see validate.sandbox.image.tree_digest); None for other backends"))
    seccomp: str = Field(default="none", description=(
        "The syscall filter agents run under: bwrap's own 'sha256:<hex>' of the compiled BPF "
        "(validate.sandbox.seccomp); docker's built-in default profile of its version; 'none'"))
    cgroup: Literal["v1", "v2", "none"] = Field(default="none", description=(
        "The cgroup version the agents' limits are set through: bwrap's host hierarchy "
        "(validate.sandbox.cgroups.detect), the Docker daemon's CgroupVersion; 'none' for a "
        "backend that sets no cgroup limits (subprocess)"))
    isolation: Isolation | None = Field(default=None, description=(
        "recorded by profiles that differ from rootful runc (gVisor, rootless engines); None otherwise"))


class Sandbox(ABC):
    """One backend: its one-shot `run`, its live sessions, and what it needs of the image.

    Registered by name in the ``validate.backends`` entry-point group (`validate.sandbox`);
    made with ``cls(image=..., run_label=...)``. A backend without live sessions keeps the
    defaults of `start_session` / `session_exec` / `stop_session`, which refuse.
    """

    #: Registry name of the backend.
    backend: str
    #: True when the backend runs agents with no network (tasks with network_allow=[] need it).
    isolates_network: bool
    #: What it offers task directories (`Capabilities`); the default: nothing.
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: The label it was opened with: its containers, cgroups and attempt storage carry it, and
    #: opening a sandbox of this label sweeps what a killed process of it left.
    run_label: str

    @classmethod  # noqa: B027 - a hook whose default does nothing: only some backends override it
    def prepare_image(cls, paths: ImagePaths, log: Callable[[str], None]) -> None:
        """Make the image built at `paths` (its rootfs tarball and record, `validate.sandbox.image`)
        runnable by this backend, for `validate image build`; a backend that runs no image
        needs nothing."""

    @abstractmethod
    def facts(self) -> BackendFacts:
        """Probe the backend and its image; raise `ProfileUnavailable` if it cannot run."""

    @abstractmethod
    def run(self, request: RunRequest) -> ExecResult:
        """Run one agent in a fresh sandbox; raise `SandboxError` on an infrastructure fault."""

    def session(self, request: RunRequest) -> Session:
        """A live session of this backend for `request`, not yet started (`validate.sandbox.session`)."""
        return Session(self, request)

    # --- live sessions: the backend's side of `validate.sandbox.session.Session` ------------

    def start_session(self, request: RunRequest, deadline: float) -> object:
        """Create a live sandbox for `request`, its PID 1 a watchdog that ends it by itself;
        return this backend's own state of it (opaque to callers). `deadline` is the
        `time.monotonic` instant the request's time runs out. `SandboxError` if it cannot
        start, with nothing left behind."""
        raise ProfileUnavailable(f"execution.backend: {self.backend} has no live sessions")

    def session_exec(self, live: object, argv: tuple[str, ...], stdin: bytes, timeout_s: float,
                     keep: int) -> ExecResult:
        """Run one command in the live sandbox `live`; its own failure is data; a sandbox that
        died of a harness-side cause raises `SandboxError`, one that ended otherwise before the
        deadline `validate.sandbox.session.SandboxEnded`."""
        raise ProfileUnavailable(f"execution.backend: {self.backend} has no live sessions")

    def stop_session(self, live: object) -> None:  # noqa: B027 - nothing to stop without sessions
        """Remove the live sandbox `live` and everything in it; never raises."""

    def close(self) -> None:  # noqa: B027 - a backend with nothing to clean up keeps this default
        """Stop and remove everything still running. Safe to call twice."""


class SandboxEnded(ValidateError):
    """The sandbox ended under a command before its deadline and the harness saw no cause of
    its own: the agent's doing. Deliberately not a `SandboxError` (not retried as
    infrastructure); the attempt ends and is scored as it stands."""


class Session:
    """One live sandbox of `sandbox`'s backend, made from `request`."""

    def __init__(self, sandbox: Sandbox, request: RunRequest) -> None:
        self.sandbox, self.request = sandbox, request
        self.started_at: float | None = None
        self._stopped = False
        #: The backend's own state of the live sandbox (`Sandbox.start_session`), once started.
        self.live: object | None = None
        #: Why the agent ended the sandbox (`SandboxEnded`), once it did.
        self.ended: str | None = None

    @property
    def deadline(self) -> float:
        """`time.monotonic` instant at which the request's timeout runs out."""
        if self.started_at is None:
            raise SandboxError("session: not started")
        return self.started_at + self.request.limits.timeout_s

    def start(self) -> Session:
        if self.started_at is not None:
            raise SandboxError("session: already started")
        self.started_at = time.monotonic()
        try:
            self.live = self.sandbox.start_session(self.request, self.deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def exec(self, argv: Sequence[str], stdin: bytes = b"", timeout_s: float | None = None,
             max_output_bytes: int | None = None) -> ExecResult:
        """Run `argv` inside the sandbox (workdir, env and user of the request). `timeout_s`
        defaults to what is left of the request's; output beyond `max_output_bytes` (default
        ``limits.max_log_bytes``) is dropped."""
        if self.started_at is None or self._stopped:
            raise SandboxError("session: exec on a session that is not running")
        if self.ended is not None:
            raise SandboxEnded(self.ended)
        left = self.deadline - time.monotonic()
        timeout = left if timeout_s is None else min(timeout_s, left)
        keep = self.request.limits.max_log_bytes if max_output_bytes is None else max_output_bytes
        if timeout <= 0:
            return ExecResult(exit_code=None, timed_out=True, runtime_s=0.0)
        try:
            return self.sandbox.session_exec(self.live, tuple(argv), stdin, timeout, keep)
        except SandboxEnded as e:
            self.ended = str(e)
            raise

    def stop(self) -> None:
        """End the sandbox and everything in it. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        if self.live is not None:
            self.sandbox.stop_session(self.live)

    def __enter__(self) -> Session:
        return self if self.started_at is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


#: After the agent's exit, how long its pipes may stay open (a leftover process holding them
#: that `kill` could not reach) before what they hold is given up.
PIPE_GRACE_S = 10.0


def supervise(proc: subprocess.Popen, timeout_s: float, keep: int,
              kill: Callable[[], None]) -> tuple[bool, bytes, bytes]:
    """Wait for `proc` to exit, at most `timeout_s`, draining its stdout and stderr meanwhile.

    All in the calling thread, with one `poll` over the two pipes and a pidfd, which wakes it
    at the exit itself (``Popen.wait(timeout=)`` polls with sleeps growing to 50 ms, and a
    reader thread per pipe cost two thread starts per attempt). On the timeout `kill()` is
    called; after the exit it is called again, since nothing may outlive the attempt. Returns
    (timed out, the first `keep` bytes of stdout, of stderr); the rest is read and dropped.
    """
    assert proc.stdout is not None and proc.stderr is not None  # every caller pipes both
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    poller = select.poll()
    for fd in kept:
        poller.register(fd, select.POLLIN)
    open_pipes = len(kept)
    try:
        exit_fd = os.pidfd_open(proc.pid)
    except OSError as e:
        kill()
        proc.wait()
        raise SandboxError(f"cannot watch the agent's process (pidfd_open needs Linux ≥ 5.3): {e}") from None
    poller.register(exit_fd, select.POLLIN)

    def pump(until: float, stop_at_exit: bool) -> bool:
        """Read the pipes until `until`, the exit (if `stop_at_exit`) or both pipes' end;
        False when `until` came first."""
        nonlocal open_pipes
        while open_pipes or stop_at_exit:
            left = until - time.monotonic()
            if left <= 0:
                return False
            for fd, _ in poller.poll(left * 1000):
                if fd == exit_fd:
                    return True
                chunk = os.read(fd, 65536)
                if not chunk:
                    poller.unregister(fd)
                    open_pipes -= 1
                elif len(kept[fd]) < keep:
                    kept[fd] += chunk[: keep - len(kept[fd])]
        return True

    try:
        timed_out = not pump(time.monotonic() + timeout_s, stop_at_exit=True)
        if timed_out:
            kill()
        proc.wait()
        poller.unregister(exit_fd)
        kill()
        pump(time.monotonic() + PIPE_GRACE_S, stop_at_exit=False)
    finally:
        os.close(exit_fd)
        proc.stdout.close()
        proc.stderr.close()
    out, err = kept.values()
    return timed_out, bytes(out), bytes(err)
