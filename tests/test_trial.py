"""Harbor trials on real docker (the suite's own dockerd): tiny task directories written
here, each built into an image FROM the sandbox image, run through `validate.taskdir.trial.run_trial`.

What is shown: the oracle passes and nop fails on a sound task (the agent and verifier run
as the users task.toml names); the reward forger does not pass a sound task, what it planted
is recorded (and hidden from the verifier), its background rewriter is gone before the
verifier runs; the test reader passes the sample's task that leaves its expected output in the image (and
no sound one);
the history miner passes a task whose answer is in git history (packed, with deltas, and a
stash; the image has no git); a stale reward baked into the image is never read; garbage in
reward.txt is a verifier error; a slow solve.sh is an agent timeout; a hanging test.sh is a
verifier timeout; and after every trial (a Ctrl-C mid-trial too) no container, volume or
snapshot image of the run is left. Then tasks of the committed sample dataset get, trial by
trial, what their labels say.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import docker
import pytest

from environment.harbor.taskdir import HarborTask, load_task
from validate.core.paths import DEFAULT_IMAGE
from validate.core.records import ORACLE
from validate.sandbox.docker.wire import LABEL
from validate.taskdir.trial import docker as dk, run as trial_run
from validate.taskdir.trial.agents import (
    HISTORY_MINER,
    NOP,
    REWARD_FORGER,
    TEST_READER,
    AgentPlan,
    UnknownAgent,
    declared,
    plan,
)
from validate.taskdir.trial.result import TrialLimits
from validate.taskdir.trial.run import UnsupportedTask, apply_limits, run_trial

pytestmark = pytest.mark.docker

RUN_LABEL = f"pytest-trial-{os.getpid()}"
IMAGE_LABEL = f"{LABEL}.test-task-image"
LIMITS = TrialLimits(cpus=1, memory_mb=512, max_agent_timeout_s=60, max_verifier_timeout_s=60)
NUMBERS = "".join(f"{n}\n" for n in (7, -3, 12, 40, 4))  # sums to 60

SUM_INSTRUCTION = "`/app/numbers.txt` holds one integer per line. Write their sum to `/app/sum.txt`.\n"
SOLVE_SUM = """#!/bin/bash
set -eu
id -u
python3 -c 'print(sum(int(l) for l in open("/app/numbers.txt") if l.strip()))' > /app/sum.txt
"""
#: Lists the processes alive while it runs (none of the agent phase's may be), waits long
#: enough for a surviving rewriter to strike, then writes its reward.
TEST_SUM = """#!/bin/bash
for p in /proc/[0-9]*; do tr '\\0' ' ' < "$p/cmdline" 2>/dev/null; echo; done
id -u
sleep 0.6
if [ "$(cat /app/sum.txt 2>/dev/null)" = "60" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
BASE_DOCKERFILE = f"""FROM {DEFAULT_IMAGE}
WORKDIR /app
COPY numbers.txt /app/numbers.txt
RUN chmod 777 /app
"""
CALC_FULL = '"""Sums numbers."""\n\n\ndef total(numbers):\n    result = 0\n    for n in numbers:\n' \
            '        result += n\n    return result\n'
CALC_STUB = '"""Sums numbers."""\n\n\ndef total(numbers):\n    raise NotImplementedError\n'


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _toml(agent_timeout: float = 60, verifier_timeout: float = 60, agent_user: str = "nobody",
          verifier_user: str = "root", memory_mb: int = 4096) -> str:
    return textwrap.dedent(f"""\
        schema_version = "1.4"
        [task]
        name = "test/trial"
        [verifier]
        timeout_sec = {verifier_timeout}
        user = "{verifier_user}"
        [agent]
        timeout_sec = {agent_timeout}
        user = "{agent_user}"
        [environment]
        cpus = 4
        memory_mb = {memory_mb}
        network_mode = "no-network"
        """)


def sum_task(root: Path, name: str, *, dockerfile: str = BASE_DOCKERFILE, env_files: dict | None = None,
             solve: str = SOLVE_SUM, test_sh: str = TEST_SUM, **toml) -> Path:
    _write(root / name, {"task.toml": _toml(**toml), "instruction.md": SUM_INSTRUCTION,
                         "environment/Dockerfile": dockerfile, "environment/numbers.txt": NUMBERS,
                         "solution/solve.sh": solve, "tests/test.sh": test_sh, **(env_files or {})})
    return root / name


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=author", "-c", "user.email=author@example.org", "-c",
                    "init.defaultBranch=main", "-C", str(repo), *args], check=True, capture_output=True)


def history_task(root: Path) -> Path:
    """The implementation committed, then replaced by a stub; the pack made by gc (deltas),
    then a stash of an unrelated edit (loose objects). Built on the host: the image has no git."""
    task = sum_task(root, "answer-in-history",
                    dockerfile=f"FROM {DEFAULT_IMAGE}\nCOPY repo /app\nWORKDIR /app\n",
                    solve=f"#!/bin/bash\ncat > /app/calc.py <<'EOF'\n{CALC_FULL}EOF\n",
                    test_sh="#!/bin/bash\n"
                            "cd /app && if python3 -c 'import calc; assert calc.total([1, 2, 3]) == 6'; then "
                            "echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
                    agent_user="root")
    (task / "instruction.md").write_text("Implement `total(numbers)` in `/app/calc.py` (a git repository): "
                                         "the sum of the numbers.\n")
    repo = task / "environment/repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _write(repo, {"calc.py": CALC_FULL, "README": "calc\n"})
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "calc: total")
    _write(repo, {"calc.py": CALC_STUB})
    _git(repo, "commit", "-qam", "task: strip the implementation")
    _git(repo, "gc", "-q", "--aggressive")
    _write(repo, {"README": "calc, a scratch note\n"})
    _git(repo, "stash", "-q")
    return task


@pytest.fixture(scope="module")
def client():
    c = docker.from_env(timeout=120)
    yield c
    dk.sweep(c.api, f"{IMAGE_LABEL}=1")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory, client) -> dict[str, tuple[HarborTask, Path, str]]:
    """Every task of this module, loaded and built once."""
    root = tmp_path_factory.mktemp("harbor")
    sum_task(root, "sound")
    history_task(root)
    sum_task(root, "stale-reward",
             dockerfile=BASE_DOCKERFILE
             + "RUN mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n",
             test_sh="#!/bin/bash\necho pass > /logs/verifier/result.txt\n")
    sum_task(root, "garbage-reward", test_sh="#!/bin/bash\necho PASSED > /logs/verifier/reward.txt\n")
    sum_task(root, "solve-too-slow", solve="#!/bin/bash\nsleep 300\n", agent_timeout=2)
    sum_task(root, "verifier-hangs", verifier_timeout=2,
             test_sh="#!/bin/bash\nmkfifo /tmp/ready\nread -r _ < /tmp/ready\n"
                     "echo 1 > /logs/verifier/reward.txt\n")
    sum_task(root, "solve-oom", memory_mb=64, solve="#!/bin/bash\npython3 -c 'b = bytearray(512 * 2**20)'\n")
    sum_task(root, "no-such-user", agent_user="ghost")
    built = {}
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        task = load_task(root, task_dir.name)
        assert isinstance(task, HarborTask), task
        image, _ = client.images.build(path=str(task_dir / "environment"), labels={IMAGE_LABEL: "1"},
                                       network_mode="none", rm=True, forcerm=True)
        built[task_dir.name] = (task, task_dir, image.id)
    return built


def _left_behind(client) -> list[str]:
    api, f = client.api, {"label": f"{LABEL}={RUN_LABEL}"}
    return ([f"container {c['Id'][:12]}" for c in api.containers(all=True, filters=f)]
            + [f"volume {v['Name']}" for v in (api.volumes(filters=f) or {}).get("Volumes") or []]
            + [f"image {i[:19]}" for i in api.images(all=True, quiet=True, filters=f)])


def trial(client, tasks, name: str, agent: str, limits: TrialLimits = LIMITS, **kwargs):
    task, task_dir, image = tasks[name]
    result = run_trial(client, task, task_dir, image, agent, limits, run_label=RUN_LABEL, **kwargs)
    assert result.cleanup_errors == []
    assert _left_behind(client) == [], f"{name}/{agent} left things behind"
    assert result.image == image and result.task_id == name
    return result


# --- without docker ---------------------------------------------------------------------------------


def test_limits_are_the_tasks_capped_by_the_profile(tasks):
    task = tasks["sound"][0]
    applied = apply_limits(task.config, LIMITS)
    assert (applied.cpus, applied.memory_mb) == (1, 512)  # the task asked for 4 cpus and 4096 MB
    assert (applied.agent_timeout_s, applied.verifier_timeout_s) == (60, 60)
    assert (applied.agent_user, applied.verifier_user) == ("nobody", "root")
    slow = apply_limits(task.config, LIMITS.model_copy(update={"timeout_multiplier": 3.0}))
    assert (slow.agent_timeout_s, slow.verifier_timeout_s) == (60, 60)  # 180 s capped at the profile's 60
    assert apply_limits(tasks["solve-too-slow"][0].config, LIMITS).agent_timeout_s == 2


def test_no_agent_gets_the_tests_and_only_the_oracle_gets_the_solution(tasks):
    task, task_dir, _ = tasks["sound"]
    for agent in [ORACLE, *declared()]:
        paths = [p for p, _, _ in plan(agent, task, task_dir).uploads]
        assert not any(p.startswith("tests") for p in paths), agent
        assert any(p.startswith("solution") for p in paths) == (agent == ORACLE), agent
        if agent != ORACLE:  # the controls are generic: nothing they are given names the task
            given = b"".join(data or b"" for _, _, data in plan(agent, task, task_dir).uploads)
            assert task.id.encode() not in given and task.config.task.name.encode() not in given, agent
    with pytest.raises(UnknownAgent, match="not one of"):
        plan("oracle-but-better", task, task_dir)


def test_a_separate_verifier_without_its_image_is_refused_before_docker_is_touched(tasks, client):
    task, task_dir, image = tasks["sound"]
    separate = task.model_copy(update={"verifier": "separate", "verifier_build": "dockerfile"})
    with pytest.raises(UnsupportedTask, match="separate verifier"):
        run_trial(client, separate, task_dir, image, ORACLE, LIMITS, run_label=RUN_LABEL)
    composed = separate.model_copy(update={"verifier_build": "compose"})
    with pytest.raises(UnsupportedTask, match="separate verifier built from compose"):
        run_trial(client, composed, task_dir, image, ORACLE, LIMITS, run_label=RUN_LABEL,
                  verifier_image=image)


# --- trials -------------------------------------------------------------------------------------------


def test_oracle_passes_a_sound_task_as_the_agent_user(client, tasks):
    r = trial(client, tasks, "sound", ORACLE)
    assert (r.status, r.reward, r.rewards, r.reward_source) == ("ok", 1.0, {"reward": 1.0}, "reward.txt")
    assert r.agent_run.exit_code == 0 and r.agent_run.stdout.strip() == "65534"  # [agent] user = nobody
    assert r.verifier_run.stdout.strip().endswith("0")  # [verifier] user = root
    assert r.left_in_verifier_dir == [] and "test-stdout.txt" in r.verifier_files
    assert r.applied.pinned_env["PYTHONHASHSEED"] == "0" and r.passed()


@pytest.mark.parametrize("agent", [NOP, TEST_READER, HISTORY_MINER])
def test_nop_and_the_leak_controls_fail_a_sound_task(client, tasks, agent):
    r = trial(client, tasks, "sound", agent)
    assert (r.status, r.reward, r.verifier_error) == ("ok", 0.0, None), r.infrastructure_error
    assert not r.passed()


def test_the_reward_forger_does_not_pass_and_is_recorded(client, tasks):
    r = trial(client, tasks, "sound", REWARD_FORGER)
    assert "rewriter pid" in r.agent_run.stdout
    assert (r.status, r.reward, r.reward_source) == ("ok", 0.0, "reward.txt")  # its reward.json would win
    planted = {f.path: f for f in r.left_in_verifier_dir}
    assert sorted(planted) == ["reward.json", "reward.txt"]
    assert planted["reward.txt"].size == 2 and planted["reward.txt"].sha256.startswith("sha256:")
    assert "reward.json" not in r.verifier_files
    # the verifier's own process list: nothing of the agent phase survived into it
    assert "forger" not in r.verifier_run.stdout and "sleep 0.2" not in r.verifier_run.stdout
    assert "/tests/test.sh" in r.verifier_run.stdout


def test_the_history_miner_passes_a_task_whose_answer_is_in_git_history(client, tasks):
    r = trial(client, tasks, "answer-in-history", HISTORY_MINER)
    assert (r.status, r.reward) == ("ok", 1.0), r.agent_run.stdout
    assert "restored /app/calc.py" in r.agent_run.stdout
    assert trial(client, tasks, "answer-in-history", NOP).reward == 0.0


@pytest.mark.parametrize("mode", ["trusted", "shared"])
def test_a_stale_reward_in_the_image_is_never_read(client, tasks, mode):
    r = trial(client, tasks, "stale-reward", ORACLE, limits=LIMITS.model_copy(update={"verifier_mode": mode}))
    assert r.verifier_mode == mode
    assert (r.status, r.reward, r.verifier_error.kind) == ("verifier_error", None, "missing")
    # the harness's own directory is bound at /logs/verifier from the start (both modes, on this
    # machine's daemon): the image's file is hidden from both phases
    assert r.left_in_verifier_dir == []
    assert "result.txt" in r.verifier_files and "reward.txt" not in r.verifier_files
    assert not r.passed(threshold=0.0)


def test_garbage_in_reward_txt_is_a_verifier_error(client, tasks):
    r = trial(client, tasks, "garbage-reward", ORACLE)
    assert (r.status, r.reward, r.rewards) == ("verifier_error", None, {})
    assert (r.verifier_error.kind, r.verifier_error.file) == ("unparsable", "reward.txt")
    assert "PASSED" in r.verifier_error.detail


def test_a_solve_sh_past_the_agent_timeout_is_an_agent_timeout(client, tasks):
    r = trial(client, tasks, "solve-too-slow", ORACLE)
    assert r.status == "agent_timeout" and r.agent_run.timed_out and r.agent_run.exit_code is None
    assert 2 <= r.agent_run.runtime_s < 6
    assert r.reward == 0.0 and not r.passed()  # what it left is still verified, as in Harbor


def test_a_hanging_verifier_is_a_verifier_timeout(client, tasks):
    r = trial(client, tasks, "verifier-hangs", ORACLE)
    assert (r.status, r.verifier_error.kind, r.reward) == ("verifier_error", "timeout", None)
    assert r.verifier_run.timed_out and 2 <= r.verifier_run.runtime_s < 6
    assert r.agent_run.exit_code == 0


def test_a_ctrl_c_in_the_verifier_phase_leaves_nothing_behind(client, tasks, monkeypatch):
    task, task_dir, image = tasks["sound"]
    real = trial_run.dk.run_exec
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 2:  # the verifier's exec: the snapshot and both volumes exist by now
            assert _left_behind(client)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trial_run.dk, "run_exec", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_trial(client, task, task_dir, image, ORACLE, LIMITS, run_label=RUN_LABEL)
    assert len(calls) == 2 and _left_behind(client) == []


def test_a_solve_sh_past_its_memory_is_an_agent_oom(client, tasks):
    r = trial(client, tasks, "solve-oom", ORACLE)
    assert (r.status, r.applied.memory_mb) == ("agent_oom", 64)
    assert r.agent_run.oom_killed and r.agent_run.exit_code == 137
    assert r.reward == 0.0 and not r.verifier_run.oom_killed


def test_an_agent_user_the_image_lacks_is_the_tasks_error(client, tasks):
    r = trial(client, tasks, "no-such-user", NOP)
    assert r.status == "ok"  # nop runs nothing: the user is never asked for
    r = trial(client, tasks, "no-such-user", ORACLE)
    assert (r.status, r.reward, r.infrastructure_error) == ("task_error", None, None)
    assert "'ghost' is not in the image" in r.task_error


# --- the committed sample dataset -----------------------------------------------------------------

SAMPLE = Path(__file__).resolve().parents[1] / "examples/harbor-sample"
#: (task, agent, status, reward, verifier error kind): what each label of the sample implies
#: for one trial. The sample's images build FROM python:3.11-slim-bookworm, which no machine
#: here can pull: the sandbox image (Debian's python3 3.11) stands in for it, as a profile's
#: base-image map serves a base.
SAMPLE_CASES = [
    ("answer-in-image", TEST_READER, "ok", 1.0, None),
    ("csv-to-json", ORACLE, "ok", 1.0, None),
    ("csv-to-json", TEST_READER, "ok", 0.0, None),
    ("loopback-service", ORACLE, "ok", 1.0, None),
    ("multi-key-reward", ORACLE, "ok", 1.0, None),
    ("nop-passes", NOP, "ok", 1.0, None),
    ("oracle-fails", ORACLE, "ok", 0.0, None),
    ("nan-reward-json", ORACLE, "verifier_error", None, "non_finite"),
    ("reward-out-of-range", ORACLE, "verifier_error", None, "out_of_range"),
    ("no-reward-written", ORACLE, "verifier_error", None, "missing"),
]


@pytest.fixture(scope="module")
def sample(tmp_path_factory, client) -> dict[str, tuple[HarborTask, Path, str]]:
    root = tmp_path_factory.mktemp("sample")
    built = {}
    for name in sorted({case[0] for case in SAMPLE_CASES}):
        shutil.copytree(SAMPLE / name, root / name)
        dockerfile = root / name / "environment/Dockerfile"
        dockerfile.write_text(dockerfile.read_text().replace("python:3.11-slim-bookworm", DEFAULT_IMAGE))
        task = load_task(root, name)
        assert isinstance(task, HarborTask), task
        image, _ = client.images.build(path=str(root / name / "environment"), labels={IMAGE_LABEL: "1"},
                                       network_mode="none", rm=True, forcerm=True)
        built[name] = (task, root / name, image.id)
    return built


@pytest.mark.parametrize(("name", "agent", "status", "reward", "error"), SAMPLE_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in SAMPLE_CASES])
def test_sample_tasks_get_what_their_labels_say(client, sample, name, agent, status, reward, error):
    r = trial(client, sample, name, agent)
    assert (r.status, r.reward, r.verifier_error and r.verifier_error.kind) == (status, reward, error), r
    if agent == TEST_READER and reward:
        assert "copied /app/expected/top10.txt -> /app/top10.txt" in r.agent_run.stdout
    if name == "multi-key-reward":
        assert (r.reward_source, r.rewards) == ("reward.json",
                                                {"from_roman": 1.0, "reward": 1.0, "to_roman": 1.0})


def test_the_test_reader_matches_leaks_to_the_targets_the_instruction_names(tmp_path):
    from environment.harbor.agents import reader

    text = "Write the top words of `/app/book.txt` to `/app/top10.txt`. Logs go to /var/log/app/."
    assert reader.targets(text) == ["/app/book.txt", "/app/top10.txt", "/var/log/app"]
    assert {reader.key(n) for n in ("top10.txt", "top10.txt.expected", "expected_top10.txt",
                                    "top10_golden.txt")} == {"top10.txt"}
    assert reader.leaky("/app/expected/top10.txt") and not reader.leaky("/app/book.txt")
    assert reader.testish("/srv/tests/helpers.py") and reader.testish("/app/check_out.py")
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("6abfd1529a41878057e94097f6a3bdacd6ef79254c452a51bc1b17cbf020b254  out/top10.txt\n")
    assert reader.checksums(str(sums)) == [
        ("6abfd1529a41878057e94097f6a3bdacd6ef79254c452a51bc1b17cbf020b254", "top10.txt")
    ]


def test_an_agent_that_wrecks_the_mount_points_gets_a_verdict_not_an_infrastructure_error(client, tasks,
                                                                                          monkeypatch):
    """/logs/verifier removed and made a file, /tests emptied with a link to /etc in it, both
    made unreadable: both are mount points of the harness's own (they cannot go, nor become a
    file), the harness makes both its directories again, and the verifier runs as usual."""
    wreck = ("rm -rf /logs/verifier /tests; echo forged > /logs/verifier; ln -s /etc /tests/etc;"
             " chmod 000 /logs /tests")
    monkeypatch.setattr(trial_run, "agent_plan", lambda agent, task, task_dir: AgentPlan(
        name=agent, command=["sh", "-c", wreck], output="/logs/agent/wrecker.txt"))
    r = trial(client, tasks, "answer-in-history", "wrecker")
    assert (r.status, r.reward, r.infrastructure_error) == ("ok", 0.0, None)
    assert r.left_in_verifier_dir == []


def test_a_container_killed_from_outside_is_an_infrastructure_error(client, tasks, monkeypatch):
    """Someone's ``docker kill`` mid-agent-phase: the daemon's state and events say so (the
    agent cannot stop its container's PID 1), and nothing of the trial is left."""
    monkeypatch.setattr(trial_run, "agent_plan", lambda agent, task, task_dir: AgentPlan(
        name=agent, command=["sleep", "30"], output="/logs/agent/sleeper.txt"))

    def killer():  # once the agent's command runs
        for _ in range(300):
            for c in client.api.containers(filters={"label": f"{LABEL}={RUN_LABEL}", "status": "running"}):
                execs = client.api.inspect_container(c["Id"])["ExecIDs"] or []
                if any(client.api.exec_inspect(e)["Running"] for e in execs):
                    client.api.kill(c["Id"])
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=killer)
    thread.start()
    r = trial(client, tasks, "sound", "sleeper")
    thread.join()
    assert (r.status, r.reward) == ("infrastructure_error", None)
    assert "stopped before the harness killed it" in r.infrastructure_error
    assert "kills by others: 9" in r.infrastructure_error


def test_a_pid1_gone_before_its_daemon_heard_of_it_is_named_once_the_daemon_has(client, tasks):
    """The window the test above can fall into: the container's PID 1 is gone, but the daemon
    still says Running until the runtime's shim reaps it and reports the exit (a cgroup read
    failed meanwhile). Held open here: the shim of this test's own container (under the
    suite's dockerd) stopped while PID 1 is killed from the host, resumed a second later. The
    harness waits for the daemon and names who stopped the container; the failed read is not
    taken for the daemon's fault."""
    _, _, image = tasks["sound"]
    res = dk.Resources(client.api, RUN_LABEL, "shim-lag")
    spec = dk.Spec(image=image, lifetime_s=60, user=None, workdir=None, env={}, cpus=1, memory_mb=256,
                   pids=64)
    agent = trial_run.start_agent(res, spec, [])
    shim = int(dk.read_status(agent.pid)["PPid"])
    cmdline = Path(f"/proc/{shim}/cmdline").read_bytes().split(b"\0")
    assert b"containerd-shim" in cmdline[0] and agent.cid.encode() in cmdline, cmdline  # its own shim
    resume = threading.Timer(1.0, os.kill, (shim, signal.SIGCONT))
    try:
        os.kill(shim, signal.SIGSTOP)
        os.kill(agent.pid, signal.SIGKILL)
        for _ in range(500):
            if not dk.pid_alive(agent.pid):
                break
            time.sleep(0.01)
        assert not dk.pid_alive(agent.pid)
        assert client.api.inspect_container(agent.cid)["State"]["Running"]  # the window is open
        resume.start()
        fault = dk.DockerFault(f"docker: the cgroup of the container's PID 1 ({agent.pid}) cannot be read")
        with pytest.raises(dk.DockerFault, match="stopped before the harness killed it") as raised:
            trial_run.stopped_under(res, agent, fault)
        assert raised.value is not fault
        assert "(exit 137," in str(raised.value)
    finally:
        resume.cancel()
        os.kill(shim, signal.SIGCONT)
        assert res.close() == []


def test_an_image_docker_does_not_have_is_an_infrastructure_error(client, tasks):
    task, task_dir, _ = tasks["sound"]
    r = run_trial(client, task, task_dir, "sha256:" + "0" * 64, NOP, LIMITS, run_label=RUN_LABEL)
    assert r.status == "infrastructure_error" and "No such image" in r.infrastructure_error
    assert r.cleanup_errors == [] and _left_behind(client) == []
