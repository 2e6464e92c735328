"""Harbor task directories validated end to end through the ``trial`` attempt kind: a
contract frozen on tasks of the sample dataset, every agent played through docker (each task
its own image, built against the base-image map; the verifier in the agent's container once
every process of the agent's is gone), each task's verdict and reason equal to the label in its own
[metadata], and the audit passing — the reward read again from the verifier record kept as the reply."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import make_ctx, make_manifest
from validate.audit.run import audit
from validate.run.phases import RunPhase, run_agents

pytestmark = pytest.mark.docker

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
#: One sound task and one of each kind of exclusion the trial decides (a leak, a verifier
#: that writes garbage, one that writes nothing over a stale reward baked into the image, a
#: base the map does not serve, a GPU, a task.toml that does not load, a verifier that looks
#: a host up); a task that declares a public network and uses none; a separate verifier.
PICK = ("csv-to-json", "nop-passes", "answer-in-image", "garbage-reward-txt", "no-reward-written",
        "unmapped-base", "gpu-required", "bad-task-toml", "verifier-needs-network", "declared-public-network",
        "separate-verifier")


def label(task_id: str) -> tuple[str, str]:
    meta = tomllib.loads((SAMPLE / task_id / "task.toml").read_text())["metadata"]
    return meta["expected_verdict"], meta["expected_reason"]


@pytest.fixture(scope="module")
def harbor_run(tmp_path_factory, sandboxes):
    from validate.core import environments

    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(SAMPLE)))
    idx = [i for i in range(ts.size) if ts.task(i).id in PICK]
    sandbox = sandboxes("docker")
    manifest = make_manifest(sandbox, idx=idx, env_name="harbor", dataset=str(SAMPLE), min_task_count=1)
    run_dir = tmp_path_factory.mktemp("harbor") / "run"
    summary = run_agents(make_ctx(manifest, sandbox, run_dir, concurrency=2), RunPhase())
    return run_dir, summary


def test_every_verdict_and_reason_is_the_tasks_own_label(harbor_run):
    run_dir, summary = harbor_run
    tasks = pd.read_parquet(run_dir / "tasks.parquet").set_index("task_id")
    assert sorted(tasks.index) == sorted(PICK)
    reason = lambda t: tasks.loc[t, "reason"] if isinstance(tasks.loc[t, "reason"], str) else ""  # noqa: E731
    got = {t: (tasks.loc[t, "verdict"], reason(t)) for t in PICK}
    assert got == {t: label(t) for t in PICK}, tasks[["verdict", "reason", "detail"]].to_dict("index")
    assert "control test-reader passed" in tasks.loc["answer-in-image", "detail"]
    assert "control nop passed" in tasks.loc["nop-passes", "detail"]
    assert "ubuntu:24.04" in tasks.loc["unmapped-base", "detail"]
    assert "the verifier looked up checker.example.com" in tasks.loc["verifier-needs-network", "detail"]


def test_lookups_are_the_resolvers_and_a_separate_verifier_sees_the_artifacts(harbor_run):
    run_dir, _ = harbor_run
    att = pd.read_parquet(run_dir / "attempts.parquet")
    net = att[att["task_id"] == "verifier-needs-network"].set_index("agent")
    assert net.loc["oracle", "status"] == "unsupported_execution_contract"
    assert net.loc["oracle", "error_message"] == \
        "the verifier looked up checker.example.com (no network on this profile)"
    assert net.loc["nop", "status"] != "unsupported_execution_contract"  # a control's lookups change nothing
    assert "verifier phase: checker.example.com" in net.loc["nop", "stderr"]
    sep = att[att["task_id"] == "separate-verifier"].set_index("agent")
    assert (sep.loc["oracle", "reward"], sep.loc["nop", "reward"]) == (1.0, 0.0)


def test_trials_record_the_task_image_and_the_verifier_record(harbor_run):
    run_dir, _ = harbor_run
    att = pd.read_parquet(run_dir / "attempts.parquet")
    played = att[att["task_id"] == "csv-to-json"].set_index("agent")
    assert played.loc["oracle", "reward"] == 1.0 and played.loc["oracle", "status"] == "ok"
    records = [
        json.loads((run_dir / "replies" / played.loc[a, "reply_sha256"].removeprefix("sha256:")).read_bytes())
        for a in played.index
    ]
    assert len({r["image"] for r in records}) == 1 and records[0]["image"].startswith("sha256:")
    assert set(records[0]["files"]) & {"reward.txt", "reward.json"}
    forger = played.loc["reward-forger"]
    assert forger["reward"] == 0.0 and "left in /logs/verifier" in forger["stderr"]
    stale = att[att["task_id"] == "no-reward-written"]
    assert (stale["status"] == "scorer_error").all() and stale["reward"].isna().all()


def test_the_audit_reads_every_reward_again_from_the_kept_records(harbor_run):
    run_dir, _ = harbor_run
    result = audit(run_dir)
    assert result.problems == []
    assert any("rewards re-scored" in line for line in result.checked), result.checked


def test_the_claim_counts_what_the_oracle_certified_and_what_resisted_every_tampering_control(harbor_run):
    run_dir, summary = harbor_run
    tasks = pd.read_parquet(run_dir / "tasks.parquet").set_index("task_id")
    certified = int(tasks["oracle_certified"].sum())
    c = json.loads((run_dir / "run.json").read_text())["counts"]
    assert (c["oracle_certified"], c["hack_resistant"]) == (certified, c["compatible"])
    assert c["compatible"] == sum(label(t) == ("compatible", "")
                                  for t in PICK) and certified >= c["compatible"]
    from validate.core.paths import REPORT_MD
    from validate.evidence.run import report_inputs
    from validate.report.run import render

    report = render(run_dir, report_inputs(run_dir))[REPORT_MD].decode()
    assert (
        f"{certified} oracle-certified, {c['compatible']} of them hack-resistant against 5 tampering controls"
        in report
        and "verifier mode trusted" in report
    )
    att = pd.read_parquet(run_dir / "attempts.parquet")
    tampering = att[att["agent"].str.startswith("tamper-")]
    assert set(tampering["agent"]) == {"tamper-binaries", "tamper-loader", "tamper-path", "tamper-pytest",
                                       "tamper-python"}
    sound = tampering[tampering["task_id"] == "csv-to-json"]
    assert (sound["reward"] == 0.0).all() and all(t["verifier_mode"] == "trusted" for t in sound["trial"])
    # what each planted outside the work paths stayed in its container, recorded, never carried;
    # what two planted in the working directory was carried, and meant nothing to this verifier
    trial = {r.agent: r.trial for r in sound.itertuples()}
    assert all(trial[a]["outside_total"] > 0 and trial[a]["carried_total"] == 0
               for a in ("tamper-binaries", "tamper-loader")), trial
    assert "/app/sitecustomize.py" in list(trial["tamper-python"]["carried"]) and \
        trial["tamper-python"]["outside_total"] > 0
    assert list(trial["tamper-path"]["carried"]) == ["/app/pytest.py"]
    assert "/app/conftest.py" in list(trial["tamper-pytest"]["carried"])


@pytest.mark.parametrize("forge", ["stderr", "planted", "shared_reward"])
def test_the_audit_re_derives_the_harness_s_own_observations_of_each_trial(harbor_run, tmp_path, forge):
    import shutil

    from tests.test_audit_forgery import edit_row, fails

    run = tmp_path / "forged"
    shutil.copytree(harbor_run[0], run)
    trial = lambda r: r.get("trial") is not None  # noqa: E731
    if forge == "stderr":  # the harness's own lines cut from a stderr (a forger hiding a killed process)
        pick = lambda r: trial(r) and r["stderr"].startswith("[")  # noqa: E731
        before = edit_row(run / "attempts.parquet", pick, stderr="")
        assert before["stderr"].startswith("[")
        fails(run, "attempts.parquet", "stderr is not its trial evidence")
    elif forge == "planted":
        edit_row(run / "attempts.parquet", lambda r: trial(r) and r["role"] == "control", planted="/nothing")
        fails(run, "attempts.parquet", "planted")
    else:
        edit_row(run / "attempts.parquet", lambda r: trial(r) and r["role"] == "oracle", shared_reward=1.0)
        fails(run, "attempts.parquet", "shared_reward")
