"""The command server a bwrap session's sandbox runs (`SERVER`, a small stdlib program run as
``python3 -S``), and the harness's end of its line protocol: one JSON request per line on a
pipe the harness holds (`request_line`), one JSON answer per line on the sandbox's stdout
(`Answers`). Every command is a child of that server, so it runs under all of the
sandbox's confinement; why a server rather than ``nsenter``: `validate.sandbox.bwrap.backend`."""

from __future__ import annotations

import base64
import json
import os
import select
import time

from validate.core.errors import SandboxError
from validate.sandbox.base import ExecResult

#: Seconds the command server may take to say it is ready.
START_TIMEOUT_S = 30.0
#: Seconds past a command's timeout the harness waits for the server's answer.
ANSWER_GRACE_S = 10.0

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
"""  # noqa: E501


class Answers:
    """The server's answers as they arrive on `fd` (the sandbox's stdout), one line each."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer = fd, b""

    def next(self, deadline: float) -> dict:
        """The next answer; `NoAnswer` when none comes by `deadline` (monotonic) or it is unreadable."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise NoAnswer("the command server stopped answering")
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise NoAnswer("the command server's pipe closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # the agent (same uid) can write into the server's pipe
            raise NoAnswer(f"an unreadable answer: {line[:200]!r}")
        return answer


def request_line(argv: tuple[str, ...], stdin: bytes, timeout_s: float, keep: int) -> bytes:
    return json.dumps({"argv": list(argv), "stdin": base64.b64encode(stdin).decode(), "timeout_s": timeout_s,
                       "keep": keep}).encode() + b"\n"


def result(answer: dict, oom: bool, t0: float) -> ExecResult:
    return ExecResult(exit_code=answer["exit"], timed_out=answer["timed_out"], oom_killed=oom,
                      stdout=base64.b64decode(answer["stdout"]), stderr=base64.b64decode(answer["stderr"]),
                      runtime_s=time.monotonic() - t0)


class NoAnswer(SandboxError):
    """The command server gave no answer (its pipe closed, or it stayed silent past its time);
    the backend names it as a `SandboxError` or `SandboxEnded` of its own, never passes it on."""
