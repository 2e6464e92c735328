"""Sessions of the `subprocess` backend: commands run as host processes, with no isolation.

Like its one-shot runs, it never isolates the network, so a task that needs isolation is
never played on it (the runner records an unsupported execution contract); it serves
environments that need none and the harness's own tests of the agent loop. Mount targets
are rewritten to their host sources in the command's arguments (also inside a ``bash -c``
string, at path boundaries), its environment and its working directory.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

from validate.sandbox.base import ExecResult, supervise
from validate.sandbox.session import Session


class SubprocessSession(Session):
    def _start(self) -> None:
        targets = sorted((m.target.rstrip("/") for m in self.request.mounts), key=len, reverse=True)
        self._paths = {m.target.rstrip("/"): str(m.source) for m in self.request.mounts}
        self._pattern = re.compile("(?<![\\w./-])(" + "|".join(map(re.escape, targets)) + ")(?=/|\\b|$)") \
            if targets else None

    def _host(self, s: str) -> str:
        return s if self._pattern is None else self._pattern.sub(lambda m: self._paths[m.group(1)], s)

    def _exec(self, argv: tuple[str, ...], stdin: bytes, timeout_s: float, keep: int) -> ExecResult:
        env = {"PATH": "/usr/bin:/bin", **{k: self._host(v) for k, v in self.request.env.items()}}
        args = [sys.executable if a == "python3" else self._host(a) for a in argv]
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(args, cwd=self._host(self.request.workdir), env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            return ExecResult(exit_code=127, stderr=f"cannot start: {e.strerror}".encode(), runtime_s=0.0)
        feeder = threading.Thread(target=_feed, args=(proc, stdin), daemon=True)
        feeder.start()  # a thread: a command that writes before it reads must not block on a full pipe
        timed_out, out, err = supervise(proc, timeout_s, keep, kill=lambda: _kill(proc))
        feeder.join()
        return ExecResult(exit_code=None if timed_out else proc.returncode, timed_out=timed_out, stdout=out,
                          stderr=err, runtime_s=time.monotonic() - t0)

    def _stop(self) -> None:
        pass  # nothing outlives a command: each is killed with its process group


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _kill(proc: subprocess.Popen) -> None:
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass

