"""Live sessions of the docker backend: one container per session, commands through the exec API.

The container is made exactly as a one-shot run's (`DockerSandbox.create_container`: no
network, read-only root, the same limits, user, mounts, capabilities, seccomp and log
settings); its PID 1 is the watchdog (`watchdog_argv`) over ``sleep infinity``, which ends
the container ``limits.timeout_s`` + `BACKSTOP_S` after the start even if the harness is
killed. The watchdog and its sleep are made exempt from the OOM killer (oom_score_adj
−1000, written by the harness on the host), so a command's memory blow-up kills the
command, not the session.

Each `exec` is an exec instance in that container (the container's user, working
directory and environment), run under coreutils ``timeout -s KILL`` for the tool's
timeout; its output is streamed off the hijacked socket, the head kept, the rest drained
and dropped. Its exit code comes from the daemon (``exec_inspect``); an OOM kill from the
container's memory cgroup (its ``oom_kill`` counter before and after). A daemon that fails,
or a container that is no longer running, is a `SandboxError`.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import requests
from docker.errors import DockerException
from docker.utils.socket import frames_iter

from validate.errors import SandboxError
from validate.sandbox.base import ExecResult
from validate.sandbox.session import Session

#: Seconds past a command's timeout the harness waits for its stream before declaring the session dead.
STREAM_GRACE_S = 10.0
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")


def oom_kills(host_pid: int | None) -> int | None:
    """The `oom_kill` counter of the memory cgroup of host process `host_pid` (cgroup v1)."""
    if not host_pid:
        return None
    try:
        for line in Path(f"/proc/{host_pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                for entry in (CGROUP_MEMORY / path.lstrip("/") / "memory.oom_control").read_text().splitlines():
                    if entry.startswith("oom_kill "):
                        return int(entry.split()[1])
    except (OSError, ValueError):
        return None
    return None


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


class DockerSession(Session):
    def _start(self) -> None:
        sb = self.sandbox
        req = self.request.model_copy(update={"argv": ("sleep", "infinity")})
        try:
            self.cid = sb.create_container(req)
            sb.track(self.cid)
            sb.client.api.start(self.cid)
            state = sb.client.api.inspect_container(self.cid)["State"]
        except (DockerException, requests.RequestException) as e:
            raise SandboxError(f"docker session: cannot start: {type(e).__name__}: {e}") from None
        if not state.get("Running"):
            raise SandboxError(f"docker session: the container is not running: {state.get('Error') or state}")
        self.pid = int(state.get("Pid") or 0)
        for _ in range(50):  # `timeout` forks its sleep just after the start
            if Path(f"/proc/{self.pid}/task/{self.pid}/children").exists() and \
                    Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().strip():
                break
            time.sleep(0.002)
        shield(self.pid)

    def _alive(self) -> bool:
        try:
            return bool(self.sandbox.client.api.inspect_container(self.cid)["State"].get("Running"))
        except (DockerException, requests.RequestException):
            return False

    def _exec(self, argv: tuple[str, ...], stdin: bytes, timeout_s: float, keep: int) -> ExecResult:
        api = self.sandbox.client.api
        before = oom_kills(self.pid)
        t0 = time.monotonic()
        try:
            exec_id = api.exec_create(self.cid, ["/usr/bin/timeout", "-s", "KILL", f"{timeout_s:.3f}", *argv],
                                      stdin=bool(stdin), user=self.request.user, workdir=self.request.workdir,
                                      environment=dict(self.request.env))["Id"]
            sock = api.exec_start(exec_id, socket=True)
            out, err = self._stream(sock, stdin, timeout_s + STREAM_GRACE_S, keep)
            info = api.exec_inspect(exec_id)
        except (DockerException, requests.RequestException, OSError) as e:
            raise SandboxError(f"docker session: exec failed: {type(e).__name__}: {e}") from None
        runtime = time.monotonic() - t0
        code = info.get("ExitCode")
        if info.get("Running") or not isinstance(code, int) or (code >= 128 and not self._alive()):
            raise SandboxError(f"docker session: container dv-{self.request.name} ended under the command "
                               f"(exec {info.get('Running') and 'still running' or code})")
        after = oom_kills(self.pid)
        oom = before is not None and after is not None and after > before
        timed_out = code == 137 and runtime >= timeout_s * 0.99 and not oom
        return ExecResult(exit_code=None if timed_out else code, timed_out=timed_out, oom_killed=oom,
                          stdout=out, stderr=err, runtime_s=runtime)

    @staticmethod
    def _stream(sock, stdin: bytes, limit_s: float, keep: int) -> tuple[bytes, bytes]:
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(limit_s)
        try:
            if stdin:
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            kept = {1: bytearray(), 2: bytearray()}
            for stream, data in frames_iter(sock, tty=False):
                if stream in kept and len(kept[stream]) < keep:
                    kept[stream] += data[: keep - len(kept[stream])]
        except TimeoutError:
            raise SandboxError(f"docker session: the command's stream stayed open {limit_s:.0f} s") from None
        finally:
            sock.close()
        return bytes(kept[1]), bytes(kept[2])

    def _stop(self) -> None:
        cid = getattr(self, "cid", None)
        if cid is not None:
            self.sandbox.remove(cid)
