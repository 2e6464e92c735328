"""The runner on real tasks through real sandboxes: verdicts, backends agreeing, resume, retries."""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest

from validate.agents import resolve
from validate.contract import build_taskset
from validate.agents import AgentSpec
from validate.evidence import read_attempts
from validate.paths import RunPaths
from validate.runner import play, run
from validate.sandbox import open_sandbox
from tests.conftest import AGENTS_DIR, make_ctx, make_manifest

# 1 and 3 papers, headers on and off.
CONFIGS = [dict(min_papers=1, max_papers=1, include_headers=False),
           dict(min_papers=3, max_papers=3, include_headers=True)]


def play_all(corpus, corpus_path, sandbox, run_dir, idx, **config):
    manifest = make_manifest(corpus, corpus_path, sandbox, idx=idx, **config)
    ctx = make_ctx(manifest, sandbox, build_taskset(manifest.environment, corpus), run_dir)
    _, verdicts = run(ctx, resolve("all"), concurrency=2)
    return read_attempts(ctx.paths), verdicts


@pytest.mark.docker
@pytest.mark.bwrap
@pytest.mark.parametrize("config", CONFIGS, ids=["1paper", "3papers-headers"])
def test_oracle_passes_controls_rejected_and_backends_agree(corpus, corpus_path, sandboxes, tmp_path, config):
    results = {}
    for backend in ("docker", "bwrap"):
        attempts, verdicts = play_all(corpus, corpus_path, sandboxes(backend), tmp_path / backend, [0, 1, 2], **config)
        assert [v.compatible for v in verdicts] == [True] * 3, [v.detail for v in verdicts]
        assert {a.agent for a in attempts} == {a.name for a in resolve("all")}
        assert all(a.status == "ok" for a in attempts)
        assert all(a.reward == 1.0 for a in attempts if a.agent == "oracle")
        assert all(a.reward < 1.0 for a in attempts if a.agent != "oracle")
        results[backend] = {(a.task_id, a.agent): (a.reward, a.reply_sha256, a.workspace_sha256) for a in attempts}
        results[backend + "-verdicts"] = [(v.task_id, v.compatible, v.reason) for v in verdicts]
    assert results["docker"] == results["bwrap"]
    assert results["docker-verdicts"] == results["bwrap-verdicts"]


def test_subprocess_never_runs_a_network_isolated_task(corpus, corpus_path, tmp_path):
    sandbox = open_sandbox("subprocess", image="host")
    attempts, verdicts = play_all(corpus, corpus_path, sandbox, tmp_path / "sub", [0])
    assert {a.status for a in attempts} == {"unsupported_execution_contract"}
    assert all(a.runtime_s is None for a in attempts)
    assert verdicts[0].reason == "unsupported_execution_contract"
    assert "network isolation" in verdicts[0].detail


@pytest.mark.bwrap
def test_evidence_files_are_plain_parquet(corpus, corpus_path, sandboxes, tmp_path):
    import pyarrow.parquet as pq

    play_all(corpus, corpus_path, sandboxes("bwrap"), tmp_path / "r", [0, 1])
    root = tmp_path / "r"
    attempts = pd.read_parquet(root / "attempts.parquet")
    assert len(attempts) == 14 and not attempts["superseded"].any()
    assert {"reward", "metric_grouping_f1", "metric_norm_kendall_tau", "reply_sha256", "workspace_sha256",
            "image_digest", "exit_code", "oom_killed", "timed_out", "started_at"} <= set(attempts.columns)
    assert str(attempts["started_at"].dt.tz) == "UTC"
    assert len(pq.read_table(root / "tasks.parquet")) == 2
    assert len(pd.read_parquet(root / "exclusions.parquet")) == 0
    assert (root / "manifest.json").exists() and not (root / "journal.jsonl").exists()
    import subprocess

    check = subprocess.run(["sha256sum", "-c", "checksums"], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(": OK") == 5


@pytest.mark.bwrap
def test_resume_after_a_partial_run_equals_an_uninterrupted_run(corpus, corpus_path, sandboxes, tmp_path):
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(corpus, corpus_path, sandbox, idx=[0, 1, 2], max_papers=2, min_papers=2)
    taskset = build_taskset(manifest.environment, corpus)
    full = run(make_ctx(manifest, sandbox, taskset, tmp_path / "full"), resolve("all"), 2)[1]
    partial_ctx = make_ctx(manifest, sandbox, taskset, tmp_path / "part")
    run(partial_ctx, resolve("oracle,empty"), 2)          # a run cut short: 2 of 7 agents
    assert len(pd.read_parquet(tmp_path / "part" / "attempts.parquet")) == 6
    _, resumed = run(make_ctx(manifest, sandbox, taskset, tmp_path / "part"), resolve("all"), 2)
    attempts = read_attempts(RunPaths(tmp_path / "part"))
    assert [(v.task_id, v.compatible, v.reason) for v in resumed] == [(v.task_id, v.compatible, v.reason) for v in full]
    keys = [(a.task_id, a.agent, a.attempt) for a in attempts]
    assert len(keys) == len(set(keys)) == 21  # nothing duplicated, nothing rerun


@pytest.mark.docker
def test_container_killed_from_outside_is_an_infrastructure_fault_and_retried(corpus, corpus_path, sandboxes, tmp_path):
    sandbox = sandboxes("docker")
    manifest = make_manifest(corpus, corpus_path, sandbox, idx=[0])
    taskset = build_taskset(manifest.environment, corpus)
    slow = AgentSpec(name="oracle", program=str(AGENTS_DIR / "slow_oracle.py"), expect="pass",
                     sees_answer_key=True, description="the oracle, two seconds late")
    killed: list[str] = []

    def killer():  # a real external kill of the first container, as an operator or the OOM reaper would
        for _ in range(200):
            for c in sandbox.client.containers.list(filters={"label": "deshuffle-validate"}):
                c.kill()
                killed.append(c.name)
                return
            time.sleep(0.05)

    t = threading.Thread(target=killer)
    t.start()
    rows = play(make_ctx(manifest, sandbox, taskset, tmp_path / "kill"), taskset.task(0), slow, 1)
    t.join()
    assert killed, "the killer thread found no container"
    assert rows[0].status == "infrastructure_error" and "killed from outside" in rows[0].error_message
    assert (rows[1].attempt, rows[1].status, rows[1].reward) == (2, "ok", 1.0)
