"""The tampering controls against a sound task, on real docker, bwrap and rootless podman:
where the verifier shares the agent's environment (Harbor's shared mode), an agent that
replaces the verifier's shell or interpreter, shadows them on PATH, plants a Python start-up
hook or preloads a library gets the passing reward without doing the task; the trusted
verifier (a fresh container or overlay of the pristine image, the agent's changes under the
task's work paths carried) gives them 0, and records what each planted outside its work
paths. A control that removes every shell leaves the verifier without a reward (the
harness's own program still runs: no infrastructure fault); an exec the harness did not make
during the verifier's phase voids the trial (harness_error); a trial's host files live on its
capped storage."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from environment.harbor.taskdir import HarborTask, load_task
from tests import test_trial
from tests.test_trial import IMAGE_LABEL, LIMITS, RUN_LABEL, _left_behind, sum_task
from validate.core.paths import DEFAULT_IMAGE
from validate.taskdir.trial import docker as dk, run as trial_run
from validate.taskdir.trial.agents import AgentPlan, declared
from validate.taskdir.trial.run import run_trial

#: test_trial's client fixture, shared: pytest finds it by this module-level name (bound by
#: assignment: ruff reads a test's parameter named like an imported fixture as a redefinition).
client = test_trial.client

TAMPERING = sorted(n for n, a in declared().items() if a.tampers)
#: Those whose planted program a `python3 /tests/check.py` verifier (run by bash) meets.
MEETS_SUM_VERIFIER = ["tamper-binaries", "tamper-loader", "tamper-path", "tamper-python"]
CHECK = "import sys\nsys.exit(0 if open('/app/sum.txt').read().strip() == '60' else 1)\n"
TEST_CHECK = ("#!/bin/bash\n"
              "if python3 /tests/check.py; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")


@pytest.fixture(scope="module")
def sound(tmp_path_factory, client) -> tuple[HarborTask, Path, str]:
    """A sound task whose verifier is bash running python3 (as most Harbor tasks' are), its
    agent root (as most Harbor tasks' agents are: they may write anywhere)."""
    root = tmp_path_factory.mktemp("tamper")
    task_dir = sum_task(root, "sound-root", agent_user="root", test_sh=TEST_CHECK)
    (task_dir / "tests" / "check.py").write_text(CHECK)
    task = load_task(root, "sound-root")
    assert isinstance(task, HarborTask), task
    image, _ = client.images.build(path=str(task_dir / "environment"), labels={IMAGE_LABEL: "1"},
                                   network_mode="none", rm=True, forcerm=True)
    return task, task_dir, image.id


def _trial(client, sound, agent: str, mode: str, **kwargs):
    task, task_dir, image = sound
    r = run_trial(client, task, task_dir, image, agent, LIMITS.model_copy(update={"verifier_mode": mode}),
                  run_label=RUN_LABEL, **kwargs)
    assert r.cleanup_errors == [] and _left_behind(client) == []
    assert r.infrastructure_error is None and r.harness_error is None, (r.infrastructure_error,
                                                                        r.harness_error)
    return r


def test_every_tampering_control_is_declared_and_none_names_a_task():
    assert TAMPERING == ["tamper-binaries", "tamper-loader", "tamper-path", "tamper-pytest", "tamper-python"]
    for name in TAMPERING:
        text = declared()[name].program.read_text()
        assert "harbor-sample" not in text and "sound" not in text, name


@pytest.mark.docker
@pytest.mark.parametrize("agent", MEETS_SUM_VERIFIER)
def test_a_tampering_control_passes_the_shared_verifier_and_not_the_trusted_one(client, sound, agent):
    shared = _trial(client, sound, agent, "shared")
    assert (shared.status, shared.reward) == ("ok", 1.0), (shared.agent_run.stdout,
                                                           shared.verifier_run.stderr)
    trusted = _trial(client, sound, agent, "trusted")
    assert (trusted.status, trusted.reward,
            trusted.verifier_mode) == ("ok", 0.0, "trusted"), trusted.agent_run.stdout
    assert trusted.work_paths == ["/app", "/logs/artifacts"]
    # what it planted stayed in its own container, recorded from the daemon's diff
    assert trusted.outside_changes_total > 0 and all(not c.path.startswith("/app/")
                                                     for c in trusted.outside_changes)
    # a module planted in the working directory is carried (it is the agent's work to the rule):
    # this verifier never imports it
    planted_in_workdir = {"tamper-path": ["/app/pytest.py"], "tamper-python": [
        "/app/00-dv-hook.pth", "/app/_dv_hook.py", "/app/sitecustomize.py", "/app/usercustomize.py"]}
    assert trusted.carried == planted_in_workdir.get(agent, []), trusted.carried


@pytest.mark.docker
def test_the_oracle_passes_the_trusted_verifier_with_its_work_carried(client, sound):
    r = _trial(client, sound, "oracle", "trusted")
    assert (r.status, r.reward) == ("ok", 1.0)
    assert r.carried == ["/app/sum.txt"] and r.outside_changes_total == 0


#: Removes every shell of the image (root can): the verifier has nothing to run test.sh with.
NO_SHELL = "rm -f /usr/bin/bash /usr/bin/dash /usr/bin/sh /bin/sh /bin/bash /bin/dash; echo removed"


@pytest.mark.docker
def test_a_control_that_removes_every_shell_leaves_a_verifier_error_never_an_infrastructure_fault(
        client, sound, monkeypatch):
    monkeypatch.setattr(trial_run, "agent_plan", lambda agent, task, task_dir: AgentPlan(
        name=agent, command=["/usr/bin/python3", "-c", f"import os; os.system({NO_SHELL!r})"],
        output="/logs/agent/x.txt"))
    r = _trial(client, sound, "no-shell", "shared")
    assert (r.status, r.verifier_error.kind, r.verifier_run.exit_code) == ("verifier_error", "missing", 127)
    # the trusted verifier runs in the image's own container: its shells are there
    assert (_trial(client, sound, "no-shell", "trusted").reward) == 0.0


@pytest.mark.docker
def test_an_exec_the_harness_did_not_make_during_the_verifier_voids_the_trial(client, sound, monkeypatch):
    real = dk.run_exec

    def with_an_outsider(api, cid, argv, *args, **kwargs):
        if argv[:2] == [trial_run.VERIFY[0], "run"]:  # the verifier: someone else execs in its container too
            outsider = api.exec_create(cid, ["sh", "-c", "echo 1 > /logs/verifier/reward.txt"],
                                       user="0")["Id"]
            api.exec_start(outsider, detach=True)
        return real(api, cid, argv, *args, **kwargs)

    monkeypatch.setattr(dk, "run_exec", with_an_outsider)
    task, task_dir, image = sound
    r = run_trial(client, task, task_dir, image, "nop", LIMITS, run_label=RUN_LABEL)
    assert r.status == "harness_error" and "execs the harness did not make" in r.harness_error, r
    assert r.reward is None and not r.passed(0.0)
    assert r.cleanup_errors == [] and _left_behind(client) == []


#: Writes as much as it can into every host file or directory bound into a shared trial.
FILLER = ("for f in /logs/agent/fill /logs/artifacts/fill /etc/hosts /tests/fill /solution/fill; do "
          "dd if=/dev/zero of=$f bs=1M count=200 oflag=append conv=notrunc 2>/dev/null; done; "
          "echo 60 > /app/sum.txt")


@pytest.mark.docker
def test_a_shared_trial_s_host_files_hold_no_more_than_its_storage(client, sound, monkeypatch):
    monkeypatch.setattr(trial_run, "agent_plan", lambda agent, task, task_dir: AgentPlan(
        name=agent, command=["sh", "-c", f"{{ {FILLER}; }} > /logs/agent/filler.txt 2>&1"],
        output="/logs/agent/filler.txt"))
    seen: list[int] = []
    real = trial_run._shared_verifier_phase

    def measured(res, task, task_dir, box, result, limits, *args, **kwargs):
        host = args[2]  # the trial's storage, as the verifier meets it
        st = os.statvfs(host)
        seen.append((st.f_blocks - st.f_bfree) * st.f_frsize)
        return real(res, task, task_dir, box, result, limits, *args, **kwargs)

    monkeypatch.setattr(trial_run, "_shared_verifier_phase", measured)
    task, task_dir, image = sound
    small = LIMITS.model_copy(update={"verifier_mode": "shared", "storage_mb": 16})
    r = run_trial(client, task, task_dir, image, "filler", small, run_label=RUN_LABEL,
                  resolver_image=DEFAULT_IMAGE)
    assert r.infrastructure_error is None, r.infrastructure_error
    # its own output could not be written either (its storage was full); the verifier's phase
    # had its own: the task's tests written, the reward read
    assert (r.status, r.reward) == ("ok", 1.0), (r.agent_run, r.verifier_run)
    assert seen and 15 * 2**20 <= seen[0] <= 16 * 2**20, seen


@pytest.mark.bwrap
@pytest.mark.parametrize("mode", ["shared", "trusted"])
def test_bwrap_the_trusted_overlay_resists_what_the_shared_one_does_not(sandboxes, client, sound, mode):
    from validate.taskdir.trial import bwrap

    task, task_dir, image = sound
    lim = LIMITS.model_copy(update={"verifier_mode": mode})
    got = {}
    for agent in ("oracle", "tamper-binaries", "tamper-python"):
        r = bwrap.run_trial(sandboxes("bwrap"), client, task, task_dir, image, agent, lim)
        assert r.cleanup_errors == [] and r.infrastructure_error is None, (r.cleanup_errors,
                                                                           r.infrastructure_error)
        got[agent] = r.reward
        if mode == "trusted" and agent == "oracle":
            assert r.carried == ["/app/sum.txt"], r.carried
    assert got == ({"oracle": 1.0, "tamper-binaries": 1.0, "tamper-python": 1.0} if mode == "shared"
                   else {"oracle": 1.0, "tamper-binaries": 0.0, "tamper-python": 0.0})


@pytest.mark.podman
def test_podman_the_trusted_verifier_resists_a_tampering_control(tmp_path):
    from tests.test_trial_podman import PodmanSandbox, _image, _left, _trial as podman_trial

    sb = PodmanSandbox(image=DEFAULT_IMAGE, run_label=f"pytest-tamper-{os.getpid()}")
    try:
        root = tmp_path / "tasks"
        task_dir = sum_task(root, "sound-root", agent_user="root", test_sh=TEST_CHECK)
        (task_dir / "tests" / "check.py").write_text(CHECK)
        task = load_task(root, "sound-root")
        image = _image(sb, task_dir)
        label = f"{sb.run_label}-t"
        for agent, reward in (("oracle", 1.0), ("tamper-binaries", 0.0), ("tamper-python", 0.0)):
            r = podman_trial(sb, task, root, image, agent, label)
            assert (r.status, r.reward, r.verifier_mode) == ("ok", reward,
                                                             "trusted"), (agent, r.infrastructure_error)
            assert r.cleanup_errors == [] and _left(sb, label) == []
        # the rootless service's layers are its own: recorded as not bounded by the contract
        assert r.outside_changes_total > 0 and r.storage_bounded is False
    finally:
        dk.sweep(sb.client.api, f"{dk.LABEL}={sb.run_label}")
        sb.close()


#: Writes as much as it can into the container's own filesystem, in bytes and in files, and
#: says how much it got (the layer is the contract's storage: the rest fails ENOSPC), then
#: does the task.
LAYER_FILLER = ("dd if=/dev/zero of=/var/tmp/fill bs=1M count=400 2>/dev/null; "
                "python3 -c 'import os\nos.makedirs(\"/var/tmp/many\")\nn = 0\ntry:\n    while n < 100000:\n"
                "        open(f\"/var/tmp/many/{n}\", \"w\").close(); n += 1\nexcept OSError: pass\n"
                "print(\"files\", n)'; echo bytes $(stat -c %s /var/tmp/fill); rm -rf /var/tmp/many "
                "/var/tmp/fill; echo 60 > /app/sum.txt")


@pytest.mark.docker
@pytest.mark.parametrize("mode", ["trusted", "shared"])
def test_the_container_s_own_filesystem_holds_no_more_than_the_contract_s_storage(client, sound, monkeypatch,
                                                                                  mode):
    monkeypatch.setattr(trial_run, "agent_plan", lambda agent, task, task_dir: AgentPlan(
        name=agent, command=["sh", "-c", f"{{ {LAYER_FILLER}; }} > /logs/agent/layer.txt 2>&1"],
        output="/logs/agent/layer.txt"))
    task, task_dir, image = sound
    small = LIMITS.model_copy(update={"verifier_mode": mode, "storage_mb": 32, "storage_inodes": 2000})
    r = run_trial(client, task, task_dir, image, "layer-filler", small, run_label=RUN_LABEL)
    assert r.infrastructure_error is None and r.cleanup_errors == [] and _left_behind(client) == [], r
    got = dict(line.split() for line in r.agent_run.stdout.splitlines()
               if line.split()[:1] in (["bytes"], ["files"]))
    assert 0 < int(got["bytes"]) <= 32 * 2**20, r.agent_run.stdout
    assert 0 < int(got["files"]) <= 2000, r.agent_run.stdout
    assert (r.status, r.reward, r.storage_bounded) == ("ok", 1.0, True)


def test_the_verifier_words_hold_the_programs_test_sh_runs_by_name_and_by_path(tmp_path):
    from validate.taskdir.trial.agents import verifier_words

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text(
        "#!/bin/bash\nset -e\ncd /app && /opt/venv/bin/python -m pytest tests/ > $LOG\n"
        "if uv run check; then echo 1; fi > /logs/verifier/reward.txt\n")
    words = verifier_words(tmp_path).decode().split()
    assert "/opt/venv/bin/python" in words and "uv" in words and "pytest" in words
    # paths are words too: a control tries them
    assert "/logs/verifier/reward.txt" in words and "/app" in words
    assert not {"if", "then", "cd", "set", "LOG", "tests/"} & set(words), words
