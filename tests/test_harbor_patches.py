"""Offline patches for a Harbor dataset (`environment.harbor.patches`): one diff per task,
applied by ``git apply`` to a private copy at load, so the contract holds the patched tasks'
hashes and every later load (a run, the audit, the smoke test's fresh install) applies them
again and must find the same; each patched task says so in a finding naming its diff, its
sha256 and the files it touches. A bad patch set is refused naming the file. Then the
sample's ``verifier-needs-network``, patched to run the checker its tests ship instead of
downloading it, is frozen through the CLI and played on docker: compatible, the patch in its
detail, and the audit passes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from environment.harbor.env import HarborConfig, HarborEnvironment
from environment.harbor.taskdir import load_dataset
from environment.protocol import ConfigError, LoadHints, sha256_tag

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "harbor-sample"
PATCHES = ROOT / "examples" / "harbor-sample-patches"
TASK = "verifier-needs-network"


@pytest.fixture(scope="module")
def env():
    return HarborEnvironment()


def _task(ts, tid):
    return next(ts.task(i) for i in range(ts.size) if ts.task(i).id == tid)


def _copy(tmp_path: Path, *tids: str) -> Path:
    """A small dataset of sample tasks (copied, so a test may change them)."""
    root = tmp_path / "ds"
    for tid in tids:
        shutil.copytree(SAMPLE / tid, root / tid, symlinks=True)
    return root


def test_the_patched_task_alone_changes_and_says_what_its_diff_touches(env):
    plain = env.load(HarborConfig(dataset=str(SAMPLE)))
    patched = env.load(HarborConfig(dataset=str(SAMPLE), patches=str(PATCHES)))
    assert patched.revision != plain.revision and patched.size == plain.size
    changed = [plain.task(i).id for i in range(plain.size) if plain.task(i).hash != patched.task(i).hash]
    assert changed == [TASK]
    task = _task(patched, TASK)
    [finding] = env.findings(task)
    digest = sha256_tag((PATCHES / f"{TASK}.diff").read_bytes())
    assert not finding.blocking and finding.kind == "patched"
    assert f"{TASK}.diff ({digest}): task.toml, tests/test.sh" in finding.detail
    test_sh = (patched.task_dir(task) / "tests" / "test.sh").read_text()
    assert "checker.example.com" not in test_sh and "/tests/check.py" in test_sh
    # the original is untouched
    assert "checker.example.com" in (SAMPLE / TASK / "tests" / "test.sh").read_text()
    assert patched.task_dir(task) != SAMPLE / TASK
    assert patched.revision == load_dataset(patched.root).revision  # the revision is the patched tree's own


def test_a_later_load_finds_the_dataset_and_patches_by_the_patched_revision(env, tmp_path):
    data = tmp_path / "elsewhere"
    shutil.copytree(SAMPLE, data / "harbor-sample", symlinks=True)
    shutil.copytree(PATCHES, data / "harbor-sample-patches")
    frozen = env.load(HarborConfig(dataset=str(SAMPLE), patches=str(PATCHES))).revision
    cfg = HarborConfig(dataset="harbor-sample", patches="harbor-sample-patches")
    again = env.load(cfg, LoadHints(revision=frozen, search=(data,)))
    assert again.revision == frozen and set(again.data_files) == {(data / "harbor-sample").resolve(),
                                                                  (data / "harbor-sample-patches").resolve()}
    diff = data / "harbor-sample-patches" / f"{TASK}.diff"
    diff.write_text(diff.read_text().replace("offline patch:", "offline patch (edited):"))
    with pytest.raises(ConfigError, match="no Harbor dataset directory with revision"):
        env.load(cfg, LoadHints(revision=frozen, search=(data,)))


def _diff(path: str, old: str, new: str) -> str:
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}\n+{new}\n")


@pytest.mark.parametrize("name, text, says", [
    ("no-such-task.diff", _diff("instruction.md", "x", "y"), "the dataset has no task 'no-such-task'"),
    (f"{TASK}.diff", _diff("tests/test.sh", "not what the file says", "y"), "does not apply to task"),
    (f"{TASK}.diff", _diff("../csv-to-json/tests/test.sh", "#!/bin/bash", "exit 0"),
     "does not apply to task"),
    (f"{TASK}.diff", "this is not a diff\n", "not a diff git can read"),
    (f"{TASK}.patch", _diff("instruction.md", "x", "y"), "only regular <task id>.diff files"),
])
def test_a_bad_patch_set_is_refused_naming_the_file(env, tmp_path, name, text, says):
    root = _copy(tmp_path, TASK, "csv-to-json")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / name).write_text(text)
    with pytest.raises(ConfigError, match="patches: ") as e:
        env.load(HarborConfig(dataset=str(root), patches=str(patches)))
    assert says in str(e.value) and name in str(e.value)
    assert "exit 0" not in (root / "csv-to-json" / "tests" / "test.sh").read_text()


def test_an_empty_or_missing_patch_set_is_refused(env, tmp_path):
    root = _copy(tmp_path, TASK)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no .diff file"):
        env.load(HarborConfig(dataset=str(root), patches=str(tmp_path / "empty")))
    with pytest.raises(ConfigError, match="patches: no directory"):
        env.load(HarborConfig(dataset=str(root), patches=str(tmp_path / "nowhere")))


def test_freeze_refuses_a_patch_that_does_not_apply_with_exit_2(tmp_path):
    root = _copy(tmp_path, TASK)
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / f"{TASK}.diff").write_text(_diff("tests/test.sh", "no such line", "y"))
    r = subprocess.run(["validate", "freeze", "--env", "harbor", "--name", "p", "--dataset", str(root),
                        "--patches", str(patches), "--out", str(tmp_path / "m.json")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"{TASK}.diff does not apply" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "m.json").exists()


@pytest.mark.docker
def test_a_patched_task_is_frozen_played_and_audited_with_its_patch_in_the_evidence(tmp_path):
    manifest = tmp_path / "patched.json"
    r = subprocess.run(["validate", "freeze", "--env", "harbor", "--name", "patched", "--dataset",
                        str(SAMPLE), "--patches", str(PATCHES), "--idx", str(_index(TASK)), "--out",
                        str(manifest)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    frozen = json.loads(manifest.read_text())
    assert frozen["environment"]["config"]["patches"] == str(PATCHES)
    assert frozen["environment"]["revision"] != load_dataset(SAMPLE).revision
    run_dir = tmp_path / "run"
    r = subprocess.run(["validate", "run", "--manifest", str(manifest), "--run-dir", str(run_dir), "--agents",
                        "all", "-c", "2"], capture_output=True, text=True, cwd=tmp_path)
    tasks = pd.read_parquet(run_dir / "tasks.parquet").set_index("task_id")
    assert tasks.loc[TASK, "verdict"] == "compatible", (r.stderr[-2000:], tasks.to_dict("index"))
    assert f"patched offline by {TASK}.diff" in tasks.loc[TASK, "detail"]
    report = subprocess.run(["validate", "report", str(run_dir)], capture_output=True, text=True,
                            cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    [md] = (run_dir / "reports").glob("*/report.md")
    assert f"| {TASK} | patched offline by {TASK}.diff" in md.read_text()
    audit = subprocess.run(["validate", "audit", str(run_dir)], capture_output=True, text=True, cwd=tmp_path)
    assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]


def _index(tid: str) -> int:
    ts = HarborEnvironment().load(HarborConfig(dataset=str(SAMPLE)))
    return _task(ts, tid).idx
