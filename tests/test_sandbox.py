"""The conformance suite every sandbox backend must pass, on the real daemon / real bwrap.

Each test plays a (sometimes hostile) agent through the whole attempt path (workspace →
sandbox → reply → score) and checks both the recorded attempt and that nothing outside the
sandbox changed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from validate.agents import REGISTRY
from validate.runner import play
from validate.sandbox import Limits
from validate.sandbox.bwrap import CGROUP_ROOT, PARENT
from tests.conftest import SANDBOX_BACKENDS, hostile, make_ctx, make_manifest

pytestmark = pytest.mark.parametrize("backend", SANDBOX_BACKENDS)

LIMITS = Limits(memory_mb=256, pids=64, timeout_s=4.0, max_file_mb=64)


@pytest.fixture
def attempt(corpus, corpus_path, sandboxes, tmp_path):
    """Play one agent on task 0 (one paper) of a small manifest; return the final attempt."""

    def go(backend: str, agent, limits: Limits = LIMITS, idx: int = 0):
        sandbox = sandboxes(backend)
        manifest = make_manifest(corpus, corpus_path, sandbox, idx=[idx], limits=limits, infra_retries=0)
        from validate.contract import build_taskset

        taskset = build_taskset(manifest.environment, corpus)
        ctx = make_ctx(manifest, sandbox, taskset, tmp_path / "run")
        rows = play(ctx, taskset.task(idx), agent, 1)
        assert len(rows) == 1
        return rows[0]

    return go


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return ""  # gone


def assert_no_sandbox_processes() -> None:
    """No process of the sandbox uid is alive (a zombie is reaped by the host's init within moments)."""
    for _ in range(50):
        leftover = subprocess.run(["pgrep", "-u", "65534"], capture_output=True, text=True).stdout.split()
        alive = [p for p in leftover if _state(p) not in ("Z", "")]
        if not alive:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes of the sandbox uid outlived the attempt: {alive}")


def probe_json(att) -> dict:
    assert att.status == "ok", (att.status, att.stderr)
    return json.loads(att.stdout)


def test_oracle_passes_and_empty_is_rejected(backend, attempt):
    ok = attempt(backend, REGISTRY["oracle"])
    assert (ok.status, ok.reward, ok.as_expected, ok.exit_code) == ("ok", 1.0, True, 0)
    empty = attempt(backend, REGISTRY["empty"])
    assert (empty.status, empty.reward, empty.reply_sha256, empty.as_expected) == ("ok", 0.0, None, True)


def test_no_network_of_any_kind(backend, attempt):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 47123))
    listener.listen(1)
    listener.settimeout(0.1)
    try:
        out = probe_json(attempt(backend, hostile("net-probe")))
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing reached the host's loopback
    finally:
        listener.close()
    for probe in ("dns", "tcp_outside", "tcp_host_loopback", "tcp_docker_bridge"):
        assert out[probe].startswith("blocked"), out
    assert out["interfaces"] == ["lo"]
    assert out["netns"] != os.readlink("/proc/self/ns/net")  # its own namespace, not the host's


def test_controls_cannot_see_the_answer_key_or_host_secrets(backend, attempt):
    out = probe_json(attempt(backend, hostile("peek")))
    assert out["/answer_key/answer.json"].startswith("denied"), out
    assert out["answer_key_env"] == ""
    for path in ("/etc/shadow", "/var/run/docker.sock", "/run/docker.sock", "/root/.bash_history"):
        assert out[path].startswith("denied"), (path, out)
    for path in ("/etc/pwned", "/agent/agent.py", "/usr/pwned", "/pwned"):
        assert out["write " + path].startswith("denied"), (path, out)
    assert out["uid"] == 65534
    assert not Path("/etc/pwned").exists() and not Path("/pwned").exists()


def test_memory_bomb_is_oom_killed(backend, attempt):
    att = attempt(backend, hostile("memory-bomb"))
    assert att.status == "oom" and att.oom_killed and not att.timed_out
    assert att.reward == 0.0 and att.as_expected


def test_sleeper_times_out_and_its_reply_is_still_scored(backend, attempt):
    att = attempt(backend, hostile("sleeper"), Limits(timeout_s=1.5))
    assert att.status == "timeout" and att.timed_out and att.exit_code is None
    assert att.reply_bytes == len("\\boxed{[1]}") and att.reward == 0.0
    assert att.runtime_s < 10


def test_fork_bomb_is_contained(backend, attempt):
    att = attempt(backend, hostile("fork-bomb"), Limits(pids=32, timeout_s=3.0))
    assert att.status in ("timeout", "exit_nonzero", "oom")
    assert att.reward == 0.0 and att.as_expected
    assert_no_sandbox_processes()


def test_huge_reply_is_capped(backend, attempt):
    att = attempt(backend, hostile("big-reply"), Limits(timeout_s=20.0, max_file_mb=64))
    assert att.status == "reply_too_large"
    assert att.reward == 0.0 and att.metrics["parsed_ok"] == 0.0


def test_garbage_crash_and_symlink_replies(backend, attempt):
    garbage = attempt(backend, hostile("garbage-reply"))
    assert garbage.status == "ok" and garbage.reply_bytes == 4096 and garbage.reward == 0.0
    crash = attempt(backend, hostile("crash"))
    assert crash.status == "exit_nonzero" and crash.exit_code == 1 and "deliberate crash" in crash.stderr
    link = attempt(backend, hostile("symlink-reply"))
    assert link.reply_sha256 is None and link.reward == 0.0  # the host's /etc/shadow was not read


def test_a_flood_on_stdout_and_stderr_is_drained_and_capped(backend, attempt):
    att = attempt(backend, hostile("chatty"), Limits(timeout_s=30.0, max_log_bytes=1000))
    assert att.status == "ok" and att.exit_code == 0
    assert att.reply_bytes == len("\\boxed{[1]}\n")
    if backend == "docker":
        # dockerd's json-file log keeps only the last MiB (max-size 1m): the head of that is kept.
        assert set(att.stdout) <= {"o"} and set(att.stderr) <= {"e"}
        assert 0 < len(att.stdout + att.stderr) and len(att.stdout) <= 1000 and len(att.stderr) <= 1000
    else:
        assert (att.stdout, att.stderr) == ("o" * 1000, "e" * 1000)


def test_nothing_is_left_behind(backend, attempt, sandboxes):
    attempt(backend, REGISTRY["oracle"])
    if backend == "docker":
        client = sandboxes("docker").client
        assert client.containers.list(all=True, filters={"label": "deshuffle-validate=pytest"}) == []
    else:
        for c in ("memory", "pids", "cpu"):  # this session's run label only: other runs may be live
            assert list((CGROUP_ROOT / c / PARENT).glob("pytest-*")) == []


def test_infinite_loop_times_out(backend, attempt):
    att = attempt(backend, hostile("spin"), Limits(timeout_s=2.0))
    assert att.status == "timeout" and att.timed_out and att.reward == 0.0


def test_disk_fillers_are_stopped(backend, attempt):
    att = attempt(backend, hostile("disk-filler"), Limits(timeout_s=30.0, max_file_mb=16, tmpfs_mb=32))
    out = probe_json(att)
    assert out["/tmp"].startswith("stopped"), out
    assert out["/workspace"].startswith("stopped after 16 MiB"), out  # the file-size cap, per file


def test_background_process_does_not_outlive_the_attempt(backend, attempt, tmp_path):
    att = attempt(backend, hostile("daemon"))
    assert att.status == "ok"
    assert_no_sandbox_processes()


def test_tampering_with_the_workspace_changes_nothing_the_scorer_reads(backend, attempt):
    att = attempt(backend, hostile("tamper"))
    assert att.status == "ok" and att.reward < 1.0 and att.as_expected
    # The evidence hashes the workspace as materialised, not as the agent left it.
    assert att.workspace_sha256 == attempt(backend, REGISTRY["empty"]).workspace_sha256
