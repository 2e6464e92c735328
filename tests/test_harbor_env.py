"""The Harbor dataset behind the environment seam (`environment.harbor.env`): the sample
dataset as a taskset found by its revision, its families, every task that did not load kept
in its place with blocking findings and no agent to play it, and the agents it declares."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environment.harbor.env import HarborConfig, HarborEnvironment
from environment.harbor.taskdir import load_dataset
from environment.protocol import ConfigError, LoadHints

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
CONFIG = HarborConfig(dataset=str(SAMPLE))


@pytest.fixture(scope="module")
def env():
    return HarborEnvironment()


def test_every_task_directory_is_a_task_in_the_loaders_order_with_its_hash(env):
    ts = env.load(HarborConfig(dataset=str(SAMPLE)))
    ds = load_dataset(SAMPLE)
    every = sorted([*ds.tasks, *ds.invalid], key=lambda t: t.id)
    assert ts.revision == ds.revision and ts.size == len(every) >= 30
    assert [(ts.task(i).id, ts.task(i).hash) for i in range(ts.size)] == [(t.id, t.hash) for t in every]
    with pytest.raises(IndexError):
        ts.task(ts.size)


def test_a_task_that_did_not_load_keeps_its_place_with_blocking_findings_and_no_agent(env):
    ts = env.load(HarborConfig(dataset=str(SAMPLE)))
    bad = [ts.task(i) for i in range(ts.size) if ts.task(i).parsed is None]
    assert {t.id for t in bad} >= {"bad-task-toml", "no-instruction"}
    for t in bad:
        findings = env.findings(t)
        assert findings and all(f.blocking for f in findings)
        assert all(env.not_applicable(a, t) for a in env.agents(CONFIG))
    good = next(ts.task(i) for i in range(ts.size) if ts.task(i).id == "csv-to-json")
    assert env.findings(good) == [] and not any(env.not_applicable(a, good) for a in env.agents(CONFIG))
    assert good.prompt and good.requires_network_isolation


def test_the_family_is_the_named_metadata_key_or_else_the_top_folder(env):
    by_key = env.load(HarborConfig(dataset=str(SAMPLE), family_key="category"))
    fams = {by_key.task(i).id: by_key.task(i).family for i in range(by_key.size)}
    assert fams["c-fix-build"] == by_key.task(next(i for i in range(by_key.size)
                                                   if by_key.task(i).id == "c-fix-build")).meta["category"]
    plain = env.load(HarborConfig(dataset=str(SAMPLE)))
    assert {plain.task(i).family for i in range(plain.size)} == {"tasks"}  # the sample has no family folders


def test_the_dataset_is_found_by_its_revision_under_data_paths(env, tmp_path):
    copy = tmp_path / "elsewhere" / "harbor-sample"
    shutil.copytree(SAMPLE, copy, symlinks=True)
    revision = load_dataset(SAMPLE).revision
    ts = env.load(HarborConfig(dataset="harbor-sample"), LoadHints(revision=revision, search=(copy.parent,)))
    assert ts.root == copy.resolve()
    (copy / "csv-to-json" / "instruction.md").write_text("changed\n")
    with pytest.raises(ConfigError, match=r"dataset: no Harbor dataset directory with revision .*--data"):
        env.load(HarborConfig(dataset="harbor-sample"), LoadHints(revision=revision, search=(copy.parent,)))


def test_the_declared_agents_are_the_programs_the_trial_runs(env):
    """Each declared agent is one program file (plus its support files) in the environment's
    agents folder, no file there is nobody's, and the trial plans exactly that program."""
    from environment.harbor.env import AGENTS
    from validate.taskdir.trial.agents import CONTROL_DIR, declared, plan

    specs = {a.name: a for a in env.agents(CONFIG)}
    assert specs == declared() and len(specs) >= 8
    assert [a.name for a in specs.values() if a.role == "oracle"] == ["oracle"]
    owned = {p for a in specs.values() for p in (a.program, *a.support)}
    assert all(p.is_file() and p.parent == AGENTS for p in owned)
    assert sorted(p.name for p in AGENTS.iterdir() if p.is_file() and p.name != "__init__.py") \
        == sorted(p.name for p in owned)
    ts = env.load(CONFIG)
    task = ts.task(0)
    for a in specs.values():
        if a.role == "control" and not a.baseline:
            uploads = {path: data for path, _, data in plan(a.name, task.parsed, ts.root / task.id).uploads}
            assert uploads[f"{CONTROL_DIR}/{a.program.name}".lstrip("/")] == a.program.read_bytes(), a.name


def test_the_oracle_is_frozen_out_of_a_task_without_a_solution_by_its_role(env):
    """The missing reference excuses the agent whose declared role is oracle, whatever its
    name; the controls still play the task (runtime-tested only)."""
    ts = env.load(CONFIG)
    task = next(ts.task(i) for i in range(ts.size) if ts.task(i).id == "no-solution")
    skips = {a.name: env.not_applicable(a, task) for a in env.agents(CONFIG)}
    assert "solution/solve.sh" in skips["oracle"] and [n for n, why in skips.items() if why] == ["oracle"]
    renamed = next(a for a in env.agents(CONFIG)
                   if a.role == "oracle").model_copy(update={"name": "reference"})
    assert env.not_applicable(renamed, task) == skips["oracle"]
    control = next(a for a in env.agents(CONFIG) if a.role == "control").model_copy(update={"name": "oracle"})
    assert env.not_applicable(control, task) is None


def test_the_reward_key_rule_is_frozen_and_applied_to_the_record(env):
    from environment.harbor.reward import VerifierFailed, VerifierRecord

    assert CONFIG.reward_key == "reward" and CONFIG.model_dump()["reward_key"] == "reward"
    ts = env.load(CONFIG)
    task = ts.task(0)
    files = {"reward.json": b'{"reward": 1.0, "to_roman": 1.0, "from_roman": 0.5}'}

    def score(rule: str, record_key: str | None = None) -> float:
        taskset = env.load(HarborConfig(dataset=str(SAMPLE), reward_key=rule))
        return taskset.score(task, VerifierRecord.of(files, key=record_key or rule).to_bytes()).reward

    assert score("reward") == 1.0 and score("to_roman") == 1.0 and score("from_roman") == 0.5
    assert score("all") == 0.5  # the least key: a pass only when every key reaches the threshold
    with pytest.raises(VerifierFailed, match="no key 'style'"):
        score("style")
    with pytest.raises(VerifierFailed, match="names reward key 'reward', the contract's rule is 'all'"):
        score("all", record_key="reward")  # a record read under another rule is not re-read under this one
    txt = VerifierRecord.of({"reward.txt": b"1"}, key="all").to_bytes()
    assert env.load(HarborConfig(dataset=str(SAMPLE), reward_key="all")).score(task, txt).reward == 1.0
    assert ts.score(task, VerifierRecord.of({"reward.txt": b"1"}).to_bytes()).reward == 1.0
