"""The conformance suite every sandbox backend must pass, on the real daemon / real bwrap.

Each test plays a (sometimes hostile) agent through the whole attempt path (workspace →
sandbox → reply → score) and checks both the recorded attempt and that nothing outside the
sandbox changed. The second half drives the backends directly with `RunRequest`s on a real
attempt storage (`hostile_run`): agent or infrastructure, storage caps, refused system calls,
what the agent can see of the host, file descriptors, a harness SIGKILLed mid-attempt.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import docker
import pytest

from tests.conftest import AGENTS_DIR, SANDBOX_BACKENDS, hostile, make_ctx, make_manifest  # noqa: F401
from validate.core.errors import SandboxError
from validate.core.paths import DEFAULT_IMAGE
from validate.evidence.verdicts import by_task, outcomes_of
from validate.kinds.program import ProgramKind
from validate.run.context import Play
from validate.run.runner import judge, play_task
from validate.run.workspace import workspace_sha256
from validate.sandbox import Limits, Mount, RunRequest, open_sandbox, storage
from validate.sandbox.base import BACKSTOP_S
from validate.sandbox.cgroups import open_cgroups
from validate.sandbox.storage import attempt_storage

pytestmark = pytest.mark.parametrize("backend", SANDBOX_BACKENDS)

LIMITS = Limits(memory_mb=256, pids=64, timeout_s=4.0, max_file_mb=64)


REGISTRY = {name: hostile(name) for name in ("oracle", "empty")}


def contract(sandbox, agent, limits: Limits = LIMITS, idx: int = 0, infra_retries: int = 0):
    controls = [agent.name] if agent.role == "control" else ["empty"]
    return make_manifest(sandbox, idx=[idx], env_name="deshuffle-hostile", controls=controls, limits=limits,
                         infra_retries=infra_retries)


def play(ctx, task, agent, first: int = 1):
    return play_task(ctx, Play("run", ctx.manifest, ctx.taskset, [task.idx], [agent], ProgramKind()), task,
                     agent, 0, first)


@pytest.fixture
def attempt(sandboxes, tmp_path):
    """Play one agent on task 0 (one paper) of a small manifest; return the final attempt."""

    def go(backend: str, agent, limits: Limits = LIMITS, idx: int = 0):
        sandbox = sandboxes(backend)
        ctx = make_ctx(contract(sandbox, agent, limits, idx), sandbox,
                       tmp_path / f"run-{uuid.uuid4().hex[:6]}")
        rows = play(ctx, ctx.taskset.task(idx), agent)
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
    assert att.status == "no_reply" and att.exit_code == 0, (att.status, att.stderr)  # it prints, no reply
    return json.loads(att.stdout)


def test_oracle_passes_and_empty_is_rejected(backend, attempt):
    ok = attempt(backend, REGISTRY["oracle"])
    assert (ok.status, ok.reward, ok.as_expected, ok.exit_code) == ("ok", 1.0, True, 0)
    empty = attempt(backend, REGISTRY["empty"])
    assert (empty.status, empty.reward, empty.reply_sha256, empty.as_expected) == ("no_reply", 0.0, None,
                                                                                   True)


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
    if backend.startswith("docker"):
        # dockerd's json-file log keeps only the last MiB (max-size 1m): the head of that is kept.
        assert set(att.stdout) <= {"o"} and set(att.stderr) <= {"e"}
        assert 0 < len(att.stdout + att.stderr) and len(att.stdout) <= 1000 and len(att.stderr) <= 1000
    else:
        assert (att.stdout, att.stderr) == ("o" * 1000, "e" * 1000)


def test_nothing_is_left_behind(backend, attempt, sandboxes):
    attempt(backend, REGISTRY["oracle"])
    if backend.startswith("docker"):
        client = sandboxes(backend).client
        label = sandboxes(backend).run_label
        assert client.containers.list(all=True, filters={"label": f"deshuffle-validate={label}"}) == []
    else:
        label = sandboxes("bwrap").run_label
        # this session's run label only: other runs may be live
        assert sandboxes("bwrap").hierarchy.names(label) == []


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
    assert att.status == "no_reply" and att.exit_code == 0
    assert_no_sandbox_processes()


def test_tampering_with_the_workspace_changes_nothing_the_scorer_reads(backend, sandboxes, tmp_path):
    sandbox, agent = sandboxes(backend), hostile("tamper")
    manifest = make_manifest(sandbox, idx=[0], env_name="deshuffle-hostile", controls=[agent.name, "empty"],
                             limits=LIMITS, infra_retries=0)
    ctx = make_ctx(manifest, sandbox, tmp_path / "run")
    task = ctx.taskset.task(0)
    first, second = play(ctx, task, agent), play(ctx, task, REGISTRY["empty"])
    att = first[0]
    assert att.status == "ok" and att.reward < 1.0 and att.as_expected
    # The evidence hashes the workspace as materialised, not as the agent left it: the same as
    # an agent that touches nothing on the same task of the same contract (a contract's secret
    # keys its shuffle, so another contract's task 0 is another workspace).
    assert att.workspace_sha256 == second[0].workspace_sha256 == workspace_sha256(dict(task.files))


# --- the backends driven directly with RunRequests ------------------------------------------

RUN_LABEL = "pytest-direct"
AGENT_UID = 65534


@contextmanager
def hostile_run(sandbox, agent: str, limits: Limits = LIMITS, user: str = "65534:65534",
                name: str | None = None):
    """Run tests/agents/<agent>.py in `sandbox` the way an attempt will: workspace, /tmp and
    the agent's files on one fresh attempt storage (a capped tmpfs). Yields (result, storage root)
    while the storage still exists."""
    uid, gid = (int(x) for x in user.split(":"))
    name = name or f"{agent.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    with attempt_storage(RUN_LABEL, name, limits, gid=gid) as root:
        ws, tmp, ad = root / "workspace", root / "tmp", root / "agent"
        for d, owner, mode in ((ws, uid, 0o755), (tmp, uid, 0o700), (ad, 0, 0o755)):
            d.mkdir(mode=mode)
            os.chown(d, owner, gid if owner else 0)
        shutil.copyfile(AGENTS_DIR / f"{agent}.py", ad / "agent.py")
        req = RunRequest(argv=("python3", "-S", "/agent/agent.py"), limits=limits, name=name, user=user,
                         tmp=tmp, mounts=(Mount(source=ws, target="/workspace", read_only=False),
                                 Mount(source=ad, target="/agent")))
        yield sandbox.run(req), root


def run_json(sandbox, agent: str, limits: Limits = LIMITS) -> dict:
    with hostile_run(sandbox, agent, limits) as (result, _):
        assert result.exit_code == 0, (result.exit_code, result.stderr)
        return json.loads(result.stdout)


@pytest.mark.parametrize("fake, code", [("fake-kill", 137), ("fake-exit125", 125), ("fake-bwrap-error", 1)])
def test_faked_infrastructure_faults_are_the_agents_own_failure(backend, sandboxes, tmp_path, fake, code):
    """The issue's three fakes, on both backends: recorded once, as the agent's failure, never
    retried, and the task's reason is not infrastructure_failure."""
    sandbox = sandboxes(backend)
    agent = hostile(fake)
    manifest = make_manifest(sandbox, idx=[0], env_name="deshuffle-hostile", controls=[agent.name],
                             limits=LIMITS, infra_retries=2)
    ctx = make_ctx(manifest, sandbox, tmp_path / "run")
    rows = play(ctx, ctx.taskset.task(0), agent)
    assert [(r.status, r.exit_code, r.as_expected) for r in rows] == [("exit_nonzero", code, True)]
    passed = play(ctx, ctx.taskset.task(0), REGISTRY["oracle"])
    (verdict,) = judge(ctx, by_task(outcomes_of([*rows, *passed])), "run", manifest, ctx.taskset, ("run",))
    assert verdict.reason != "infrastructure_failure" and verdict.verdict == "compatible", verdict


def test_a_kill_from_outside_is_infrastructure(backend, sandboxes):
    """Someone else kills the sandbox (docker kill; bwrap's own process): not the agent's doing."""
    sandbox = sandboxes(backend)
    name = f"victim-{uuid.uuid4().hex[:8]}"
    killed = []

    def kill_from_outside():
        for _ in range(400):
            if backend.startswith("docker") or backend == "podman":
                found = sandbox.client.api.containers(filters={"name": f"dv-{name}"}, quiet=True)
                if found:
                    time.sleep(0.5)
                    if backend == "podman":  # someone's `podman kill`: another client of the same service
                        killed.append(
                            docker.APIClient(base_url=sandbox.host, version="1.41").kill(found[0]["Id"])
                        )
                        return
                    killed.append(
                        subprocess.run(["docker", "kill", found[0]["Id"]], capture_output=True).returncode
                    )
                    return
            else:  # bwrap's monitor: the parent of the sandbox's PID 1, outside the attempt's cgroup
                for pid in map(str, sandbox.hierarchy.pids(f"{sandbox.run_label}-{name}")):
                    ppid = _stat(pid)[1]
                    if _stat(ppid)[0] == "bwrap":
                        time.sleep(0.5)
                        os.kill(int(ppid), signal.SIGKILL)
                        killed.append(ppid)
                        return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_from_outside)
    killer.start()
    try:
        with pytest.raises(SandboxError, match="killed from outside|did not start"):
            with hostile_run(sandbox, "sleeper", Limits(timeout_s=20.0), name=name):
                pass
    finally:
        killer.join()
    assert killed


def _stat(pid: str) -> tuple[str, str]:
    """(command name, parent pid) of `pid`, ("", "") when it is gone."""
    try:
        head, tail = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
    except (OSError, ValueError):
        return "", ""
    return head.split("(", 1)[1], tail.split()[1]


def test_a_sandbox_that_cannot_start_is_infrastructure(backend, sandboxes, monkeypatch, tmp_path):
    """A bind source that is not there; for bwrap also a cgroup it cannot join (reported by
    the missing status of bwrap, whatever the exit code)."""
    sandbox = sandboxes(backend)
    missing = RunRequest(argv=("python3", "-S", "-c", "pass"), name=f"nostart-{uuid.uuid4().hex[:8]}",
                         workdir="/", mounts=(Mount(source=tmp_path / "not-there", target="/workspace"),))
    with pytest.raises(SandboxError, match="not-there"):
        sandbox.run(missing)
    if backend == "bwrap":
        real, made = sandbox.cgroups, []

        def broken(name, req):
            made.extend(real(name, req))
            return [*made[:-1], made[-1] / "no-such-cgroup"]

        monkeypatch.setattr(sandbox, "cgroups", broken)
        try:
            with pytest.raises(SandboxError, match="did not start.*cannot join cgroup"):
                with hostile_run(sandbox, "fake_exit125"):
                    pass
        finally:
            for d in made:  # the run removed those it was given; the real pids one is ours to remove
                if d.exists():
                    d.rmdir()


def test_the_attempt_storage_caps_bytes_and_files(backend, sandboxes):
    sandbox = sandboxes(backend)
    limits = Limits(memory_mb=256, timeout_s=60.0, max_file_mb=16, storage_mb=40, storage_inodes=300,
                    max_log_bytes=65536)
    with hostile_run(sandbox, "storage_filler", limits) as (result, root):
        out = json.loads(result.stdout)
        assert "No space left on device" in out["stopped"], out
        assert 30 <= out["mib"] <= 40 and out["files"] >= 8  # spread over files of 4 MiB, each under the cap
        vfs = os.statvfs(root)
        assert vfs.f_bavail * vfs.f_frsize < 2 << 20
    with hostile_run(sandbox, "inode_filler", limits) as (result, root):
        out = json.loads(result.stdout)
        assert "No space left on device" in out["stopped"], out
        assert 280 <= out["files"] < 300
        assert os.statvfs(root).f_favail == 0


#: What gVisor's Sentry answers (runsc 2022-12-19; validate.sandbox.docker.gvisor): it loads no
#: seccomp profile, grants a user namespace of its own kernel (never the host's; a second one
#: by clone, and the unshare program, are refused), and implements bpf and i386 calls not at all.
GVISOR_ESCAPE_PROBE = {"unshare_user": "ok", "clone_newuser": "EPERM", "mount": "EPERM", "keyctl": "EACCES",
                       "ptrace": "EPERM", "bpf": "ENOSYS", "clone3": "ENOSYS",
                       "personality_no_aslr": "EINVAL", "personality_query": "EINVAL",
                       "socket_vsock": "EAFNOSUPPORT", "i386_abi": "-9",
                       "unshare_program": "exit 1: unshare: unshare failed: Operation not permitted"}


def test_nested_namespaces_and_privileged_calls_are_refused(backend, sandboxes):
    out = run_json(sandboxes(backend), "escape_probe")
    if backend == "docker-gvisor":
        assert out == GVISOR_ESCAPE_PROBE
        return
    for probe in ("unshare_user", "clone_newuser", "mount", "keyctl", "bpf", "personality_no_aslr"):
        assert out[probe] == "EPERM", (probe, out)
    assert out["clone3"] == "ENOSYS" and out["personality_query"] == "ok"
    assert out["unshare_program"].startswith("exit 1"), out
    if backend == "bwrap":  # beyond docker 20.10's default profile, which allows these
        assert (out["ptrace"], out["socket_vsock"], out["i386_abi"]) == ("EPERM", "EPERM",
                                                                         "killed by signal 31"), out


def test_no_host_path_is_visible_inside(backend, sandboxes):
    """PID 1's command line, the environment and the cgroups name nothing of the host; the
    mount table does not show the attempt's storage path. (What it does show: bwrap's root is
    the image's unpacked rootfs, whose host path is in mountinfo; docker's overlay shows its
    /var/lib/docker paths.)"""
    sandbox = sandboxes(backend)
    with hostile_run(sandbox, "introspect", Limits(max_log_bytes=1 << 20),
                     user="65533:65532") as (result, root):
        out = json.loads(result.stdout)
    uid, gid, groups = out["uid_gid"]
    assert (uid, gid) == (65533, 65532) and set(groups) <= {65532}  # the request's user, no other group
    assert out["cmdline_1"].startswith("/usr/bin/timeout -s KILL ") and "/agent/agent.py" in out["cmdline_1"]
    host_paths = [str(root), str(storage.DEFAULT_PARENT), str(AGENTS_DIR), str(Path.cwd()), "/var/lib",
                  "/run/"]
    for key in ("cmdline_1", "environ", "cgroup"):
        assert not [p for p in host_paths if p in out[key]], (key, out[key])
    assert str(root) not in out["mountinfo"] and str(storage.DEFAULT_PARENT) not in out["mountinfo"]
    assert out["fds"] == [0, 1, 2, 3]  # stdio and its own listing: no status pipe, no seccomp fd
    # gVisor's Sentry names the host's /dev/null it was handed an imported host fd, "host:[n]"
    assert out["stdin"] == "/dev/null" or (backend == "docker-gvisor"
                                           and out["stdin"].startswith("host:[")), out


def test_no_fd_leaks_over_200_attempts(backend, sandboxes):
    sandbox = sandboxes(backend)

    def one(i: int) -> int:
        req = RunRequest(argv=("python3", "-S", "-c", "pass"), name=f"fd-{i}-{uuid.uuid4().hex[:8]}",
                         workdir="/", limits=Limits(timeout_s=30.0))
        return sandbox.run(req).exit_code

    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(one, range(20))) == {0}  # warm up: the daemon client's connection pool
        before = sorted(os.listdir("/proc/self/fd"))
        assert set(pool.map(one, range(200))) == {0}
    after = sorted(os.listdir("/proc/self/fd"))
    assert len(after) <= len(before), (before, after)


HARNESS = """
import sys
from pathlib import Path
from validate.core.paths import DEFAULT_IMAGE
from validate.sandbox import Limits, Mount, RunRequest, open_sandbox
from validate.sandbox.storage import attempt_storage

backend, label, agent = sys.argv[1:4]
sandbox = open_sandbox(backend, image=DEFAULT_IMAGE, run_label=label)
limits = Limits(timeout_s=2.0, storage_mb=8)
with attempt_storage(label, "sleeper", limits, gid=65534) as root:
    for d in ("workspace", "agent"):
        (root / d).mkdir(mode=0o755)
    import os
    os.chown(root / "workspace", 65534, 65534)
    (root / "agent" / "agent.py").write_bytes(Path(agent).read_bytes())
    sandbox.run(RunRequest(argv=("python3", "-S", "/agent/agent.py"), limits=limits, name=f"{label}-sleeper",
                           mounts=(Mount(source=root / "workspace", target="/workspace", read_only=False),
                                   Mount(source=root / "agent", target="/agent"))))
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["starting", "running"])
def test_a_sigkilled_harness_leaves_nothing_past_the_backstop_and_the_next_start_sweeps(backend, when):
    """The harness is SIGKILLed while its sandbox starts (bwrap half-way through its set-up,
    a container just created) or while the agent runs: by the backstop nothing of the attempt
    is left running; the next start with the same run label removes the rest."""
    label = f"killed-{uuid.uuid4().hex[:6]}"
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, backend, label,
                                str(AGENTS_DIR / "sleeper.py")],
                               cwd=Path(__file__).resolve().parents[1])
    reply = storage.DEFAULT_PARENT / label / "sleeper" / "workspace" / "reply.txt"
    if backend.startswith("docker") or backend == "podman":
        client = docker.from_env().api if backend.startswith("docker") else \
            docker.APIClient(base_url=os.environ["VALIDATE_PODMAN_HOST"], version="1.41")

        def alive() -> list:
            return client.containers(filters={"label": f"deshuffle-validate={label}"}, quiet=True)
    else:
        def alive() -> list:  # the sandbox's processes, and the launch chain on the host
            chain = subprocess.run(["pgrep", "-f", f"{label}-{label}-sleeper"], capture_output=True,
                                   text=True)
            return [*map(str, open_cgroups().pids(f"{label}-{label}-sleeper")), *chain.stdout.split()]
    for _ in range(1200):
        if (alive() if when == "starting" else reply.exists()):
            break
        assert harness.poll() is None, "the harness ended before its sandbox was up"
        time.sleep(0.005 if when == "starting" else 0.05)
    started = time.monotonic()
    harness.kill()
    harness.wait()
    deadline = started + 2.0 + BACKSTOP_S + 1.0 + 3.0  # its timeout, the backstops, the teardown
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(), "the sandbox outlived its backstop"
    assert (storage.DEFAULT_PARENT / label / "sleeper").is_dir()  # left by the killed harness
    leftovers = open_sandbox(backend, image=DEFAULT_IMAGE, run_label=label)  # the next start
    try:
        assert not (storage.DEFAULT_PARENT / label).exists()
        if backend.startswith("docker") or backend == "podman":
            assert (
                leftovers.client.api.containers(all=True, filters={"label": f"deshuffle-validate={label}"})
                == []
            )
        if backend == "podman":
            assert leftovers.cgroups.names(label) == []
        elif not backend.startswith("docker"):
            assert leftovers.hierarchy.names(label) == []
    finally:
        leftovers.close()


def test_opening_a_backend_sweeps_the_attempt_storage_its_run_left(backend):
    """`open_sandbox`, the one place every backend is opened through, sweeps the run's attempt
    storage (a killed run's tmpfs, still mounted and full), and only that run's."""
    label, other = f"swept-{uuid.uuid4().hex[:6]}", f"kept-{uuid.uuid4().hex[:6]}"
    for run in (label, other):
        target = storage.DEFAULT_PARENT / run / "left"
        target.mkdir(parents=True)
        storage.mount_tmpfs(target, Limits(storage_mb=1))
        (target / "workspace").mkdir()
        (target / "workspace" / "reply.txt").write_text("42")
    try:
        open_sandbox(backend, image=DEFAULT_IMAGE, run_label=label).close()
        assert not (storage.DEFAULT_PARENT / label).exists()
        assert (storage.DEFAULT_PARENT / other / "left" / "workspace" / "reply.txt").read_text() == "42"
    finally:
        storage.sweep(storage.DEFAULT_PARENT, label)
        storage.sweep(storage.DEFAULT_PARENT, other)
