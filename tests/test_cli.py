"""The `validate` command as a user meets it: help, clear errors with exit 2, a real run."""

from __future__ import annotations

import subprocess

import pandas as pd
import pytest

from tests.conftest import CORPUS_PATH


def cli(*args, cwd):
    return subprocess.run(["validate", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_help_teaches_the_phases(tmp_path):
    r = cli("--help", cwd=tmp_path)
    assert r.returncode == 0
    for phase in ("image", "freeze", "verify", "run", "example"):
        assert phase in r.stdout
    assert "--resume" in cli("run", "--help", cwd=tmp_path).stdout


@pytest.mark.parametrize("args,needle", [
    (["freeze", "--name", "x", "--corpus", "missing.jsonl.gz"], "missing.jsonl.gz: corpus file not found"),
    (["freeze", "--name", "x", "--min-papers", "0"], "--min-papers"),
    (["freeze", "--name", "x", "--max-papers", "999"], "max_papers: 999 exceeds the 208 papers"),
    (["freeze", "--name", "x", "--source", "nature"], "source: 'nature' is not in the corpus"),
    (["freeze", "--name", "x", "--controls", "oracle,bogus"], "unknown agent(s) bogus"),
    (["freeze", "--name", "x", "--idx-start", "5", "--idx-stop", "5"], "--idx-stop"),
    (["run", "--manifest", "nope.json"], "nope.json: manifest not found"),
])
def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path, args, needle):
    if "--corpus" not in args and args[0] == "freeze":
        args = [*args, "--corpus", str(CORPUS_PATH)]
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr


@pytest.mark.bwrap
def test_freeze_verify_run_resume(tmp_path):
    r = cli("freeze", "--name", "cli", "--corpus", str(CORPUS_PATH), "--max-papers", "2", "--idx-stop", "3",
            "--backend", "bwrap", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "froze 3 tasks" in r.stdout and (tmp_path / "manifests/cli.json").exists()
    assert cli("verify", "--manifest", "manifests/cli.json", cwd=tmp_path).returncode == 0
    r = cli("run", "--manifest", "manifests/cli.json", "--run-dir", "ledgers/one", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3/3 tasks compatible" in r.stdout
    assert len(pd.read_parquet(tmp_path / "ledgers/one/attempts.parquet")) == 21
    again = cli("run", "--manifest", "manifests/cli.json", "--run-dir", "ledgers/one", cwd=tmp_path)
    assert again.returncode == 2 and "--resume" in again.stderr
    resumed = cli("run", "--manifest", "manifests/cli.json", "--resume", "ledgers/one", cwd=tmp_path)
    assert resumed.returncode == 0 and "21 attempts" in resumed.stdout  # nothing rerun


@pytest.mark.bwrap
def test_contract_not_met_exits_1(tmp_path):
    cli("freeze", "--name", "strict", "--corpus", str(CORPUS_PATH), "--idx-stop", "2", "--backend", "bwrap",
        "--oracle-min-reward", "1.5", cwd=tmp_path)
    r = cli("run", "--manifest", "manifests/strict.json", "--agents", "oracle", cwd=tmp_path)
    assert r.returncode == 1 and "contract not met" in r.stderr
    assert "oracle_fails_on_valid_task: 2/2" in r.stdout
