"""The trusted verifier against an agent whose code the verifier runs, on real docker (the
suite's own dockerd): a task whose test.sh sources a script of the image named in it
(``/opt/venv/bin/activate``) and imports the agent's ``/app/calc.py``.

What is shown: a process the agent's code leaves behind while test.sh runs does not outlive
test.sh (the harness's program kills every process of the verifier once test.sh ends, before
the reward is read); a test.sh ended by a signal gives a verifier error, whatever its reward
file says; the image's own script the tests name is the image's, whatever the agent wrote
into it; a layer the agent filled to its last inode, an /etc/hosts filled to its cap and a link
planted in /logs/agent still give the verifier a fresh container that starts, an empty
/logs/agent and the reward the task's work earns.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from environment.harbor.taskdir import HarborTask, load_task
from tests import test_trial
from tests.test_trial import (
    BASE_DOCKERFILE,
    CALC_FULL,
    IMAGE_LABEL,
    LIMITS,
    RUN_LABEL,
    _left_behind,
    sum_task,
)
from validate.taskdir.trial import run as trial_run
from validate.taskdir.trial.agents import AgentPlan
from validate.taskdir.trial.run import run_trial

#: test_trial's client fixture, shared: pytest finds it by this module-level name (bound by
#: assignment: ruff reads a test's parameter named like an imported fixture as a redefinition).
client = test_trial.client

pytestmark = pytest.mark.docker

TEST_RUNS_AGENT_CODE = """#!/bin/bash
. /opt/venv/bin/activate
echo "agent-logs: $(ls -A /logs/agent | wc -l) venv: ${DV_VENV:-unset}"
cd /app
if python3 -c 'import calc; assert calc.total([1, 2, 3]) == 6'; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
[ -e /app/die ] && kill -9 $$
exit 0
"""  # noqa: E501
DOCKERFILE = (
    BASE_DOCKERFILE + "RUN mkdir -p /opt/venv/bin && echo 'export DV_VENV=image' > /opt/venv/bin/activate\n"
)

#: calc.py whose import leaves a rewriter behind (double fork, a new session, signals
#: ignored) that waits for test.sh to end, then writes a passing reward again and again
#: (what it writes while test.sh runs is a race any code the verifier runs may win: not this).
SURVIVOR = r"""
cat > /app/calc.py <<'EOF'
import os, signal, time
def _test_sh_alive():
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and b"/tests/test.sh" in open(f"/proc/{pid}/cmdline", "rb").read():
                return True
        except OSError:
            pass
    return False
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        while _test_sh_alive():
            time.sleep(0.005)
        for _ in range(1000):
            try:
                with open("/logs/verifier/reward.txt", "w") as f:
                    f.write("1\n")
            except OSError:
                pass
            time.sleep(0.005)
    os._exit(0)
def total(numbers):
    return 0
EOF
"""
#: The image's script the tests source, rewritten to plant the reward and end test.sh.
VENV = "printf 'echo 1 > /logs/verifier/reward.txt; exit 0\\n' > /opt/venv/bin/activate; echo planted"
#: The task done, and test.sh told to kill itself once it wrote its reward.
KILLED = f"cat > /app/calc.py <<'EOF'\n{CALC_FULL}EOF\ntouch /app/die\n"
#: The task done; then the layer filled to its last inode, /etc/hosts to its cap, a link
#: planted in /logs/agent.
FILLER = (f"cat > /app/calc.py <<'EOF'\n{CALC_FULL}EOF\n" + r"""python3 -c '
import os
os.makedirs("/var/tmp/many")
n = 0
try:
    while n < 100000:
        open(f"/var/tmp/many/{n}", "w").close(); n += 1
except OSError: pass
print("files", n)'
dd if=/dev/zero of=/etc/hosts bs=1M count=64 oflag=append conv=notrunc 2>/dev/null
ln -s /etc/shadow /logs/agent/link
""")


@pytest.fixture(scope="module")
def runs_agent_code(tmp_path_factory, client) -> tuple[HarborTask, Path, str]:
    root = tmp_path_factory.mktemp("trusted")
    task_dir = sum_task(root, "runs-agent-code", dockerfile=DOCKERFILE, agent_user="root",
                        solve=f"#!/bin/bash\ncat > /app/calc.py <<'EOF'\n{CALC_FULL}EOF\n",
                        test_sh=TEST_RUNS_AGENT_CODE)
    task = load_task(root, "runs-agent-code")
    assert isinstance(task, HarborTask), task
    image, _ = client.images.build(path=str(task_dir / "environment"), labels={IMAGE_LABEL: "1"},
                                   network_mode="none", rm=True, forcerm=True)
    return task, task_dir, image.id


def _play(client, task_, monkeypatch, script: str | None, name: str, mode: str = "trusted", **limits):
    task, task_dir, image = task_
    if script is not None:
        monkeypatch.setattr(trial_run, "agent_plan", lambda agent, task, task_dir: AgentPlan(
            name=agent, command=["sh", "-c", f"exec > /logs/agent/{name}.txt 2>&1\n{script}"],
            output=f"/logs/agent/{name}.txt"))
    r = run_trial(client, task, task_dir, image, name if script else "oracle",
                  LIMITS.model_copy(update={"verifier_mode": mode, **limits}), run_label=RUN_LABEL)
    assert r.cleanup_errors == [] and _left_behind(client) == []
    assert r.infrastructure_error is None and r.harness_error is None, (r.infrastructure_error,
                                                                        r.harness_error)
    return r


def test_the_oracle_passes_with_the_image_s_own_script(client, runs_agent_code, monkeypatch):
    r = _play(client, runs_agent_code, monkeypatch, None, "oracle")
    assert (r.status, r.reward, r.carried) == ("ok", 1.0, ["/app/calc.py"])
    assert "venv: image" in r.verifier_run.stdout
    assert "/opt/venv/bin/activate" in r.named_paths  # named by the tests: its additions only would carry


@pytest.mark.parametrize("mode", ["trusted", "shared"])
def test_a_process_the_agent_s_code_leaves_does_not_outlive_test_sh(client, runs_agent_code, monkeypatch,
                                                                    mode):
    r = _play(client, runs_agent_code, monkeypatch, SURVIVOR, "survivor", mode)
    assert (r.status, r.reward) == ("ok", 0.0), (r.verifier_run, r.verifier_files)


def test_a_test_sh_ended_by_a_signal_is_a_verifier_error_whatever_its_reward_file_says(
        client, runs_agent_code, monkeypatch):
    r = _play(client, runs_agent_code, monkeypatch, KILLED, "killed")
    assert (r.status, r.reward, r.verifier_error.kind) == ("verifier_error", None, "killed"), r.verifier_run


def test_the_image_s_script_the_tests_name_is_the_image_s(client, runs_agent_code, monkeypatch):
    shared = _play(client, runs_agent_code, monkeypatch, VENV, "venv", "shared")
    assert (shared.status, shared.reward) == ("ok", 1.0)  # what the trusted verifier exists for
    r = _play(client, runs_agent_code, monkeypatch, VENV, "venv")
    assert (r.status, r.reward) == ("ok", 0.0) and "venv: image" in r.verifier_run.stdout
    assert "/opt/venv/bin/activate" not in r.carried
    assert "/opt/venv/bin/activate" in [c.path for c in r.outside_changes]


def test_a_layer_full_to_its_last_inode_still_gives_a_fresh_verifier(client, runs_agent_code, monkeypatch):
    r = _play(client, runs_agent_code, monkeypatch, FILLER, "filler", storage_mb=64, storage_inodes=2000)
    assert "files " in r.agent_run.stdout and int(r.agent_run.stdout.split("files ")[1].split()[0]) < 2000
    assert (r.status, r.reward, r.storage_bounded) == ("ok", 1.0, True), r.verifier_run
    # nothing of the agent's in /logs/agent
    assert "agent-logs: 0 " in r.verifier_run.stdout, r.verifier_run.stdout
    # the harness's room to start it again, and no more
    assert r.storage_bounded is True
