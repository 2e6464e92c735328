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

# `Session` and `SandboxEnded` live in `validate.sandbox.base`, beside the backend interface
# they drive (`Sandbox.session` makes a `Session`): one module, so no import circle between
# them. They are named here too, where sessions are described and opened.
from validate.sandbox.base import (  # noqa: F401 - BACKSTOP_S: the docstring's; the rest re-exported
    BACKSTOP_S,
    ExecResult,
    RunRequest,
    Sandbox,
    SandboxEnded,
    Session,
)


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
