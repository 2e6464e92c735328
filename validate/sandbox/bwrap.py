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
"""

from __future__ import annotations

import json
import os
import platform
import select
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from validate.errors import ProfileUnavailable, SandboxError
from validate.paths import DEFAULT_IMAGE, ImagePaths
from validate.sandbox import seccomp
from validate.sandbox.base import BackendFacts, ExecResult, RunRequest, Sandbox, supervise, watchdog_argv
from validate.sandbox.cgroups import Cgroups, open_cgroups

SANDBOX_UID = 65534
#: Seconds bwrap may take to create the sandbox's PID 1 before the start counts as failed.
START_TIMEOUT_S = 30.0
# Join the attempt's cgroups and cap file size (ulimit -f counts 512-byte blocks), then run
# the rest of the chain with stdin from /dev/null: this shell's stdin is the status pipe's
# read end, which it alone keeps while it waits; then it kills what is left of its process
# group. A failure here leaves bwrap unstarted, so its status pipe stays empty: the signal.
# $1 counts the cgroups that follow (v1: one per controller, v2: one).
_JOIN = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || { echo "cannot join cgroup $1" >&2; '
         'exit 1; }; shift; n=$((n - 1)); done; ulimit -f "$1" || exit 1; shift; "$@" </dev/null; kill -9 0')


class BwrapSandbox(Sandbox):
    backend = "bwrap"
    isolates_network = True

    def __init__(self, image: str = DEFAULT_IMAGE, run_label: str = "adhoc", image_dir: Path | None = None) -> None:
        self.image = image
        self.paths = ImagePaths(image) if image_dir is None else ImagePaths(image, image_dir)
        self.run_label = run_label
        self._launches: dict[str, _Launch] = {}
        self._lock = threading.Lock()
        #: The host's cgroup hierarchy (v1 or v2) the attempts' groups live in.
        self.hierarchy: Cgroups = open_cgroups()
        self._sweep()

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
                raise ProfileUnavailable(f"backend bwrap: `{tool}` is not installed (apt-get install bubblewrap util-linux)")
        if os.geteuid() != 0:
            raise ProfileUnavailable("backend bwrap: the harness must run as root to create cgroups and drop to uid 65534")
        self.hierarchy.check()
        from validate.image import rootfs_facts

        image = rootfs_facts(self.paths)  # refuses a tree that is not what rootfs.tar holds
        version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
        return BackendFacts(backend=self.backend, image=self.image, image_digest=image.digest,
                            architecture=_docker_arch(platform.machine()), version=version,
                            packages=image.packages, python=image.python, tree_digest=image.tree_digest,
                            seccomp=self.seccomp_sha256, cgroup=self.hierarchy.version)

    def _argv(self, req: RunRequest, cgroups: list[Path], status_fd: int, seccomp_fd: int) -> list[str]:
        uid, gid = req.uid_gid
        blocks = req.limits.max_file_mb * 2048
        tmp = (["--bind", str(req.tmp), "/tmp"] if req.tmp is not None
               else ["--size", str(req.limits.tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"])
        argv = ["/bin/sh", "-c", _JOIN, "sh", str(len(cgroups)), *map(str, cgroups), str(blocks),
                "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                "--inh-caps=-all", "--no-new-privs",
                "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                "--new-session", "--as-pid-1", "--json-status-fd", str(status_fd), "--seccomp", str(seccomp_fd),
                "--ro-bind", str(self.paths.rootfs), "/",
                "--proc", "/proc", "--dev", "/dev", *tmp,
                "--hostname", "sandbox", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
                "--setenv", "HOME", "/tmp"]
        for m in req.mounts:
            argv += ["--ro-bind" if m.read_only else "--bind", str(m.source), m.target]
        for k, v in sorted(req.env.items()):
            argv += ["--setenv", k, v]
        return [*argv, "--chdir", req.workdir, "--", *watchdog_argv(req.argv, req.limits.timeout_s)]

    def run(self, req: RunRequest) -> ExecResult:
        name = f"{self.run_label}-{req.name}"
        cgroups = self.cgroups(name, req)
        try:
            return self._run(req, name, cgroups)
        finally:
            self.hierarchy.remove(name)

    def launch(self, req: RunRequest, name: str, cgroups: list[Path], pass_fds: tuple[int, ...] = ()) -> _Launch:
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
            proc = subprocess.Popen(self._argv(req, cgroups, status_w, seccomp_fd), stdin=status_r,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=(status_w, seccomp_fd, *pass_fds),
                                    start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        except OSError as e:
            os.close(status_r)
            raise SandboxError(f"bwrap: cannot start: {e}") from None
        finally:
            os.close(status_w)
            os.close(seccomp_fd)
        launch = _Launch(proc, status_r, self.hierarchy, name)
        with self._lock:
            self._launches[name] = launch
        return launch

    def release(self, name: str, cgroups: list[Path]) -> None:
        """Unregister the launch `name` (killed and closed by its owner) and remove its cgroups."""
        with self._lock:
            self._launches.pop(name, None)
        self.hierarchy.remove(name)

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


class _Launch:
    """One running bwrap: its status pipe, its sandbox's PID 1, and how to kill it all."""

    def __init__(self, proc: subprocess.Popen, status_fd: int, hierarchy: Cgroups, name: str) -> None:
        self.proc = proc
        self.status_fd = status_fd
        self.hierarchy = hierarchy
        self.name = name
        self.status = b""
        self.pid1_fd: int | None = None
        #: The sandbox's PID 1 as the host sees it (0 until `await_sandbox` read it).
        self.pid1 = 0
        # close() (another thread, on Ctrl-C) may kill while the attempt's own thread closes:
        # the pidfd must not be used after it is closed (its number could name another process).
        self._lock = threading.Lock()
        #: Whether the harness has killed this launch (a session then knows the end is its own).
        self.killed = False

    def await_sandbox(self) -> None:
        """Read bwrap's first report (the sandbox's PID 1 exists), then move bwrap's monitor
        out of the attempt's limited cgroup. `SandboxError` if bwrap ends first."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"\n" not in self.status:
            left = deadline - time.monotonic()
            if left <= 0 or not _readable(self.status_fd, left):
                self.kill()
                raise SandboxError(f"bwrap: no sandbox after {START_TIMEOUT_S:.0f} s")
            chunk = os.read(self.status_fd, 4096)
            if not chunk:
                return  # bwrap ended before its sandbox existed: exit_code() will say so
            self.status += chunk
        try:
            pid1 = int(json.loads(self.status.split(b"\n", 1)[0])["child-pid"])
        except (ValueError, KeyError, TypeError) as e:
            self.kill()
            raise SandboxError(f"bwrap: unreadable status ({type(e).__name__}: {e}): {self.status[:200]!r}") from None
        self.pid1 = pid1
        monitor = _parent(pid1)
        if monitor <= 0 or _parent(monitor) != self.proc.pid:
            return  # the sandbox is already over (a quick agent): nothing to move, nothing to kill
        try:
            self.hierarchy.release(self.name, (monitor, self.proc.pid))
        except ProcessLookupError:
            return  # bwrap has just exited
        except OSError as e:
            self.kill()
            raise SandboxError(f"bwrap: cannot move bwrap out of the attempt's cgroups: {e}") from None
        self.pid1_fd = _pidfd_of_child(pid1, monitor)

    def kill(self, cause: bool = True) -> None:
        """Kill the sandbox's PID 1 (its whole pid namespace goes with it) and let bwrap report
        the exit; then kill bwrap and anything left in the attempt's cgroup. `cause` False:
        the kill only clears away a sandbox already broken, it is not why it ended."""
        with self._lock:
            self.killed = self.killed or cause
            self._kill()

    def _kill(self) -> None:
        if self.pid1_fd is not None:
            try:
                signal.pidfd_send_signal(self.pid1_fd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.hierarchy.kill(self.name)

    def exit_code(self) -> int | None:
        """The sandbox's exit as bwrap reported it; None when bwrap reported none (its PID 1
        was never executed). Call after bwrap has exited."""
        os.set_blocking(self.status_fd, False)
        try:
            while chunk := os.read(self.status_fd, 65536):
                self.status += chunk
        except BlockingIOError:
            pass  # a writer survived bwrap (it cannot: bwrap closes the pipe before the exec)
        for line in self.status.splitlines():
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict) and isinstance(report.get("exit-code"), int):
                return report["exit-code"]
        return None

    def close(self) -> None:
        """Release the pipes and pidfd; a bwrap that `supervise` never waited for (the start
        failed) is killed and reaped first."""
        with self._lock:
            if self.proc.returncode is None and self.proc.poll() is None:
                self._kill()
                self.proc.wait()
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None and not pipe.closed:
                    pipe.close()
            os.close(self.status_fd)
            if self.pid1_fd is not None:
                os.close(self.pid1_fd)
                self.pid1_fd = None


def _readable(fd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def _parent(pid: int) -> int:
    """The parent pid of `pid` (-1 when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _pidfd_of_child(pid: int, parent: int) -> int | None:
    """A pidfd for `pid` if it is still `parent`'s child (a pid alone could be reused)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if _parent(pid) != parent:
        os.close(fd)
        return None
    return fd


def _docker_arch(machine: str) -> str:
    """Docker's architecture names, so profiles compare across backends."""
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
