"""The protocol end to end on a small contract through real docker: freeze → pilot → pool
(oracle, freeze, controls, smoke from the installed wheel in a fresh venv) → report → audit,
and the ways a phase must not pass: a pool below its minimum, a pilot whose control passes,
a rerun smoke test that appends instead of replacing."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest

from tests.conftest import CORPUS_PATH, ROOT, VALIDATE, subprocess_env

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def cli(*args, cwd):
    return subprocess.run([*VALIDATE, *args], cwd=cwd, capture_output=True, text=True, timeout=1200,
                          env=subprocess_env())


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A working directory laid out like a user's: the corpus at ../shared/corpus/."""
    base = tmp_path_factory.mktemp("e2e")
    (base / "shared/corpus").mkdir(parents=True)
    (base / "shared/corpus/papers.jsonl.gz").symlink_to(CORPUS_PATH)
    work = base / "work"
    work.mkdir()
    r = cli("freeze", "--name", "e2e", "--max-papers", "3", "--idx", "0,4,121,180,181,300", "--min-count",
            "5", "--allow-patch", "--corpus", "../shared/corpus/papers.jsonl.gz", cwd=work)
    assert r.returncode == 0, r.stderr
    return work


def test_pilot_is_stratified_and_probes_land_in_between(project):
    r = cli("pilot", "--manifest", "manifests/e2e.json", "--run-dir", "ledgers/pilot", "--allow-patch",
            cwd=project)
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stdout.startswith("Dataset verdict: PASS")
    summary = json.loads((project / "ledgers/pilot/run.json").read_text())
    probes = summary["probes"]
    assert {p["probe"] for p in probes} == {"probe-swap", "probe-merge", "probe-split"}
    assert all(p["ok"] and p["control_typical"] < p["reward"] < p["oracle_reward"] for p in probes)
    tasks = pd.read_parquet(project / "ledgers/pilot/tasks.parquet")
    assert set(tasks["phase"]) == {"pilot-headers-on", "pilot-headers-off"}
    assert set(tasks["family"]) == {"plos", "biorxiv", "arxiv"}
    assert tasks["task_id"].is_unique  # the two variants of one idx are two tasks
    assert {json.loads(m)["n_papers"] for m in tasks["meta"]} > {1}  # each row's facts: JSON text


def test_pool_freezes_runs_controls_on_the_frozen_set_then_smoke_tests(project):
    r = cli("pool", "--manifest", "manifests/e2e.json", "--run-dir", "ledgers/pool", "--smoke-sample", "2",
            "--allow-patch", cwd=project)
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stdout.startswith("Dataset verdict: PASS")
    frozen = json.loads((project / "manifests/e2e.frozen.json").read_text())
    pool = json.loads((project / "manifests/e2e.json").read_text())
    assert frozen["parent_sha256"] == pool["sha256"] and len(frozen["tasks"]) == 6
    attempts = pd.read_parquet(project / "ledgers/pool/attempts.parquet")
    assert set(attempts.loc[attempts["phase"] == "oracle", "agent"]) == {"oracle"}
    controls = attempts[attempts["phase"] == "controls"]
    assert set(controls["idx"]) == {t["idx"] for t in frozen["tasks"]} and "oracle" not in set(
        controls["agent"]
    )
    assert (pd.read_parquet(project / "ledgers/pool/tasks.parquet")["verdict"] == "compatible").all()
    (entry,) = (project / "ledgers/pool/smoke").iterdir()
    result = json.loads((entry / "result.json").read_text())
    assert result["passed"] and result["compared"] == 2 * 8 and result["mismatches"] == []
    assert result["imported_from"]["validate"].startswith("<venv>")


def build_products(root):
    """The checkout's build products (build/, *.egg-info) and their modification times."""
    return {str(p): p.stat().st_mtime_ns for pattern in ("build", "build/**/*", "*.egg-info", "*.egg-info/*")
            for p in root.glob(pattern)}


def test_a_second_smoke_test_is_appended_and_reports_are_kept(project):
    before = build_products(ROOT)
    r = cli("smoke", "ledgers/pool", "--sample", "1", cwd=project)
    assert r.returncode == 0, r.stderr + r.stdout
    # built in a copy: a build/ left in the checkout would carry stale modules into the next wheel
    assert build_products(ROOT) == before
    assert len(list((project / "ledgers/pool/smoke").iterdir())) == 2  # the first one is still there
    first = cli("report", "ledgers/pool", cwd=project)
    second = cli("report", "ledgers/pool", cwd=project)
    assert first.returncode == second.returncode == 0
    reports = sorted((project / "ledgers/pool/reports").iterdir())
    assert len(reports) == 2
    md = (reports[-1] / "report.md").read_text()
    assert md.splitlines()[2] == "**Dataset verdict: PASS**"
    assert "6/6 (100.0 %) tasks of contract e2e (pool) passed" in md and "backend docker" in md
    assert "PASSED (smoke/" in md and "the latest of 2" in md
    page = (reports[-1] / "report.html").read_text()
    assert page.count("<svg") == 1 and "n=6" in page and "pass threshold 1" in page and "<img" not in page
    assert cli("audit", "ledgers/pool", cwd=project).returncode == 0
    assert cli("report", "ledgers/pilot", cwd=project).returncode == 0
    assert cli("audit", "ledgers/pilot", cwd=project).returncode == 0


def test_a_pool_below_its_minimum_freezes_nothing_and_fails_with_incomplete_evidence(tmp_path):
    r = cli("freeze", "--env", "toy", "--name", "low", "--broken", "[0, 1]", "--min-count", "9", "--backend",
            "bwrap", "--allow-patch", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = cli("pool", "--manifest", "manifests/low.json", "--run-dir", "ledgers/low", "--allow-patch",
            cwd=tmp_path)
    assert r.returncode == 1
    first = r.stdout.splitlines()[0]
    assert (
        first.startswith("Dataset verdict: FAIL") and "INCOMPLETE" in first and "controls never ran" in first
    )
    assert not (tmp_path / "manifests/low.frozen.json").exists()
    assert set(pd.read_parquet(tmp_path / "ledgers/low/attempts.parquet")["agent"]) == {"oracle"}
    tasks = pd.read_parquet(tmp_path / "ledgers/low/tasks.parquet")
    assert (tasks["verdict"] == "incomplete").sum() == 8 and (tasks["verdict"] == "excluded").sum() == 2
    assert cli("report", "ledgers/low", cwd=tmp_path).returncode == 0
    md = next((tmp_path / "ledgers/low/reports").iterdir()) / "report.md"
    assert "**Dataset verdict: FAIL" in md.read_text().splitlines()[2]


def test_a_pilot_whose_control_passes_fails(tmp_path):
    r = cli("freeze", "--env", "toy", "--name", "lax", "--ceiling", "off-by-two=0.0", "--backend", "bwrap",
            "--allow-patch", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = cli("pilot", "--manifest", "manifests/lax.json", "--run-dir", "ledgers/lax", "--allow-patch",
            cwd=tmp_path)
    assert r.returncode == 1 and r.stdout.startswith("Dataset verdict: FAIL")
    assert "every_task_compatible" in r.stderr


def test_the_smoke_comparison_holds_each_oracle_repeat_to_its_own_sample(passed_pool, tmp_path):
    """With ``--oracle-repeats`` the oracle has a row per sample in both runs: each is compared
    with the same sample of the frozen run (a (task, agent) key alone matched several rows
    and the comparison crashed), and a repeat that differs is named with its sample."""
    import shutil

    from validate.core.paths import ATTEMPTS, SMOKE, SMOKE_RUN
    from validate.core.records import ORACLE
    from validate.run.smoke import compare

    run = tmp_path / "pool"
    shutil.copytree(passed_pool, run)
    rerun = sorted((run / SMOKE).iterdir())[-1] / SMOKE_RUN
    for root in (run, rerun):  # a second oracle sample in both, as five repeats give five
        a = pd.read_parquet(root / ATTEMPTS)
        again = a[a["role"] == ORACLE].assign(sample=1)
        pd.concat([a, again]).to_parquet(root / ATTEMPTS)
    n, mismatches = compare(run, rerun, 0.0)
    assert mismatches == [] and n == len(pd.read_parquet(rerun / ATTEMPTS))
    a = pd.read_parquet(rerun / ATTEMPTS)
    a.loc[(a["role"] == ORACLE) & (a["sample"] == 1), "reward"] = -1.0
    a.to_parquet(rerun / ATTEMPTS)
    _, mismatches = compare(run, rerun, 0.0)
    assert mismatches and all(", 1)" in m and "reward" in m for m in mismatches)


def test_a_smoke_rerun_that_recorded_nothing_is_a_failed_comparison(passed_pool, tmp_path):
    """The frozen run is read only for the rerun's tasks; a rerun with no attempts at all reads
    none of it and names every attempt the sample owed as missing (never a crash, never a pass)."""
    import shutil

    from validate.core.paths import ATTEMPTS, SMOKE, SMOKE_RUN
    from validate.run.smoke import compare

    run = tmp_path / "pool"
    shutil.copytree(passed_pool, run)
    rerun = sorted((run / SMOKE).iterdir())[-1] / SMOKE_RUN
    a = pd.read_parquet(rerun / ATTEMPTS)
    played = sorted(set(zip(a["task_id"], a["agent"], strict=True)))
    a.iloc[:0].to_parquet(rerun / ATTEMPTS)
    n, mismatches = compare(run, rerun, 0.0)
    assert n == 0 and played
    assert sorted(mismatches) == sorted(f"{key}: missing from the rerun" for key in played)
