"""`supervise`: wait for an agent's exit while draining its pipes, in one thread, on real processes;
and what every backend is asked to run (`RunRequest`, `watchdog_argv`)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from validate.sandbox import base
from validate.sandbox.base import BACKSTOP_S, Limits, RunRequest, supervise, watchdog_argv


def start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_output_past_the_pipe_buffer_is_drained_and_the_head_kept():
    proc = start("import sys\nfor _ in range(300):\n    sys.stdout.write('o' * 65536)\n"
                 "    sys.stderr.write('e' * 65536)\n"
                 "sys.exit(3)")
    timed_out, out, err = supervise(proc, 30.0, 100, kill=proc.kill)
    assert (timed_out, out, err, proc.returncode) == (False, b"o" * 100, b"e" * 100, 3)


def test_the_timeout_kills_and_says_so():
    proc = start("import time\nprint('started', flush=True)\ntime.sleep(60)")
    kills = []
    t0 = time.monotonic()
    timed_out, out, _ = supervise(proc, 0.5, 4096, kill=lambda: (kills.append(1), proc.kill()))
    assert timed_out and out == b"started\n" and proc.returncode == -9
    assert len(kills) == 2  # at the timeout, and again after the exit
    assert time.monotonic() - t0 < 5


def test_a_quick_exit_is_seen_at_once():
    proc = start("pass")
    timed_out, out, err = supervise(proc, 30.0, 4096, kill=proc.kill)
    assert (timed_out, out, err, proc.returncode) == (False, b"", b"", 0)


def test_a_leftover_holding_the_pipe_is_given_up_after_the_grace(monkeypatch):
    monkeypatch.setattr(base, "PIPE_GRACE_S", 0.5)
    # The child exits at once; its grandchild keeps stdout open for 30 s, out of kill()'s reach.
    proc = subprocess.Popen(["sh", "-c", "echo hi; sleep 30 & exit 0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    t0 = time.monotonic()
    timed_out, out, _ = supervise(proc, 30.0, 4096, kill=lambda: None)
    assert (timed_out, out, proc.returncode) == (False, b"hi\n", 0)
    assert time.monotonic() - t0 < 5


def test_the_agent_never_runs_as_root():
    for user in ("0:0", "65534:0", "0:65534", "root", "65534", "-1:5"):
        with pytest.raises(ValueError, match="user"):
            RunRequest(argv=("true",), name="root", user=user)
    assert RunRequest(argv=("true",), name="ok", user="1000:1000").uid_gid == (1000, 1000)


def test_the_watchdog_kills_at_the_backstop_even_without_the_harness():
    """The argv every backend runs, on the host: `supervise` is not called, nothing kills it
    but the watchdog itself."""
    t0 = time.monotonic()
    proc = subprocess.run(watchdog_argv(("sleep", "60"), 0.5), capture_output=True)
    elapsed = time.monotonic() - t0
    assert proc.returncode == -9 and 0.5 + BACKSTOP_S - 0.1 <= elapsed < 0.5 + BACKSTOP_S + 5


def test_the_subprocess_backend_kills_the_agents_whole_group_and_gives_it_its_tmp(tmp_path):
    from validate.sandbox.subprocess import SubprocessSandbox

    pidfile = tmp_path / "child.pid"
    code = ("import os, subprocess, sys, time\n"
            "print(os.environ['TMPDIR'], flush=True)\n"
            f"child = subprocess.Popen(['sleep', '60']); open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
            "time.sleep(60)")
    result = SubprocessSandbox().run(RunRequest(argv=("python3", "-c", code), name="sub",
                                                workdir=str(tmp_path), tmp=tmp_path,
                                                limits=Limits(timeout_s=1.0)))
    assert (result.timed_out, result.exit_code, result.stdout) == (True, None, f"{tmp_path}\n".encode())
    child = int(pidfile.read_text())
    for _ in range(100):
        try:
            state = open(f"/proc/{child}/stat").read().rsplit(") ", 1)[1][0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the agent's child outlived the attempt")
