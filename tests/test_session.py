"""Live sandbox sessions (`validate.sandbox.session`) on real docker and real bwrap: the same
confinement as a one-shot run (network off, user, read-only root, limits, bwrap's seccomp
filter), a failed command is data, a sandbox killed from outside a `SandboxError`, one the
agent ends its attempt's own end, the watchdog ends a sandbox nobody stops, and `close`
ends live sessions."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import SESSION_SANDBOX_BACKENDS as SANDBOX_BACKENDS
from validate.core.errors import SandboxError
from validate.sandbox import Limits, Mount, RunRequest
from validate.sandbox.session import SandboxEnded

SESSION_BACKENDS = [*SANDBOX_BACKENDS, pytest.param("subprocess")]


@pytest.fixture
def workspace():
    from validate.run.workspace import temp_storage

    with temp_storage() as root:  # traversable by the sandbox's user, unlike pytest's 0700 tmp_path
        root.chmod(0o711)
        yield _workspace(root)


def _workspace(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir()
    os.chown(ws, 65534, 65534)
    (ws / "data.txt").write_text("hello\n")
    return ws


@pytest.mark.bwrap
def test_a_sandbox_that_cannot_start_fails_the_start(sandboxes, tmp_path):
    with pytest.raises(SandboxError, match="Can't find source path"):
        sandboxes("bwrap").session(request(tmp_path / "missing", "nostart")).start()


def request(ws: Path, name: str, **limits) -> RunRequest:
    return RunRequest(argv=(), mounts=(Mount(source=ws, target="/workspace", read_only=False),),
                      env={"GREETING": "hi"}, name=f"{name}-{os.getpid()}-{time.monotonic_ns() % 10**9}",
                      limits=Limits(**{"timeout_s": 60.0, **limits}))


def sandbox_of(sandboxes, backend):
    if backend == "subprocess":
        from validate.sandbox import open_sandbox

        return open_sandbox("subprocess", image="host")
    return sandboxes(backend)


@pytest.mark.parametrize("backend", SESSION_BACKENDS)
def test_commands_run_in_the_workspace_with_the_requests_environment(sandboxes, backend, workspace):
    with sandbox_of(sandboxes, backend).session(request(workspace, "basic")) as s:
        r = s.exec(["bash", "-c", "cat data.txt; echo $GREETING; echo oops >&2; exit 3"], timeout_s=20)
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, b"hello\nhi\n", b"oops\n", False)
        assert s.exec(["bash", "-c", "cat > copy.txt"], stdin=b"piped in", timeout_s=20).exit_code == 0
        assert (workspace / "copy.txt").read_bytes() == b"piped in"  # the same workspace, live
        big = s.exec(["head", "-c", "300000", "/dev/zero"], timeout_s=20, max_output_bytes=1000)
        assert big.exit_code == 0 and big.stdout == b"\0" * 1000
        missing = s.exec(["no-such-program"], timeout_s=20)
        assert missing.exit_code in (126, 127)


@pytest.mark.parametrize("backend", SESSION_BACKENDS)
def test_a_command_past_its_timeout_is_killed_and_the_session_goes_on(sandboxes, backend, workspace):
    with sandbox_of(sandboxes, backend).session(request(workspace, "timeout")) as s:
        t0 = time.monotonic()
        r = s.exec(["bash", "-c", "sleep 30 & sleep 30"], timeout_s=1.0)
        assert r.timed_out and r.exit_code is None and time.monotonic() - t0 < 15
        assert s.exec(["true"], timeout_s=20).exit_code == 0


@pytest.mark.parametrize("backend", SANDBOX_BACKENDS)
def test_a_process_left_behind_writing_now_and_then_does_not_hold_the_session(sandboxes, backend, workspace):
    with sandboxes(backend).session(request(workspace, "leftover")) as s:
        t0 = time.monotonic()
        r = s.exec(["bash", "-c", "setsid bash -c 'while :; do echo x; sleep 1; done' & echo started"],
                   timeout_s=2.0)
        assert time.monotonic() - t0 < 2.0 + 10.0 + 5.0  # its timeout, the stream's grace, slack
        assert r.stdout.startswith(b"started") and (r.timed_out or r.exit_code == 0)
        assert s.exec(["echo", "alive"], timeout_s=20).stdout == b"alive\n"


@pytest.mark.parametrize("backend", SANDBOX_BACKENDS)
def test_the_session_is_confined_like_a_one_shot_run(sandboxes, backend, workspace):
    with sandboxes(backend).session(request(workspace, "confined", memory_mb=128)) as s:
        assert s.exec(["id", "-u"], timeout_s=20).stdout == b"65534\n"
        net = s.exec(["python3", "-c", "import socket; print(sorted(n for _, n in socket.if_nameindex()))"],
                     timeout_s=20)
        assert net.stdout.strip() == b"['lo']"
        ro = s.exec(["bash", "-c", "echo x > /etc/passwd"], timeout_s=20)
        assert ro.exit_code != 0
        oom = s.exec(["python3", "-c", "x = bytearray(1024 ** 3)"], timeout_s=30)
        assert oom.oom_killed and oom.exit_code == 137
        assert s.exec(["echo", "alive"], timeout_s=20).stdout == b"alive\n"  # the OOM took the command only
        if backend == "bwrap":  # the seccomp filter holds for commands too
            code = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
                    "print(libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))")  # CLONE_NEWUSER
            userns = s.exec(["python3", "-c", code], timeout_s=20)
            assert userns.stdout == b"-1 Operation not permitted\n"


@pytest.mark.parametrize("backend", SANDBOX_BACKENDS)
def test_a_sandbox_killed_from_outside_is_an_infrastructure_fault(sandboxes, backend, workspace):
    sb = sandboxes(backend)
    with sb.session(request(workspace, "killed")) as s:
        assert s.exec(["true"], timeout_s=20).exit_code == 0
        if backend.startswith("docker") or backend == "podman":
            sb.client.api.kill(s.live.cid)  # the daemon logs a kill the harness did not send
        else:
            # bwrap's monitor, outside the sandbox's pid namespace (out of the agent's reach):
            # it dies without reporting an exit. (An outside SIGKILL of the sandbox's PID 1
            # reads exactly as the agent's own end, exit 137: see validate.sandbox.bwrap.backend.)
            pid1 = os.pidfd_open(s.live.launch.pid1)
            try:
                os.kill(_parent(s.live.launch.pid1), signal.SIGKILL)
                # The sandbox goes with its monitor (--die-with-parent), but not at once: a
                # command sent before it has gone would run, and rightly answer.
                assert select.select([pid1], [], [], 20)[0], "the sandbox outlived its monitor"
            finally:
                os.close(pid1)
        with pytest.raises(SandboxError):
            s.exec(["true"], timeout_s=20)
        s.stop()
        s.stop()  # safe twice


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


HOSTILE = [pytest.param("docker", "kill -TERM 1", marks=pytest.mark.docker),
           pytest.param("bwrap", "kill -9 $PPID", marks=pytest.mark.bwrap),
           pytest.param("bwrap", "kill -TERM 1", marks=pytest.mark.bwrap)]


@pytest.mark.parametrize(("backend", "command"), HOSTILE)
def test_an_agent_that_ends_its_own_sandbox_ends_its_attempt_not_the_infrastructure(sandboxes, backend,
                                                                                    command, workspace):
    with sandboxes(backend).session(request(workspace, "hostile")) as s:
        try:
            r = s.exec(["bash", "-c", command], timeout_s=20)
            assert not r.timed_out  # the command's own end: whatever it reports, it was quick
            s.exec(["sleep", "10"], timeout_s=20)  # taken down by the dying sandbox if it starts at all
        except SandboxError as e:
            pytest.fail(f"the agent's own doing was taken for an infrastructure fault: {e}")
        except SandboxEnded as e:
            assert "before its deadline" in str(e)
        else:
            pytest.fail("the sandbox outlived the agent's kill of its PID 1 / command server")
        with pytest.raises(SandboxEnded):  # and it stays ended
            s.exec(["true"], timeout_s=20)


@pytest.mark.parametrize(("backend", "command"), HOSTILE)
def test_the_model_attempt_of_such_an_agent_is_scored_not_lost_to_infrastructure(sandboxes, backend, command,
                                                                                   taskset3, tmp_path):
    from tests.conftest import make_ctx, make_manifest
    from tests.test_eval_agent import contract
    from validate.devtools.localserver import serve
    from validate.eval.client import ChatClient
    from validate.kinds.chat import EvalContext, attempt_once, model_play

    # The kill; one more command, which the dying sandbox takes down with it if it starts at
    # all; an answer, which the conversation must never reach.
    def hostile(body: dict) -> dict:
        done = sum(m.get("role") == "tool" for m in body["messages"])
        if done < 2:
            return {"content": None, "tool_calls": [{"id": f"c{done}", "type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"command": "sleep 10" if done else command})}}]}
        return {"content": "the sandbox outlived the kill"}

    sb = sandboxes(backend)
    ctx = make_ctx(make_manifest(sb, idx=[7], max_papers=3), sb, tmp_path / "run")
    with serve({"hostile": hostile}) as server:
        ec = EvalContext(run=ctx, contract=contract(server.base_url, model="hostile"),
                         client=ChatClient(server.base_url), journal=None)
        attempt, entry = attempt_once(ec, model_play(ec, "greedy", 0.0, 1, [7]), 0.0, ctx.taskset.task(7), 0,
                                      1)
    assert attempt.status == "exit_nonzero", (attempt.status, attempt.error_message)
    assert attempt.error_class == "SandboxEnded" and "before its deadline" in attempt.error_message
    assert attempt.reward is not None and not entry.sample.solved  # scored as it stands: no final message
    assert (entry.sample.failure_class, entry.sample.failure_rule) == ("capability", "sandbox-ended")
    # cut short in a tool call
    assert entry.sample.termination == "sandbox_ended" and len(entry.turns) in (1, 2)
    ended = [c for t in entry.turns for c in t.tool_calls if c.error and "ended the sandbox" in c.error]
    assert len(ended) == 1  # the call that ended it is in the trajectory


@pytest.mark.parametrize("backend", SANDBOX_BACKENDS)
def test_the_watchdog_ends_a_session_nobody_stops(sandboxes, backend, workspace):
    sb = sandboxes(backend)
    s = sb.session(request(workspace, "watchdog", timeout_s=1.0)).start()
    try:
        time.sleep(1.0 + 5.0 + 2.0)  # the request's timeout, the backstop, and slack
        if backend.startswith("docker") or backend == "podman":
            assert not sb.client.api.inspect_container(s.live.cid)["State"]["Running"]
        else:
            assert s.live.launch.proc.poll() is not None or not Path(f"/proc/{s.live.launch.pid1}").exists()
        with pytest.raises(SandboxError):
            s.exec(["true"])  # nothing is left of the deadline either
            raise SandboxError("the deadline passed")
    finally:
        s.stop()


@pytest.mark.parametrize("backend", SANDBOX_BACKENDS)
def test_close_ends_live_sessions(sandboxes, backend, workspace):
    from validate.sandbox import open_sandbox

    sb = open_sandbox(backend, image=sandboxes(backend).image, run_label="pytest-session-close")
    s = sb.session(request(workspace, "close")).start()
    sb.close()
    with pytest.raises(SandboxError):
        s.exec(["true"], timeout_s=20)
    s.stop()
    if backend.startswith("docker") or backend == "podman":
        assert not sb.client.api.containers(
            all=True, filters={"label": "deshuffle-validate=pytest-session-close"}
        )
    else:
        out = subprocess.run(["pgrep", "-f", f"close-{os.getpid()}"], capture_output=True, text=True).stdout
        assert not out.strip()
