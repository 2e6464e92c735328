"""The protocol end to end on a small contract through real docker: freeze → pilot → pool
(oracle, freeze, controls) → smoke (installed wheel, fresh venv) → report → audit, and an
audit that fails on a copy with one byte changed."""

from __future__ import annotations

import json
import shutil
import subprocess

import pandas as pd
import pytest

from tests.conftest import CORPUS_PATH

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def cli(*args, cwd):
    return subprocess.run(["validate", *args], cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A working directory laid out like the repository: the corpus at ../shared/corpus/."""
    base = tmp_path_factory.mktemp("e2e")
    (base / "shared/corpus").mkdir(parents=True)
    (base / "shared/corpus/papers.jsonl.gz").symlink_to(CORPUS_PATH)
    work = base / "work"
    work.mkdir()
    r = cli("freeze", "--name", "e2e", "--max-papers", "3", "--idx", "0,4,121,180,181,300", "--min-count", "5",
            cwd=work)
    assert r.returncode == 0, r.stderr
    return work


def test_pilot_is_stratified_and_probes_land_in_between(project):
    r = cli("pilot", "--manifest", "manifests/e2e.json", "--run-dir", "ledgers/pilot", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "× 2 header variants" in r.stdout and "strictly between" in r.stdout
    probes = json.loads((project / "ledgers/pilot/probes.json").read_text())["probes"]
    assert {p["probe"] for p in probes} == {"probe-swap", "probe-merge", "probe-split"}
    assert all(p["ok"] and p["control_typical"] < p["reward"] < p["oracle_reward"] for p in probes)
    tasks = pd.read_parquet(project / "ledgers/pilot/tasks.parquet")
    assert set(tasks["phase"]) == {"pilot-headers-on", "pilot-headers-off"}
    assert set(tasks["anchor_source"]) == {"plos", "biorxiv", "arxiv"}
    assert 1 in set(tasks["n_papers"]) and set(tasks["n_papers"]) - {1}  # one and several papers


def test_pool_freezes_then_runs_controls_on_the_frozen_set(project):
    r = cli("pool", "--manifest", "manifests/e2e.json", "--run-dir", "ledgers/pool", cwd=project)
    assert r.returncode == 0, r.stderr
    frozen = json.loads((project / "manifests/e2e.frozen.json").read_text())
    pool = json.loads((project / "manifests/e2e.json").read_text())
    assert frozen["parent_sha256"] == pool["sha256"] and len(frozen["tasks"]) == 6
    attempts = pd.read_parquet(project / "ledgers/pool/attempts.parquet")
    assert set(attempts.loc[attempts["phase"] == "oracle", "agent"]) == {"oracle"}
    controls = attempts[attempts["phase"] == "controls"]
    assert set(controls["idx"]) == {t["idx"] for t in frozen["tasks"]} and "oracle" not in set(controls["agent"])
    assert pd.read_parquet(project / "ledgers/pool/tasks.parquet")["compatible"].all()


def test_below_the_minimum_nothing_is_frozen(project):
    r = cli("freeze", "--name", "strict", "--idx", "0,1", "--oracle-min-reward", "1.5", cwd=project)
    assert r.returncode == 0
    r = cli("pool", "--manifest", "manifests/strict.json", "--run-dir", "ledgers/strict", cwd=project)
    assert r.returncode == 1 and "nothing frozen" in r.stderr
    assert not (project / "manifests/strict.frozen.json").exists()
    assert set(pd.read_parquet(project / "ledgers/strict/attempts.parquet")["agent"]) == {"oracle"}


def test_smoke_report_audit(project):
    r = cli("smoke", "--manifest", "manifests/e2e.frozen.json", "--run-dir", "ledgers/pool", "--sample", "2",
            cwd=project)
    assert r.returncode == 0, r.stderr + r.stdout
    result = json.loads((project / "ledgers/pool/smoke/result.json").read_text())
    assert result["passed"] and result["compared"] == 14 and result["mismatches"] == []
    assert result["imported_from"]["validate"].startswith("<venv>")
    r = cli("report", "ledgers/pool", cwd=project)
    assert r.returncode == 0, r.stderr
    md = (project / "ledgers/pool/report.md").read_text()
    assert "6/6 (100.0 %) tasks of contract `e2e` passed" in md and "backend docker" in md
    assert "Fresh-materialisation smoke test" in md and "PASSED" in md
    html = (project / "ledgers/pool/report.html").read_text()
    assert html.count("data:image/png;base64,") == 1 and "<table>" in html
    assert cli("audit", "ledgers/pool", cwd=project).returncode == 0
    assert cli("report", "ledgers/pilot", cwd=project).returncode == 0
    assert cli("audit", "ledgers/pilot", cwd=project).returncode == 0


def test_audit_fails_on_one_changed_byte(project):
    for name in ("tasks.parquet", "smoke/result.json", "frozen-manifest.json"):
        copy = project / "ledgers/tampered"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(project / "ledgers/pool", copy)
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(data))
        r = cli("audit", "ledgers/tampered", cwd=project)
        assert r.returncode == 1 and name in r.stdout + r.stderr, (name, r.stdout, r.stderr)
