"""No isolation at all: the agent, and a session's commands, run as host processes.

It does not isolate the network, so a task that needs a container (deshuffle-papers sets
``network_allow=[]``) is never run on it: the runner records such an attempt as an
unsupported execution contract; it serves environments that need none and the harness's
own tests of the agent loop. Mount targets are rewritten to their host sources, since there
is no filesystem namespace: in a one-shot run's environment variables, arguments and working
directory (the request's ``tmp`` becomes ``TMPDIR``); in a session's commands also inside a
``bash -c`` string, at path boundaries. Everything runs as the harness's own user (``user``
is not applied), a one-shot run under the host's ``timeout`` as a backstop, each in its own
process group, which the harness kills whole.
"""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from validate.core.errors import SandboxError
from validate.sandbox.base import BackendFacts, ExecResult, RunRequest, Sandbox, supervise, watchdog_argv


@dataclass(frozen=True)
class _Live:
    """A session's state: its request, its mount targets → host sources, and the pattern that finds them."""

    request: RunRequest
    paths: dict[str, str]
    pattern: re.Pattern | None

    def host(self, s: str) -> str:
        return s if self.pattern is None else self.pattern.sub(lambda m: self.paths[m.group(1)], s)


class SubprocessSandbox(Sandbox):
    backend = "subprocess"
    isolates_network = False

    def __init__(self, image: str = "host", run_label: str = "adhoc", **_: object) -> None:
        self.image = image  # (the attempt storage a killed earlier run left: `open_sandbox` sweeps it)

    def facts(self) -> BackendFacts:
        return BackendFacts(backend=self.backend, image="host", image_digest="none",
                            architecture=platform.machine(), version=f"python {sys.version.split()[0]}")

    def run(self, req: RunRequest) -> ExecResult:
        paths = {m.target: str(m.source) for m in req.mounts}

        def host(s: str) -> str:
            for target, source in paths.items():
                if s == target or s.startswith(target + "/"):
                    return source + s[len(target):]
            return s

        env = {k: host(v) for k, v in req.env.items()}
        if req.tmp is not None:
            env["TMPDIR"] = str(req.tmp)
        argv = watchdog_argv(tuple(sys.executable if a == "python3" else host(a) for a in req.argv),
                             req.limits.timeout_s)
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(argv, cwd=host(req.workdir), env={"PATH": "/usr/bin:/bin", **env},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as e:
            raise SandboxError(f"subprocess: cannot start: {e}") from None
        timed_out, stdout, stderr = supervise(proc, req.limits.timeout_s, req.limits.max_log_bytes,
                                              kill=lambda: _kill(proc))
        return ExecResult(exit_code=None if timed_out else proc.returncode, timed_out=timed_out,
                          stdout=stdout, stderr=stderr,
                          runtime_s=time.monotonic() - t0)

    # --- live sessions --------------------------------------------------------------------

    def start_session(self, request: RunRequest, deadline: float) -> _Live:
        targets = sorted((m.target.rstrip("/") for m in request.mounts), key=len, reverse=True)
        paths = {m.target.rstrip("/"): str(m.source) for m in request.mounts}
        pattern = re.compile("(?<![\\w./-])(" + "|".join(map(re.escape, targets)) + ")(?=/|\\b|$)") \
            if targets else None
        return _Live(request, paths, pattern)

    # `live` is what this backend's start_session made; the base types it as the opaque object.
    def session_exec(self, live: _Live,  # type: ignore[override]
                     argv: tuple[str, ...], stdin: bytes, timeout_s: float, keep: int) -> ExecResult:
        env = {"PATH": "/usr/bin:/bin", **{k: live.host(v) for k, v in live.request.env.items()}}
        args = [sys.executable if a == "python3" else live.host(a) for a in argv]
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(args, cwd=live.host(live.request.workdir), env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            return ExecResult(exit_code=127, stderr=f"cannot start: {e.strerror}".encode(), runtime_s=0.0)
        feeder = threading.Thread(target=_feed, args=(proc, stdin), daemon=True)
        feeder.start()  # a thread: a command that writes before it reads must not block on a full pipe
        timed_out, out, err = supervise(proc, timeout_s, keep, kill=lambda: _kill(proc))
        feeder.join()
        return ExecResult(exit_code=None if timed_out else proc.returncode, timed_out=timed_out, stdout=out,
                          stderr=err, runtime_s=time.monotonic() - t0)

    def stop_session(self, live: _Live) -> None:  # type: ignore[override]  # see session_exec
        pass  # nothing outlives a command: each is killed with its process group


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    assert proc.stdin is not None  # session_exec opens it with stdin=PIPE
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
