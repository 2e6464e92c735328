"""A sandbox backend that lives in tests/: adding a backend is this module plus one
registration (an entry point of the ``validate.backends`` group), with no edit under validate/.

Each agent runs in a bubblewrap sandbox of its own making: no image (nothing to prepare:
`Sandbox.prepare_image` keeps its default), the host's ``/usr`` bound read-only under
bwrap's fresh root, every namespace unshared (the network holds only ``lo``, so tasks that
need isolation run on it), the request's uid and gid taken before bwrap (``setpriv``). The
harness's timeout is its only limit: it sets no cgroup, so memory, cpus and pids are not
enforced — a toy that proves the seam, not a profile to freeze a release under. Agent or
infrastructure is told by bwrap's own status pipe: no ``exit-code`` report, no sandbox
(`SandboxError`). It has no live sessions (the base class's defaults refuse them).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time

from validate.core.errors import ProfileUnavailable, SandboxError
from validate.sandbox import BackendFacts, ExecResult, RunRequest, Sandbox
from validate.sandbox.base import supervise, watchdog_argv


class ToyBackend(Sandbox):
    backend = "toy"
    isolates_network = True

    def __init__(self, image: str = "host", run_label: str = "adhoc", **_: object) -> None:
        self.image, self.run_label = image, run_label

    def facts(self) -> BackendFacts:
        if os.geteuid() != 0:
            raise ProfileUnavailable("backend toy: run as root (it drops to the request's uid itself)")
        version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
        return BackendFacts(backend=self.backend, image="host", image_digest="none",
                            architecture=platform.machine(), version=f"toy over {version}")

    def _argv(self, req: RunRequest, status_fd: int) -> list[str]:
        uid, gid = req.uid_gid
        argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs",
                "bwrap", "--unshare-all", "--die-with-parent", "--json-status-fd", str(status_fd),
                "--ro-bind", "/usr", "/usr", *[a for d in ("bin", "lib", "lib64", "sbin")
                                               for a in ("--symlink", f"usr/{d}", f"/{d}")],
                "--proc", "/proc", "--dev", "/dev",
                *(["--bind", str(req.tmp), "/tmp"] if req.tmp else ["--tmpfs", "/tmp"]),
                "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
        for m in req.mounts:
            argv += ["--ro-bind" if m.read_only else "--bind", str(m.source), m.target]
        for k, v in sorted(req.env.items()):
            argv += ["--setenv", k, v]
        return [*argv, "--chdir", req.workdir, "--", *watchdog_argv(req.argv, req.limits.timeout_s)]

    def run(self, req: RunRequest) -> ExecResult:
        status_r, status_w = os.pipe()
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(self._argv(req, status_w), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(status_w,),
                                    start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        except OSError as e:
            os.close(status_r)
            raise SandboxError(f"toy: cannot start: {e}") from None
        finally:
            os.close(status_w)

        def kill() -> None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # bwrap dies, and --die-with-parent takes the sandbox
            except ProcessLookupError:
                pass

        try:
            timed_out, stdout, stderr = supervise(proc, req.limits.timeout_s, req.limits.max_log_bytes,
                                                  kill=kill)
            reports = [json.loads(line) for line in _drain(status_r).splitlines() if line.strip()]
        finally:
            os.close(status_r)
        exits = [r["exit-code"] for r in reports if isinstance(r, dict)
                 and isinstance(r.get("exit-code"), int)]
        if not exits and not timed_out:
            raise SandboxError(f"toy: the sandbox did not start (bwrap exited {proc.returncode}): "
                               f"{stderr[:300]!r}")
        return ExecResult(exit_code=None if timed_out else exits[0], timed_out=timed_out, stdout=stdout,
                          stderr=stderr, runtime_s=time.monotonic() - t0)


def _drain(fd: int) -> bytes:
    """What bwrap wrote to its status pipe; never blocks (a writer left alive would be bwrap's bug)."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    return data
