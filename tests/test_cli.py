"""The `validate` command as a user meets it: help that teaches, exit 2 naming the field or
file for every bad input (never a traceback, nothing half-written), a real run, and an
environment that lives in tests/ reached through an entry point."""

from __future__ import annotations

import gzip
import json
import subprocess

import pandas as pd
import pytest

from tests.conftest import CORPUS_PATH, VALIDATE, subprocess_env


def cli(*args, cwd, env=None):
    return subprocess.run([*VALIDATE, *args], cwd=cwd, capture_output=True, text=True, timeout=900,
                          env=env or subprocess_env())


def test_help_teaches_the_phases_and_each_option(tmp_path):
    r = cli("--help", cwd=tmp_path)
    assert r.returncode == 0
    for phase in ("image", "freeze", "verify", "pilot", "pool", "run", "smoke", "report", "audit", "sign"):
        assert phase in r.stdout
    freeze = cli("freeze", "--help", cwd=tmp_path).stdout
    for option in ("--memory-mb", "--cpus", "--pids", "--timeout-s", "--max-papers", "--exception-rule",
                   "--ceiling"):
        assert option in freeze
    assert "(default: every task) (default" not in freeze
    assert "Most complete papers in one task" in freeze  # from the config model's own field description
    toy = cli("freeze", "--env", "toy", "--help", cwd=tmp_path).stdout
    assert "--broken" in toy and "--max-papers" not in toy  # each environment brings its options
    version = cli("--version", cwd=tmp_path).stdout
    assert "validate 0.1.0" in version and "code " in version and "installed at" in version


BAD_FREEZE = [
    (["--idx=-1,2"], "--idx: every index must be ≥ 0"),
    (["--min-papers", "3", "--max-papers", "2"], "min_papers (3) must be ≤ max_papers (2)"),
    (["--idx-stop", "100000000000"], "--idx-stop: at most 1,000,000 tasks"),
    (["--timeout-s", "inf"], "--timeout-s"),
    (["--cpus", "1e9"], "--cpus: this machine has"),
    (["--pass-threshold", "nan"], "pass_threshold"),
    (["--max-papers", "999"], "max_papers: 999 exceeds the 208 papers"),
    (["--source", "nature"], "source: 'nature' is not in the corpus"),
    (["--controls", "oracle,bogus"], "not a control of deshuffle-papers"),
    (["--ceiling", "shuffled=2"], "--ceiling"),
    (["--idx-start", "5", "--idx-stop", "5"], "--idx-stop"),
    (["--env", "nope"], "no environment named 'nope'"),
    (["--corpus", "missing.jsonl.gz"], "no corpus file at"),
    (["--oracle-repeats", "0"], "--oracle-repeats: expected an integer ≥ 1"),
    (["--oracle-repeats=-2"], "--oracle-repeats: expected an integer ≥ 1"),
    (["--oracle-repeats", "2.5"], "--oracle-repeats: expected an integer ≥ 1"),
    (["--oracle-repeats", "101"], "--oracle-repeats: expected an integer from 1 to 100"),
]


@pytest.mark.bwrap
@pytest.mark.parametrize("args,needle", BAD_FREEZE, ids=[a[0][0] for a in BAD_FREEZE])
def test_bad_freeze_input_exits_2_and_writes_nothing(tmp_path, args, needle):
    corpus = [] if "--corpus" in args else ["--data", str(CORPUS_PATH)]
    r = cli("freeze", "--name", "x", "--backend", "bwrap", "--allow-patch", *corpus, *args, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "manifests").exists()


def corpus_file(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


BAD_CORPORA = {
    "utf8.jsonl": b'{"paper_id": "\xff\xfe"}\n',
    "truncated.jsonl.gz": gzip.compress(b'{"paper_id": "x"}\n' * 1000)[:-20],
    "notgzip.jsonl.gz": b"this is not gzip",
    "garbage.parquet": b"PAR1 garbage PAR1",
    "deep.jsonl": b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "bigint.jsonl": b'{"paper_id": ' + b"9" * 5000 + b"}\n",
}


@pytest.mark.bwrap
@pytest.mark.parametrize("name", list(BAD_CORPORA))
def test_a_bad_corpus_exits_2_naming_the_file(tmp_path, name):
    path = corpus_file(tmp_path, name, BAD_CORPORA[name])
    r = cli("freeze", "--name", "x", "--backend", "bwrap", "--allow-patch", "--corpus", str(path),
            cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert name in r.stderr and "Traceback" not in r.stderr


def test_bad_run_input(tmp_path):
    r = cli("run", "--manifest", "nope.json", cwd=tmp_path)
    assert r.returncode == 2 and "nope.json: manifest not found" in r.stderr
    (tmp_path / "deep.json").write_text("[" * 100_000)
    r = cli("run", "--manifest", "deep.json", cwd=tmp_path)
    assert r.returncode == 2 and "deep.json: not a readable JSON manifest" in r.stderr
    r = cli("run", cwd=tmp_path)
    assert r.returncode == 2 and "--manifest: required" in r.stderr
    r = cli("report", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "run.json" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.bwrap
def test_freeze_verify_run_resume(tmp_path):
    r = cli("freeze", "--name", "cli", "--data", str(CORPUS_PATH), "--max-papers", "2", "--idx-stop", "3",
            "--backend", "bwrap", "--allow-patch", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "froze 3 tasks" in r.stdout and (tmp_path / "manifests/cli.json").exists()
    assert cli("verify", "--manifest", "manifests/cli.json", "--data", str(CORPUS_PATH),
               cwd=tmp_path).returncode == 0
    r = cli("run", "--manifest", "manifests/cli.json", "--run-dir", "ledgers/one", "--allow-patch",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Dataset verdict: PASS") and "3/3 tasks compatible" in r.stdout
    assert len(pd.read_parquet(tmp_path / "ledgers/one/attempts.parquet")) == 3 * 8
    again = cli("run", "--manifest", "manifests/cli.json", "--run-dir", "ledgers/one", "--allow-patch",
                cwd=tmp_path)
    assert again.returncode == 2 and "--resume" in again.stderr
    # no --manifest needed
    resumed = cli("run", "--resume", "ledgers/one", "--allow-patch", "--json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["counts"]["attempts"] == 24  # nothing rerun


@pytest.mark.bwrap
def test_a_subset_of_agents_is_incomplete_and_exits_1(tmp_path):
    cli("freeze", "--name", "sub", "--data", str(CORPUS_PATH), "--idx-stop", "4", "--backend", "bwrap",
        "--allow-patch", cwd=tmp_path)
    r = cli("run", "--manifest", "manifests/sub.json", "--agents", "oracle,empty", "--allow-patch",
            cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout.startswith("Dataset verdict: INCOMPLETE") and "0/4 tasks compatible" in r.stdout
    assert "4 incomplete" in r.stdout


@pytest.mark.bwrap
def test_the_toy_environment_from_tests_runs_through_its_entry_point(tmp_path):
    r = cli("freeze", "--env", "toy", "--name", "toy", "--backend", "bwrap", "--broken", "[3]",
            "--allow-patch", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "froze 10 tasks of toy" in r.stdout  # a finite taskset: every task by default
    r = cli("pilot", "--manifest", "manifests/toy.json", "--run-dir", "ledgers/p", "--allow-patch",
            cwd=tmp_path)
    tasks = pd.read_parquet(tmp_path / "ledgers/p/tasks.parquet")
    assert set(tasks["family"]) == {"even", "odd"}
    r = cli("run", "--manifest", "manifests/toy.json", "--run-dir", "ledgers/r", "--allow-patch",
            cwd=tmp_path)
    assert r.returncode == 1 and "excluded, invalid_task_or_verifier: 1/10" in r.stdout  # idx 3 is broken
    tasks = pd.read_parquet(tmp_path / "ledgers/r/tasks.parquet")
    # each row's facts: JSON text
    assert set(tasks["meta"].map(lambda m: tuple(json.loads(m)))) == {("count",)}
    assert cli("report", "ledgers/r", cwd=tmp_path).returncode == 0
    assert cli("audit", "ledgers/r", cwd=tmp_path).returncode == 0
    # a pool leaves the broken task out of its frozen set, and its audit re-derives that set
    assert cli("freeze", "--env", "toy", "--name", "toy9", "--backend", "bwrap", "--broken", "[3]",
               "--min-count", "9", "--allow-patch", cwd=tmp_path).returncode == 0
    r = cli("pool", "--manifest", "manifests/toy9.json", "--run-dir", "ledgers/pool", "--allow-patch",
            "--smoke-sample", "0", cwd=tmp_path)
    frozen = json.loads((tmp_path / "ledgers/pool/frozen-manifest.json").read_text())
    assert sorted(t["idx"] for t in frozen["tasks"]) == [0, 1, 2, 4, 5, 6, 7, 8, 9], r.stdout
    audited = cli("audit", "ledgers/pool", cwd=tmp_path)
    assert audited.returncode == 0, audited.stdout


def test_a_broken_environment_package_is_a_clear_error(tmp_path):
    dist = tmp_path / "site" / "broken_env-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-env\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[validate.environments]\nbroken = no_such_module:Env\n")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{tmp_path / 'site'}:{env['PYTHONPATH']}"
    r = cli("freeze", "--env", "broken", "--name", "x", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "does not import" in r.stderr and "Traceback" not in r.stderr


def test_an_unreachable_daemon_names_the_socket_and_the_fix(tmp_path):
    env = subprocess_env(DOCKER_HOST=f"unix://{tmp_path}/nobody.sock")
    r = cli("freeze", "--name", "x", "--data", str(CORPUS_PATH), "--allow-patch", cwd=tmp_path, env=env)
    assert r.returncode == 2 and f"{tmp_path}/nobody.sock" in r.stderr
    assert "scripts/setup.sh" in r.stderr and "--backend bwrap" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.bwrap
def test_a_paragraph_holding_u2028_runs_every_phase_cleanly(tmp_path):
    """Such a paragraph once made every phase run all attempts, then exit 3."""
    texts = [f"Paragraph {i} of the paper\u2028with a line separator and\u2029a paragraph one."
             for i in range(9)]
    record = {"paper_id": "arxiv:sep", "source": "arxiv", "license": "CC-BY-4.0",
              "paragraphs": [{"text": t, "section": "Body"} for t in texts]}
    (tmp_path / "sep.jsonl").write_text(json.dumps(record) + "\n")
    r = cli("freeze", "--name", "sep", "--corpus", str(tmp_path / "sep.jsonl"), "--idx-stop", "3",
            "--backend", "bwrap", "--allow-patch", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = cli("run", "--manifest", "manifests/sep.json", "--run-dir", "ledgers/sep", "--allow-patch",
            cwd=tmp_path)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.startswith("Dataset verdict: PASS") and "3/3 tasks compatible" in r.stdout
    assert cli("report", "ledgers/sep", cwd=tmp_path).returncode == 0
    assert cli("audit", "ledgers/sep", "--json", cwd=tmp_path).returncode == 0
