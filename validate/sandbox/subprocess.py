"""No isolation at all: the agent runs as a host process.

It does not isolate the network, so a task that needs a container (deshuffle-papers sets
``network_allow=[]``) is never run on it: the runner records such an attempt as an
unsupported execution contract. Mount targets are rewritten to their host sources in the
environment variables, since there is no filesystem namespace; the request's ``tmp`` becomes
``TMPDIR``. The agent runs as the harness's own user (``user`` is not applied) under the
host's ``timeout`` as a backstop, in its own process group, which the harness kills whole.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time

from validate.errors import SandboxError
from validate.sandbox.base import BackendFacts, ExecResult, RunRequest, Sandbox, supervise, watchdog_argv


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

        def kill() -> None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timed_out, stdout, stderr = supervise(proc, req.limits.timeout_s, req.limits.max_log_bytes, kill=kill)
        return ExecResult(exit_code=None if timed_out else proc.returncode, timed_out=timed_out,
                          stdout=stdout, stderr=stderr,
                          runtime_s=time.monotonic() - t0)
