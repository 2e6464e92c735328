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
container's memory cgroup (its ``oom_kill`` counter before and after). A daemon that fails is
a `SandboxError`. A container found no longer running is judged as a one-shot run's exit is
(`DockerSandbox.judge`: the daemon's error or a ``kill`` event the harness did not send is a
`SandboxError`); with no such cause, before the deadline, it is `SandboxEnded`: the agent's
doing, whatever exit code it left. A command is ``timed_out`` by the harness's clock only.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import requests
from docker.errors import DockerException
from docker.utils.socket import frames_iter

from validate.errors import SandboxError
from validate.sandbox.base import ExecResult, shield
from validate.sandbox.cgroups import oom_kills_of_pid
from validate.sandbox.session import SandboxEnded, Session

#: Seconds past a command's timeout the harness waits for its stream before declaring the session dead.
STREAM_GRACE_S = 10.0


class DockerSession(Session):
    def _start(self) -> None:
        sb = self.sandbox
        req = self.request.model_copy(update={"argv": ("sleep", "infinity")})
        try:
            self.cid = sb.create_container(req)
            sb.track(self.cid)
            self.since = time.time()  # the daemon's events of this container are judged from here
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

    def _judge_end(self) -> bool:
        """Whether the container still runs. If it does not: `SandboxError` when the daemon
        reports an error or a kill the harness did not send (`DockerSandbox.judge`, as for a
        one-shot run); False when the session's deadline has passed (the watchdog's backstop,
        the harness's own clock); else `SandboxEnded`, whatever the exit code says."""
        try:
            state = self.sandbox.client.api.inspect_container(self.cid)["State"]
        except (DockerException, requests.RequestException) as e:
            raise SandboxError(f"docker session: the daemon cannot say how container dv-{self.request.name} is: "
                               f"{type(e).__name__}: {e}") from None
        if state.get("Running"):
            return True
        try:
            oom = self.sandbox.judge(self.cid, self.request.name, self.since, {}, state, False)
        except (DockerException, requests.RequestException) as e:
            raise SandboxError(f"docker session: cannot read the daemon's events: {type(e).__name__}: {e}") from None
        if time.monotonic() >= self.deadline:
            return False
        raise SandboxEnded(f"container dv-{self.request.name} ended under the agent's command before its deadline "
                           f"(exit {state.get('ExitCode')}{', OOM' if oom else ''}); the harness saw no cause of its own")

    def _exec(self, argv: tuple[str, ...], stdin: bytes, timeout_s: float, keep: int) -> ExecResult:
        api = self.sandbox.client.api
        before = oom_kills_of_pid(self.pid)
        t0 = time.monotonic()
        try:
            exec_id = api.exec_create(self.cid, ["/usr/bin/timeout", "-s", "KILL", f"{timeout_s:.3f}", *argv],
                                      stdin=bool(stdin), user=self.request.user, workdir=self.request.workdir,
                                      environment=dict(self.request.env))["Id"]
            sock = api.exec_start(exec_id, socket=True)
            out, err, ended = self._stream(sock, stdin, timeout_s + STREAM_GRACE_S, keep)
            info = self._finished(exec_id, t0 + timeout_s + STREAM_GRACE_S)
        except (DockerException, requests.RequestException, OSError) as e:
            if not self._judge_end():
                return ExecResult(exit_code=None, timed_out=True, runtime_s=time.monotonic() - t0)
            raise SandboxError(f"docker session: exec failed: {type(e).__name__}: {e}") from None
        runtime = time.monotonic() - t0
        code = info.get("ExitCode")
        # 126/127: also how the runtime reports an exec into a container that has just stopped.
        if (info.get("Running") or not isinstance(code, int) or code >= 126) and not self._judge_end():
            return ExecResult(exit_code=None, timed_out=True, stdout=out, stderr=err, runtime_s=runtime)
        after = oom_kills_of_pid(self.pid)
        oom = before is not None and after is not None and after > before
        # Timed out by the harness's clock: past the command's time (t0 precedes the container's
        # `timeout`, so its kill lands later), or a command still running (its `timeout`
        # stopped, or its output held open by a process it left behind).
        timed_out = not oom and (info.get("Running") or not ended or
                                 (code == 137 and runtime >= timeout_s))
        return ExecResult(exit_code=None if timed_out else code, timed_out=bool(timed_out), oom_killed=oom,
                          stdout=out, stderr=err, runtime_s=runtime)

    def _finished(self, exec_id: str, until: float) -> dict:
        """The exec's state once it has ended, or as it is at `until` (harness clock)."""
        while True:
            info = self.sandbox.client.api.exec_inspect(exec_id)
            if not info.get("Running") or time.monotonic() >= until:
                return info
            time.sleep(0.01)

    @staticmethod
    def _stream(sock, stdin: bytes, limit_s: float, keep: int) -> tuple[bytes, bytes, bool]:
        """The head of stdout and stderr, and whether the stream ended within `limit_s`."""
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(limit_s)
        kept = {1: bytearray(), 2: bytearray()}
        ended = True
        try:
            if stdin:
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            for stream, data in frames_iter(sock, tty=False):
                if stream in kept and len(kept[stream]) < keep:
                    kept[stream] += data[: keep - len(kept[stream])]
        except TimeoutError:
            # Held open past the command's time by something it started (a detached process):
            # the agent's doing, a timeout by the harness's clock (the caller says so).
            ended = False
        finally:
            sock.close()
        return bytes(kept[1]), bytes(kept[2]), ended

    def _stop(self) -> None:
        cid = getattr(self, "cid", None)
        if cid is not None:
            self.sandbox.remove(cid)
