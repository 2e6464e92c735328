"""Live sandbox sessions: one sandbox kept running for an attempt, commands run inside it.

A `Session` is made from a `RunRequest` (mounts, environment, limits, user: the same as a
one-shot run; its ``argv`` is unused) and lives from `start` to `stop`::

    with open_session(sandbox, request) as s:       # start(): the sandbox exists, idle
        r = s.exec(["bash", "-c", "ls"], timeout_s=10)   # an ExecResult, like a one-shot run
    # stop(): everything in it is gone (safe to call twice)

A failed command is data (its exit code, ``timed_out``, ``oom_killed``); a sandbox that
cannot start, or that the harness sees die from a harness-side cause (a daemon error, a
kill the harness did not send, bwrap reporting no exit), raises `SandboxError` (an
infrastructure fault). A sandbox that ends under a command before the deadline with no
such cause raises `SandboxEnded`: every process in it, its PID 1 and command server
included, runs as the agent's uid, so what ended it is the agent (``kill -TERM 1``,
``kill -9 $PPID``): a terminal result of the attempt, never retried as infrastructure.
``timed_out`` comes from the harness's own clock only. The sandbox's PID 1
is a watchdog that ends the whole sandbox at the request's deadline
(``limits.timeout_s`` + `BACKSTOP_S` after the start) even if the harness is killed.

`Session` is the same for every backend: it keeps the clock, the deadline and the agent's
end; the sandbox itself is the backend's own (`Sandbox.start_session`, `session_exec`,
`stop_session`), one class per backend for one-shot runs and sessions alike.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from validate.errors import SandboxError, ValidateError
from validate.sandbox.base import BACKSTOP_S, ExecResult, RunRequest, Sandbox  # noqa: F401 - BACKSTOP_S: the docstring's


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


def open_session(sandbox: Sandbox, request: RunRequest) -> Session:
    """A session of `sandbox`'s backend for `request`, not yet started."""
    return sandbox.session(request)


def run_in_session(sandbox: Sandbox, request: RunRequest) -> ExecResult:
    """A one-shot run as a composition of a session: start → exec the agent → stop. (The
    reply is read by the caller from the workspace, as after `Sandbox.run`.) The backends keep
    their direct `run`: bench/eval_bench.py --composition measures why (docs/evaluation.md)."""
    with open_session(sandbox, request) as session:
        return session.exec(request.argv, timeout_s=request.limits.timeout_s,
                            max_output_bytes=request.limits.max_log_bytes)
