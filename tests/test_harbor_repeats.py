"""Three sample tasks on real docker under a contract that plays the oracle five times per
task and asks every reward key to reach the threshold: ``no-solution`` is runtime-tested only
(its controls run, the oracle never does: ``no_reference_solution``, counted apart in the
claim), ``flaky-test``'s verdict follows from its five repeats (flaky whenever they disagree,
which a coin-flip verifier does with probability 15/16), ``multi-key-reward`` passes on all
three of its keys; and the audit derives all of it again from the evidence."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from environment.harbor.env import HarborConfig, HarborEnvironment
from tests.conftest import make_ctx, make_manifest
from validate.audit.run import audit
from validate.report.run import write_report
from validate.run.phases import RunPhase, run_agents

pytestmark = pytest.mark.docker

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
PICK = ("flaky-test", "multi-key-reward", "no-solution")
REPEATS = 5
#: Every control the environment declares (the tampering ones too): each plays the task
#: without a solution, which excuses only the oracle.
CONTROLS = tuple(
    a.name for a in HarborEnvironment().agents(HarborConfig(dataset=str(SAMPLE))) if a.role == "control"
)


def label(task_id: str) -> tuple[str, str]:
    meta = tomllib.loads((SAMPLE / task_id / "task.toml").read_text())["metadata"]
    return meta["expected_verdict"], meta["expected_reason"]


@pytest.fixture(scope="module")
def repeats_run(tmp_path_factory, sandboxes):
    from validate.core import environments

    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(SAMPLE)))
    idx = [i for i in range(ts.size) if ts.task(i).id in PICK]
    sandbox = sandboxes("docker")
    manifest = make_manifest(sandbox, idx=idx, env_name="harbor", dataset=str(SAMPLE), reward_key="all",
                             oracle_repeats=REPEATS, min_task_count=1)
    run_dir = tmp_path_factory.mktemp("harbor-repeats") / "run"
    summary = run_agents(make_ctx(manifest, sandbox, run_dir, concurrency=2), RunPhase())
    write_report(run_dir)
    return run_dir, summary, manifest


def _tasks(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "tasks.parquet").set_index("task_id")


def test_the_contract_freezes_the_repeats_the_key_rule_and_the_missing_reference(repeats_run):
    _, _, m = repeats_run
    assert m.expectations.oracle_repeats == REPEATS and m.environment.config["reward_key"] == "all"
    skips = {t.id: t.skip for t in m.tasks}
    assert set(skips["no-solution"]) == {"oracle"} and "solve.sh" in skips["no-solution"]["oracle"]
    assert skips["flaky-test"] == skips["multi-key-reward"] == {}


def test_the_oracle_plays_every_repeat_and_never_the_task_without_a_solution(repeats_run):
    run_dir, _, _ = repeats_run
    att = pd.read_parquet(run_dir / "attempts.parquet")
    final = att[~att["superseded"]]
    oracle = final[final["agent"] == "oracle"]
    assert sorted(oracle.groupby("task_id")["sample"].apply(sorted).to_dict().items()) == \
        [("flaky-test", list(range(REPEATS))), ("multi-key-reward", list(range(REPEATS)))]
    controls = final[final["role"] == "control"]
    assert (controls["sample"] == 0).all()
    assert sorted(controls[controls["task_id"] == "no-solution"]["agent"]) == sorted(CONTROLS)


def test_no_solution_is_runtime_tested_only_and_the_claim_counts_it_apart(repeats_run):
    run_dir, summary, _ = repeats_run
    tasks = _tasks(run_dir)
    assert (tasks.loc["no-solution", "verdict"], tasks.loc["no-solution", "reason"]) == label("no-solution")
    assert "runtime-tested only" in tasks.loc["no-solution", "detail"]
    assert summary.counts.excluded_by_reason.get("no_reference_solution") == 1
    report = sorted((run_dir / "reports").iterdir())[-1] / "report.md"
    text = report.read_text()
    certified = summary.counts.compatible
    assert (
        f" {certified}/3 ({100 * certified / 3:.1f} %) oracle-certified, 1/3 (33.3 %) runtime-tested only"
        in text
    )


def test_multi_key_reward_passes_on_every_key(repeats_run):
    run_dir, _, _ = repeats_run
    tasks = _tasks(run_dir)
    reason = tasks.loc["multi-key-reward", "reason"]
    assert (tasks.loc["multi-key-reward", "verdict"], reason if isinstance(reason, str) else "") == \
        label("multi-key-reward"), tasks.loc["multi-key-reward", "detail"]
    att = pd.read_parquet(run_dir / "attempts.parquet")
    oracle = att[(att["task_id"] == "multi-key-reward") & (att["agent"] == "oracle")].iloc[0]
    record = json.loads((run_dir / "replies" / oracle["reply_sha256"].removeprefix("sha256:")).read_bytes())
    assert record["key"] == "all" and "reward.json" in record["files"]


def test_the_flaky_verifier_s_verdict_follows_from_its_repeats(repeats_run):
    run_dir, _, _ = repeats_run
    att = pd.read_parquet(run_dir / "attempts.parquet")
    runs = att[(att["task_id"] == "flaky-test") & (att["agent"] == "oracle") & ~att["superseded"]]
    assert (runs["status"] == "ok").all(), runs[["status", "error_message"]]
    passed = int((runs["reward"] == 1.0).sum())
    assert set(runs["reward"]) <= {0.0, 1.0}
    tasks = _tasks(run_dir)
    reason = tasks.loc["flaky-test", "reason"]
    got = (tasks.loc["flaky-test", "verdict"], reason if isinstance(reason, str) else None)
    if 0 < passed < REPEATS:  # probability 15/16: the label's verdict
        assert got == label("flaky-test")
        assert tasks.loc["flaky-test", "detail"] == f"flaky: the oracle passed {passed} of {REPEATS} repeats"
    else:  # the five coin flips agreed (1/16): what they agreed on decides
        assert got == (("compatible", None) if passed == REPEATS
                       else ("excluded", "oracle_fails_on_valid_task"))


def test_the_audit_derives_every_verdict_again(repeats_run):
    run_dir, _, _ = repeats_run
    result = audit(run_dir)
    assert result.problems == []
    assert any("rewards re-scored" in line for line in result.checked), result.checked
