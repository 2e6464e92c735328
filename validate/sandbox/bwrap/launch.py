"""One running bwrap of the bwrap backend: the command line that starts it (`bwrap_argv`) and
the handle on it (`Launch`: its status pipe, its sandbox's PID 1, how to kill it all). What
the chain is and why: `validate.sandbox.bwrap.backend`."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

from validate.core.errors import SandboxError
from validate.sandbox.base import RunRequest, watchdog_argv
from validate.sandbox.cgroups import Cgroups

SANDBOX_UID = 65534
#: Seconds bwrap may take to create the sandbox's PID 1 before the start counts as failed.
START_TIMEOUT_S = 30.0
# Join the attempt's cgroups and cap file size (ulimit -f counts 512-byte blocks), then run
# the rest of the chain with stdin from /dev/null: this shell's stdin is the status pipe's
# read end, which it alone keeps while it waits; then it kills what is left of its process
# group. A failure here leaves bwrap unstarted, so its status pipe stays empty: the signal.
# $1 counts the cgroups that follow (v1: one per controller, v2: one).
_JOIN = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || { echo "cannot join cgroup '
         '$1" >&2; exit 1; }; shift; n=$((n - 1)); done; ulimit -f "$1" || exit 1; shift; "$@" '
         '</dev/null; kill -9 0')


def bwrap_argv(rootfs: Path, req: RunRequest, cgroups: list[Path], status_fd: int,
               seccomp_fd: int) -> list[str]:
    """The launch chain of `req` (see `validate.sandbox.bwrap.backend`): join `cgroups`, drop to the
    request's uid, bwrap over the read-only `rootfs`, the watchdog as PID 1."""
    uid, gid = req.uid_gid
    blocks = req.limits.max_file_mb * 2048
    tmp = (["--bind", str(req.tmp), "/tmp"] if req.tmp is not None
           else ["--size", str(req.limits.tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"])
    argv = ["/bin/sh", "-c", _JOIN, "sh", str(len(cgroups)), *map(str, cgroups), str(blocks),
            "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--inh-caps=-all", "--no-new-privs",
            "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--json-status-fd", str(status_fd), "--seccomp", str(seccomp_fd),
            "--ro-bind", str(rootfs), "/",
            "--proc", "/proc", "--dev", "/dev", *tmp,
            "--hostname", "sandbox", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "HOME", "/tmp"]
    for m in req.mounts:
        argv += ["--ro-bind" if m.read_only else "--bind", str(m.source), m.target]
    for k, v in sorted(req.env.items()):
        argv += ["--setenv", k, v]
    return [*argv, "--chdir", req.workdir, "--", *watchdog_argv(req.argv, req.limits.timeout_s)]


class Launch:
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
            raise SandboxError(
                f"bwrap: unreadable status ({type(e).__name__}: {e}): {self.status[:200]!r}"
            ) from None
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
