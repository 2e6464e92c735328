"""A daemonless profile: bubblewrap namespaces, an unprivileged uid, cgroup v1 or v2 limits.

The launch chain, each step `exec`ing the next (but the first, which forks it)::

    sh (joins the attempt's cgroups; ulimit -f caps file size; keeps the
        status pipe's read end, see below; waits, then kills what is left of its group)
      → setpriv --reuid UID        (drop root *before* bwrap: a root-launched bwrap would
                                    map the sandbox uid back to host root)
      → bwrap --unshare-all --disable-userns --as-pid-1 --seccomp FD --json-status-fd FD
      → /usr/bin/timeout -s KILL (timeout_s + BACKSTOP_S)   (PID 1 of the sandbox)
      → python3 /agent/agent.py

The sandbox's root is the image's unpacked Debian rootfs, bound read-only (not the host's
``/``: no host sockets, no host ``/etc/shadow``), plus ``/proc``, a minimal ``/dev``, ``/tmp``
(the request's own directory, else a tmpfs) and the attempt's mounts. Limits come from a
fresh cgroup per attempt (memory without swap, pids, cpu quota), on cgroup v1 or v2
(`validate.sandbox.cgroups`, which also reads whether the OOM killer fired). The seccomp
filter (`validate.sandbox.seccomp`) refuses what docker's default profile refuses, nested
user namespaces first.

Agent or infrastructure is decided by bubblewrap's own status pipe, which the agent cannot
reach (bwrap closes it before the sandbox's first program starts): it reports ``child-pid``
once the sandbox's PID 1 exists, and ``exit-code`` at the end only if that PID 1 was
executed. No ``exit-code`` means the sandbox never started, whatever the exit code or
stderr (a cgroup join that failed, a bad mount, a missing program): an infrastructure
fault. With one, everything that happened is the agent's. On the harness's timeout the
sandbox's PID 1 is killed first, so that bwrap still reports the exit; then the rest.

Once the sandbox exists, bwrap's own monitor process and the shell above it are moved out
of the attempt's limited cgroup: an agent's OOM can then never take bwrap's report
with it. If the harness
is killed, the sandbox still ends at its backstop (its PID 1 is the watchdog). For that the
status pipe must outlive the harness: were its last reader gone, bwrap's next status write
would kill its monitor (SIGPIPE) half-way through the set-up, and bwrap's child would wait
forever for a go that never comes. The first shell holds a reader for that reason.


A live session's sandbox is launched exactly as a one-shot run's (`launch`: the same
cgroups, uid, seccomp filter, namespaces, mounts and watchdog as PID 1); its program is a
small stdlib command server (`validate.sandbox.bwrap.server`) that reads one request per
line from a pipe the harness holds (passed in as an inherited fd) and answers each on its
stdout. Every command is a child of that server, so it runs under all of the sandbox's
confinement — the seccomp filter included, which a process entered from outside with
``nsenter`` would not inherit; that, and one exec less per command, is why the server was
chosen over ``nsenter`` (docs/evaluation.md has the figures). The server kills a command's
process group at its timeout and keeps the head of its output. The harness exempts the
watchdog and the server from the OOM killer (oom_score_adj −1000) and reads an OOM kill off
the attempt's memory cgroup (``oom_kill`` before and after). A server that stops answering
is judged by the harness's own signals (`_gone`): bwrap's status pipe reporting no exit (its
monitor, outside the agent's reach, died) or a kill by the harness is a `SandboxError`; past
the deadline it is the watchdog (a timeout by the harness's clock); otherwise the sandbox
ran and ended, or its server was stopped, by something of the agent's uid (``kill -9
$PPID``): `SandboxEnded`. An outside SIGKILL of the sandbox's PID 1 cannot be told from that
(bwrap reports it as exit 137 either way) and counts as the agent's.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from validate.core.errors import ProfileUnavailable, SandboxError
from validate.core.paths import DEFAULT_IMAGE, ImagePaths
from validate.sandbox import seccomp
from validate.sandbox.base import (
    BackendFacts,
    Capabilities,
    ExecResult,
    Isolation,
    RunRequest,
    Sandbox,
    shield,
    supervise,
)
from validate.sandbox.bwrap import server
from validate.sandbox.bwrap.launch import Launch, bwrap_argv
from validate.sandbox.cgroups import Cgroups, open_cgroups
from validate.sandbox.image import rootfs_facts, unpack_rootfs
from validate.sandbox.session import SandboxEnded

#: Seconds bwrap may take to report the sandbox's exit once its command server has gone.
EXIT_GRACE_S = 5.0
#: How this profile isolates (recorded in the execution profile): bwrap itself runs as the
#: sandbox's uid (root is dropped before it starts), and no process in the sandbox is uid 0.
ISOLATION = Isolation(
    runtime="bwrap", rootless=True,
    root_maps_to="nothing: every process runs as uid 65534 (a task directory's image, "
                 "unpacked, belongs to it)",
    limit_enforcement={
        "memory_mb": "the harness's cgroup per sandbox; no swap", "pids": "the harness's cgroup per sandbox",
        "cpus": "the harness's cgroup per sandbox (cpu quota)",
        "timeout_s": "the harness kills the sandbox's PID 1; coreutils timeout as PID 1 kills it later",
        "storage_mb": "a size-capped tmpfs per attempt (a task directory's trial: its "
                      "overlay's writable layer)",
        "storage_inodes": "an inode-capped tmpfs per attempt (a task directory's trial: likewise)",
        "tmpfs_mb": "a tmpfs of that size at /tmp (a task directory's trial: the image's /tmp, "
                    "counted in storage_mb)",
        "max_file_mb": "RLIMIT_FSIZE (ulimit -f) before root is dropped",
        "max_log_bytes": "the harness keeps the head of each stream"})


@dataclass
class BwrapLive:
    """A live session's sandbox: its request and deadline (monotonic), its name (cgroups,
    launch), its launch, the write end of the server's request pipe, the server's answers."""

    request: RunRequest
    deadline: float
    name: str
    launch: Launch | None = None
    requests_w: int | None = None
    answers: server.Answers | None = None
    cgroups: list[Path] | None = None


class BwrapSandbox(Sandbox):
    backend = "bwrap"
    isolates_network = True
    #: a task's image built by docker, unpacked and played under overlays; one tree, so no
    #: separate verifier environment
    capabilities = Capabilities(trials="overlay", images="docker", shared_verifier=True,
                                trusted_verifier=True)

    def __init__(self, image: str = DEFAULT_IMAGE, run_label: str = "adhoc",
                 image_dir: Path | None = None) -> None:
        self.image = image
        self.paths = ImagePaths(image) if image_dir is None else ImagePaths(image, image_dir)
        self.run_label = run_label
        self._launches: dict[str, Launch] = {}
        self._lock = threading.Lock()
        #: The host's cgroup hierarchy (v1 or v2) the attempts' groups live in.
        self.hierarchy: Cgroups = open_cgroups()
        self._sweep()

    @classmethod
    def prepare_image(cls, paths: ImagePaths, log) -> None:
        unpack_rootfs(paths, log)

    #: sha256 of the seccomp program every sandbox of this backend runs under.
    @property
    def seccomp_sha256(self) -> str:
        return seccomp.filter_sha256()

    def _sweep(self) -> None:
        """Kill and remove what a killed earlier process of this same run left: the processes
        in its cgroups, the cgroups (its attempt storage: `open_sandbox`)."""
        self.hierarchy.sweep(self.run_label)

    def facts(self) -> BackendFacts:
        for tool in ("bwrap", "setpriv"):
            if shutil.which(tool) is None:
                raise ProfileUnavailable(f"backend bwrap: `{tool}` is not installed (apt-get install "
                                         "bubblewrap util-linux)")
        if os.geteuid() != 0:
            raise ProfileUnavailable("backend bwrap: the harness must run as root to create cgroups and "
                                     "drop to uid 65534")
        self.hierarchy.check()
        image = rootfs_facts(self.paths)  # refuses a tree that is not what rootfs.tar holds
        version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
        return BackendFacts(backend=self.backend, image=self.image, image_digest=image.digest,
                            architecture=_docker_arch(platform.machine()), version=version,
                            packages=image.packages, python=image.python, tree_digest=image.tree_digest,
                            seccomp=self.seccomp_sha256, cgroup=self.hierarchy.version, isolation=ISOLATION)

    def run(self, req: RunRequest) -> ExecResult:
        name = f"{self.run_label}-{req.name}"
        cgroups = self.cgroups(name, req)
        try:
            return self._run(req, name, cgroups)
        finally:
            self.hierarchy.remove(name)

    def launch(self, req: RunRequest, name: str, cgroups: list[Path],
               pass_fds: tuple[int, ...] = ()) -> Launch:
        """Start bwrap for `req` in `cgroups` and register it under `name` (`close` kills it);
        `pass_fds` reach the sandbox's program open. The caller awaits the sandbox."""
        status_r, status_w = os.pipe()
        try:
            seccomp_fd = seccomp.filter_fd()
        except BaseException:
            os.close(status_r)
            os.close(status_w)
            raise
        try:
            proc = subprocess.Popen(bwrap_argv(self.paths.rootfs, req, cgroups, status_w, seccomp_fd),
                                    stdin=status_r, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=(status_w, seccomp_fd, *pass_fds),
                                    start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        except OSError as e:
            os.close(status_r)
            raise SandboxError(f"bwrap: cannot start: {e}") from None
        finally:
            os.close(status_w)
            os.close(seccomp_fd)
        launch = Launch(proc, status_r, self.hierarchy, name)
        with self._lock:
            self._launches[name] = launch
        return launch

    def cgroups(self, name: str, req: RunRequest) -> list[Path]:
        """The attempt's cgroups (v1: memory, pids, cpu; v2: one), made and limited (`SandboxError`
        if not): those its launching shell joins."""
        return self.hierarchy.create(name, req.limits)

    def _run(self, req: RunRequest, name: str, cgroups: list[Path]) -> ExecResult:
        t0 = time.monotonic()
        launch = self.launch(req, name, cgroups)
        proc = launch.proc
        try:
            launch.await_sandbox()
            timed_out, stdout, stderr = supervise(proc, req.limits.timeout_s, req.limits.max_log_bytes,
                                                  kill=launch.kill)
            exit_code = launch.exit_code()
        finally:
            launch.close()
            with self._lock:
                self._launches.pop(name, None)
        if exit_code is None:
            raise SandboxError(f"bwrap: the sandbox did not start (bwrap reported no exit; it exited "
                               f"{proc.returncode}): {stderr[:300]!r}")
        oom = self.hierarchy.oom_killed(name)
        return ExecResult(exit_code=None if timed_out else exit_code, timed_out=timed_out, oom_killed=oom,
                          stdout=stdout, stderr=stderr, runtime_s=time.monotonic() - t0)

    def close(self) -> None:
        with self._lock:
            launches = list(self._launches.values())
        for launch in launches:
            launch.kill()

    # --- live sessions --------------------------------------------------------------------

    def start_session(self, request: RunRequest, deadline: float) -> BwrapLive:
        live = BwrapLive(request=request, deadline=deadline, name=f"{self.run_label}-{request.name}")
        try:
            self._start_server(live)
        except BaseException:
            self.stop_session(live)
            raise
        return live

    def _start_server(self, live: BwrapLive) -> None:
        live.cgroups = self.cgroups(live.name, live.request)
        req_r, live.requests_w = os.pipe()
        try:
            request = live.request.model_copy(
                update={"argv": ("python3", "-S", "-c", server.SERVER, str(req_r))}
            )
            live.launch = launch = self.launch(request, live.name, live.cgroups, pass_fds=(req_r,))
        finally:
            os.close(req_r)
        launch.await_sandbox()
        if not launch.pid1:
            raise SandboxError(f"bwrap session: the sandbox did not start: {_stderr(launch)}")
        live.answers = server.Answers(launch.proc.stdout.fileno())
        try:
            ready = live.answers.next(time.monotonic() + server.START_TIMEOUT_S)
        except server.NoAnswer as e:  # nothing of the agent's has run yet
            raise SandboxError(f"bwrap session: {e} before it was ready: {_stderr(launch)}") from None
        if ready != {"ready": True}:
            raise SandboxError("bwrap session: the command server did not say it is ready")
        shield(launch.pid1)  # now the server exists: it and the watchdog, never its commands

    def session_exec(self, live: BwrapLive, argv: tuple[str, ...], stdin: bytes, timeout_s: float,
                     keep: int) -> ExecResult:
        before = self.hierarchy.oom_kills(live.name)
        t0 = time.monotonic()
        try:
            view = memoryview(server.request_line(argv, stdin, timeout_s, keep))
            while view:
                view = view[os.write(live.requests_w, view):]
        except OSError as e:
            answer = self._gone(live, f"its request pipe failed ({e.strerror})")
        else:
            try:
                answer = live.answers.next(t0 + timeout_s + server.ANSWER_GRACE_S)
            except server.NoAnswer as e:
                answer = self._gone(live, str(e))
        after = self.hierarchy.oom_kills(live.name)
        oom = before is not None and after is not None and after > before
        try:
            return server.result(answer, oom, t0)
        # pydantic's ValidationError and binascii.Error are ValueErrors
        except (KeyError, TypeError, ValueError):
            return server.result(self._gone(live, f"an unreadable answer: {str(answer)[:200]!r}"), oom, t0)

    def _gone(self, live: BwrapLive, why: str) -> dict:
        """Judge a server that gave no answer (see the module): a timed-out answer when the
        session's deadline has passed, else `SandboxError` or `SandboxEnded`."""
        launch = live.launch
        if launch.killed:
            raise SandboxError(f"bwrap session: the harness ended the sandbox ({why})")
        try:
            launch.proc.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            # A server stopped or wedged by the agent: this sandbox serves no more. The kill
            # clears away what the agent broke; it is not the cause.
            launch.kill(cause=False)
            launch.proc.wait()
        exit_code = launch.exit_code()
        if exit_code is None:
            raise SandboxError(f"bwrap session: bwrap reported no exit of the sandbox ({why}): "
                               f"{_stderr(launch)}")
        if time.monotonic() >= live.deadline:
            return {"exit": None, "timed_out": True, "stdout": "", "stderr": ""}
        raise SandboxEnded(f"bwrap session: the sandbox ended under the agent's command before its deadline "
                           f"({why}; its PID 1 exited {exit_code}); the harness saw no cause of its own")

    def stop_session(self, live: BwrapLive) -> None:
        if live.requests_w is not None:
            os.close(live.requests_w)
            live.requests_w = None
        if live.launch is not None:
            live.launch.kill()
            live.launch.close()
        if live.cgroups is not None:
            with self._lock:
                self._launches.pop(live.name, None)
            self.hierarchy.remove(live.name)


def _stderr(launch: Launch) -> str:
    """The head of what bwrap wrote to stderr so far (never blocks)."""
    try:
        os.set_blocking(launch.proc.stderr.fileno(), False)
        return repr(launch.proc.stderr.read(300) or b"")
    except (OSError, TypeError, ValueError):
        return "''"


def _docker_arch(machine: str) -> str:
    """Docker's architecture names, so profiles compare across backends."""
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
