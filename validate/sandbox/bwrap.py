"""A daemonless profile: bubblewrap namespaces, an unprivileged uid, cgroup v1 limits.

The launch chain, each step `exec`ing the next::

    sh (joins the attempt's memory/pids/cpu cgroups; ulimit -f caps file size)
      → setpriv --reuid 65534      (drop root *before* bwrap: a root-launched bwrap would
                                    map the sandbox uid back to host root)
      → bwrap --unshare-all        (no network, own pid/ipc/uts namespaces, no capabilities)
      → python3 /agent/agent.py

The sandbox's root is the image's unpacked Debian rootfs, bound read-only (not the host's
``/``: no host sockets, no host ``/etc/shadow``), plus a tmpfs ``/tmp``, ``/proc``, a
minimal ``/dev`` and the attempt's mounts. Limits come from a fresh cgroup per attempt
(memory without swap, pids, cpu quota); an OOM kill is read from ``memory.oom_control``.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from validate.errors import ProfileUnavailable, SandboxError
from validate.paths import DEFAULT_IMAGE, ImagePaths
from validate.sandbox.base import BackendFacts, ExecResult, RunRequest, Sandbox, supervise

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
PARENT = "deshuffle-validate"
SANDBOX_UID = 65534
# Join the attempt's cgroups and cap file size (ulimit -f counts 512-byte blocks), then exec.
_JOIN = ('for d in "$1" "$2" "$3"; do echo $$ > "$d/cgroup.procs" || exit 125; done; '
         'ulimit -f "$4" || exit 125; shift 4; exec "$@"')


class BwrapSandbox(Sandbox):
    backend = "bwrap"
    isolates_network = True

    def __init__(self, image: str = DEFAULT_IMAGE, run_label: str = "adhoc", image_dir: Path | None = None) -> None:
        self.image = image
        self.paths = ImagePaths(image) if image_dir is None else ImagePaths(image, image_dir)
        self.run_label = run_label
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._sweep()

    def _sweep(self) -> None:
        """Kill and remove what a crashed earlier process of this same run left in its cgroups."""
        stale = sorted(p.name for p in (CGROUP_ROOT / "pids" / PARENT).glob(f"{self.run_label}-*") if p.is_dir())
        for name in stale:
            dirs = [CGROUP_ROOT / c / PARENT / name for c in CONTROLLERS]
            self._kill_cgroup(dirs[1])
            self._remove_cgroups(dirs)

    def facts(self) -> BackendFacts:
        for tool in ("bwrap", "setpriv"):
            if shutil.which(tool) is None:
                raise ProfileUnavailable(f"backend bwrap: `{tool}` is not installed (apt-get install bubblewrap util-linux)")
        if os.geteuid() != 0:
            raise ProfileUnavailable("backend bwrap: the harness must run as root to create cgroups and drop to uid 65534")
        missing = [c for c in CONTROLLERS if not (CGROUP_ROOT / c / "cgroup.procs").exists()]
        if missing:
            raise ProfileUnavailable(f"backend bwrap: cgroup v1 controllers {', '.join(missing)} are not mounted "
                                     f"under {CGROUP_ROOT} (only cgroup v1 is supported)")
        from validate.image import rootfs_facts

        image = rootfs_facts(self.paths)  # refuses a tree that is not what rootfs.tar holds
        version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
        return BackendFacts(backend=self.backend, image=self.image, image_digest=image.digest,
                            architecture=_docker_arch(platform.machine()), version=version,
                            packages=image.packages, python=image.python, tree_digest=image.tree_digest)

    def _cgroups(self, name: str, req: RunRequest) -> list[Path]:
        lim = req.limits
        dirs = [CGROUP_ROOT / c / PARENT / name for c in CONTROLLERS]
        try:
            for d in dirs:
                d.mkdir(parents=True, exist_ok=True)
            mem, pids, cpu = dirs
            limit = str(lim.memory_mb * 1024 * 1024)
            (mem / "memory.limit_in_bytes").write_text(limit)
            if (mem / "memory.memsw.limit_in_bytes").exists():
                (mem / "memory.memsw.limit_in_bytes").write_text(limit)
            (mem / "memory.swappiness").write_text("0")
            (pids / "pids.max").write_text(str(lim.pids))
            (cpu / "cpu.cfs_period_us").write_text("100000")
            (cpu / "cpu.cfs_quota_us").write_text(str(int(lim.cpus * 100000)))
        except OSError as e:
            self._remove_cgroups(dirs)
            raise SandboxError(f"bwrap: cannot set up cgroup {name}: {e}") from None
        return dirs

    def _argv(self, req: RunRequest, cgroups: list[Path]) -> list[str]:
        blocks = req.limits.max_file_mb * 2048
        argv = ["/bin/sh", "-c", _JOIN, "sh", *map(str, cgroups), str(blocks),
                "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                "--inh-caps=-all", "--no-new-privs",
                "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
                "--ro-bind", str(self.paths.rootfs), "/",
                "--proc", "/proc", "--dev", "/dev",
                "--size", str(req.limits.tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp",
                "--hostname", "sandbox", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
                "--setenv", "HOME", "/tmp"]
        for m in req.mounts:
            argv += ["--ro-bind" if m.read_only else "--bind", str(m.source), m.target]
        for k, v in sorted(req.env.items()):
            argv += ["--setenv", k, v]
        return [*argv, "--chdir", req.workdir, "--", *req.argv]

    def run(self, req: RunRequest) -> ExecResult:
        name = f"{self.run_label}-{req.name}"
        cgroups = self._cgroups(name, req)
        try:
            return self._run(req, name, cgroups)
        finally:
            self._remove_cgroups(cgroups)

    def _run(self, req: RunRequest, name: str, cgroups: list[Path]) -> ExecResult:
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(self._argv(req, cgroups), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        except OSError as e:
            raise SandboxError(f"bwrap: cannot start: {e}") from None
        with self._lock:
            self._procs[name] = proc
        try:
            timed_out, stdout, stderr = supervise(proc, req.limits.timeout_s, req.limits.max_log_bytes,
                                                  kill=lambda: self._kill(proc, cgroups[1]))
        finally:
            with self._lock:
                self._procs.pop(name, None)
        runtime = time.monotonic() - t0
        code = proc.returncode
        if code == 125 or (code == 1 and stderr.startswith(b"bwrap:")):
            raise SandboxError(f"bwrap: the sandbox did not start (exit {code}): {stderr[:300]!r}")
        oom = b"oom_kill 0" not in (cgroups[0] / "memory.oom_control").read_bytes() \
            if (cgroups[0] / "memory.oom_control").exists() else False
        return ExecResult(exit_code=None if timed_out else code, timed_out=timed_out, oom_killed=oom,
                          stdout=stdout, stderr=stderr, runtime_s=runtime)

    @classmethod
    def _kill(cls, proc: subprocess.Popen, pids_cgroup: Path) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        cls._kill_cgroup(pids_cgroup)

    @staticmethod
    def _kill_cgroup(pids_cgroup: Path) -> None:
        procs = pids_cgroup / "cgroup.procs"
        for _ in range(2000):  # the pid namespace tears down in a few ms: poll finely, up to 2 s
            try:
                pids = procs.read_text().split()
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)

    @staticmethod
    def _remove_cgroups(dirs: list[Path]) -> None:
        for d in dirs:
            for _ in range(2000):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.001)

    def close(self) -> None:
        with self._lock:
            procs = list(self._procs.items())
        for name, proc in procs:
            self._kill(proc, CGROUP_ROOT / "pids" / PARENT / name)


def _docker_arch(machine: str) -> str:
    """Docker's architecture names, so profiles compare across backends."""
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
