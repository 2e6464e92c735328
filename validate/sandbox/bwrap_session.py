"""Live sessions of the bwrap backend: one sandbox kept alive, commands served from inside it.

The sandbox is launched exactly as a one-shot run's (`BwrapSandbox.launch`: the same
cgroups, uid, seccomp filter, namespaces, mounts and watchdog as PID 1); its program is a
small stdlib command server (`SERVER`, run as ``python3 -S``) that reads one request per
line from a pipe the harness holds (passed in as an inherited fd) and answers each on its
stdout. Every command is a child of that server, so it runs under all of the sandbox's
confinement — the seccomp filter included, which a process entered from outside with
``nsenter`` would not inherit; that, and one exec less per command, is why the server was
chosen over ``nsenter`` (docs/evaluation.md has the figures).

The server kills a command's process group at its timeout and keeps the head of its output
(the rest drained and dropped). The harness exempts the watchdog and the server from the OOM
killer (oom_score_adj −1000) and reads an OOM kill off the attempt's memory cgroup
(``oom_kill`` before and after). A server that stops answering is judged by the harness's own
signals: bwrap's status pipe reporting no exit (its monitor, outside the agent's reach,
died) or a kill by the harness is a `SandboxError`; past the deadline it is the watchdog (a
timeout by the harness's clock); otherwise the sandbox ran and ended, or its server was
stopped, by something of the agent's uid (``kill -9 $PPID``): `SandboxEnded`. An outside
SIGKILL of the sandbox's PID 1 cannot be told from that (bwrap reports it as exit 137
either way) and counts as the agent's.
"""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import time

from validate.errors import SandboxError
from validate.sandbox.base import ExecResult, shield
from validate.sandbox.session import SandboxEnded, Session

#: Seconds the command server may take to say it is ready.
START_TIMEOUT_S = 30.0
#: Seconds past a command's timeout the harness waits for the server's answer.
ANSWER_GRACE_S = 10.0
#: Seconds bwrap may take to report the sandbox's exit once its server has gone.
EXIT_GRACE_S = 5.0

SERVER = r"""
import base64, json, os, select, signal, subprocess, sys, time
requests = os.fdopen(int(sys.argv[1]), "rb")
answers = os.fdopen(1, "wb", buffering=0)

def kill(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass

def killable():
    # The server and the watchdog are shielded from the OOM killer (-1000); a command is not:
    # raising one's own oom_score_adj needs no privilege.
    with open("/proc/self/oom_score_adj", "w") as fh:
        fh.write("0")

def run(req):
    t0 = time.monotonic()
    try:
        p = subprocess.Popen(req["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, preexec_fn=killable)
    except OSError as e:
        return {"exit": 126 if isinstance(e, PermissionError) else 127, "timed_out": False, "stdout": "",
                "stderr": base64.b64encode(("cannot run: %s" % e.strerror).encode()).decode(), "runtime_s": 0.0}
    data, keep = base64.b64decode(req["stdin"]), req["keep"]
    kept = {p.stdout.fileno(): bytearray(), p.stderr.fileno(): bytearray()}
    poller = select.poll()
    for fd in kept:
        poller.register(fd, select.POLLIN)
    exit_fd = os.pidfd_open(p.pid)
    poller.register(exit_fd, select.POLLIN)
    stdin_fd = p.stdin.fileno()
    if data:
        os.set_blocking(stdin_fd, False)
        poller.register(stdin_fd, select.POLLOUT)
    else:
        p.stdin.close()
    deadline, exited, timed_out, grace = t0 + req["timeout_s"], False, False, None
    while kept_open(kept, poller) or not exited:
        until = grace if exited else deadline
        left = until - time.monotonic()
        if left <= 0:
            if not exited:
                timed_out = True
                kill(p)
            break
        for fd, ev in poller.poll(left * 1000):
            if fd == exit_fd:
                exited, grace = True, time.monotonic() + 1.0
                poller.unregister(exit_fd)
            elif fd == stdin_fd:
                try:
                    data = data[os.write(stdin_fd, data[:65536]):]
                except OSError:
                    data = b""
                if not data:
                    poller.unregister(stdin_fd)
                    p.stdin.close()
            else:
                chunk = os.read(fd, 65536)
                if not chunk:
                    poller.unregister(fd)
                    kept[fd + 1000000] = None
                elif len(kept[fd]) < keep:
                    kept[fd] += chunk[:keep - len(kept[fd])]
    p.wait()
    kill(p)
    os.close(exit_fd)
    code = p.returncode if p.returncode >= 0 else 128 - p.returncode
    out, err = kept[p.stdout.fileno()], kept[p.stderr.fileno()]
    return {"exit": None if timed_out else code, "timed_out": timed_out,
            "stdout": base64.b64encode(bytes(out)).decode(), "stderr": base64.b64encode(bytes(err)).decode(),
            "runtime_s": time.monotonic() - t0}

def kept_open(kept, poller):
    return sum(1 for k in kept if k < 1000000) > sum(1 for k in kept if k >= 1000000)

answers.write(b'{"ready": true}\n')
for line in requests:
    answers.write(json.dumps(run(json.loads(line))).encode() + b"\n")
"""


class BwrapSession(Session):
    def _start(self) -> None:
        sb = self.sandbox
        self.name = f"{sb.run_label}-{self.request.name}"
        self.cgroups = sb.cgroups(self.name, self.request)
        self.launch = None
        req_r, self.req_w = os.pipe()
        try:
            request = self.request.model_copy(update={"argv": ("python3", "-S", "-c", SERVER, str(req_r))})
            self.launch = sb.launch(request, self.name, self.cgroups, pass_fds=(req_r,))
        finally:
            os.close(req_r)
        self.launch.await_sandbox()
        if not self.launch.pid1:
            raise SandboxError(f"bwrap session: the sandbox did not start: {self._stderr()}")
        self.answers = self.launch.proc.stdout.fileno()
        self.buffer = b""
        try:
            ready = self._answer(time.monotonic() + START_TIMEOUT_S)
        except _NoAnswer as e:  # nothing of the agent's has run yet
            raise SandboxError(f"bwrap session: {e} before it was ready: {self._stderr()}") from None
        if ready != {"ready": True}:
            raise SandboxError("bwrap session: the command server did not say it is ready")
        shield(self.launch.pid1)  # now the server exists: it and the watchdog, never its commands

    def _stderr(self) -> str:
        try:
            os.set_blocking(self.launch.proc.stderr.fileno(), False)
            return repr(self.launch.proc.stderr.read(300) or b"")
        except (OSError, TypeError):
            return "''"

    def _oom_kills(self) -> int | None:
        return self.sandbox.hierarchy.oom_kills(self.name)

    def _exec(self, argv: tuple[str, ...], stdin: bytes, timeout_s: float, keep: int) -> ExecResult:
        before = self._oom_kills()
        t0 = time.monotonic()
        line = json.dumps({"argv": list(argv), "stdin": base64.b64encode(stdin).decode(), "timeout_s": timeout_s,
                           "keep": keep}).encode() + b"\n"
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self.req_w, view):]
        except OSError as e:
            answer = self._gone(f"its request pipe failed ({e.strerror})")
        else:
            try:
                answer = self._answer(t0 + timeout_s + ANSWER_GRACE_S)
            except _NoAnswer as e:
                answer = self._gone(str(e))
        after = self._oom_kills()
        oom = before is not None and after is not None and after > before
        try:
            return _result(answer, oom, t0)
        except (KeyError, TypeError, ValueError):  # pydantic's ValidationError and binascii.Error are ValueErrors
            return _result(self._gone(f"an unreadable answer: {str(answer)[:200]!r}"), oom, t0)

    def _gone(self, why: str) -> dict:
        """Judge a server that gave no answer (see the module): a timed-out answer when the
        session's deadline has passed, else `SandboxError` or `SandboxEnded`."""
        launch = self.launch
        if launch.killed:
            raise SandboxError(f"bwrap session: the harness ended the sandbox ({why})")
        try:
            launch.proc.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            # A server stopped or wedged by the agent: this sandbox serves no more. The kill
            # clears away what the agent broke; it is not the cause.
            launch.kill(cause=False)
            launch.proc.wait()
        exit_code = launch.exit_code()
        if exit_code is None:
            raise SandboxError(f"bwrap session: bwrap reported no exit of the sandbox ({why}): {self._stderr()}")
        if time.monotonic() >= self.deadline:
            return {"exit": None, "timed_out": True, "stdout": "", "stderr": ""}
        raise SandboxEnded(f"bwrap session: the sandbox ended under the agent's command before its deadline "
                           f"({why}; its PID 1 exited {exit_code}); the harness saw no cause of its own")

    def _answer(self, deadline: float) -> dict:
        poller = select.poll()
        poller.register(self.answers, select.POLLIN)
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise _NoAnswer("the command server stopped answering")
            chunk = os.read(self.answers, 1 << 20)
            if not chunk:
                raise _NoAnswer("the command server's pipe closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # the agent (same uid) can write into the server's pipe
            raise _NoAnswer(f"an unreadable answer: {line[:200]!r}")
        return answer

    def _stop(self) -> None:
        if getattr(self, "req_w", None) is not None:
            os.close(self.req_w)
            self.req_w = None
        launch = getattr(self, "launch", None)
        if launch is not None:
            launch.kill()
            launch.close()
        if getattr(self, "cgroups", None) is not None:
            self.sandbox.release(self.name, self.cgroups)


def _result(answer: dict, oom: bool, t0: float) -> ExecResult:
    return ExecResult(exit_code=answer["exit"], timed_out=answer["timed_out"], oom_killed=oom,
                      stdout=base64.b64decode(answer["stdout"]), stderr=base64.b64decode(answer["stderr"]),
                      runtime_s=time.monotonic() - t0)


class _NoAnswer(Exception):
    """The command server gave no answer (its pipe closed, or it stayed silent past its time)."""
