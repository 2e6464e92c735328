"""The runner on real tasks through real sandboxes: backends agreeing, evidence, resume,
retries, and hostile agents whose trouble stays in their own attempt."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from contextlib import contextmanager

import pandas as pd
import pytest

from tests.conftest import make_ctx, make_manifest
from validate.kinds.program import ProgramKind
from validate.run.context import Play
from validate.run.phases import RunPhase, run_agents
from validate.run.runner import play_task
from validate.sandbox import open_sandbox
from validate.sandbox.storage import attempt_storage

CONTROLS = ["empty", "shuffled", "identity", "reversed", "singletons", "malformed", "source-peek"]
CONFIGS = [dict(min_papers=1, max_papers=1, include_headers=False),
           dict(min_papers=3, max_papers=3, include_headers=True)]


def run_all(sandbox, run_dir, idx, agents="all", env_name="deshuffle-papers", controls=None, **config):
    manifest = make_manifest(sandbox, idx=idx, env_name=env_name, controls=controls, **config)
    ctx = make_ctx(manifest, sandbox, run_dir)
    summary = run_agents(ctx, RunPhase(agents=agents))
    return summary, pd.read_parquet(run_dir / "attempts.parquet"), pd.read_parquet(run_dir / "tasks.parquet")


@pytest.mark.docker
@pytest.mark.bwrap
@pytest.mark.parametrize("config", CONFIGS, ids=["1paper", "3papers-headers"])
def test_oracle_passes_controls_rejected_and_backends_agree(sandboxes, tmp_path, config):
    """One contract (one salt, so the same opaque ids and seeded controls) on two profiles."""
    from validate.contract.manifest import profile

    bwrap = make_manifest(sandboxes("bwrap"), idx=[0, 1, 2], **config)
    docker = bwrap.model_copy(update={"execution": profile(sandboxes("docker").facts())}).sealed()
    results = {}
    for backend, manifest in (("docker", docker), ("bwrap", bwrap)):
        summary = run_agents(make_ctx(manifest, sandboxes(backend), tmp_path / backend), RunPhase())
        attempts = pd.read_parquet(tmp_path / backend / "attempts.parquet")
        tasks = pd.read_parquet(tmp_path / backend / "tasks.parquet")
        assert summary.dataset_verdict.verdict == "PASS", summary.dataset_verdict
        assert list(tasks["verdict"]) == ["compatible"] * 3, list(tasks["detail"])
        assert set(attempts["agent"]) == {"oracle", *CONTROLS}
        assert set(attempts["role"]) == {"oracle", "control"}
        assert (attempts.loc[attempts["agent"] == "oracle", "reward"] == 1.0).all()
        assert (attempts.loc[attempts["agent"] != "oracle", "reward"] < 1.0).all()
        results[backend] = sorted(zip(attempts["task_id"], attempts["agent"], attempts["reward"],
                                      attempts["reply_sha256"].fillna(""), attempts["workspace_sha256"],
                                      strict=True))
        results[backend + "-verdicts"] = list(zip(tasks["task_id"], tasks["verdict"],
                                                  tasks["reason"].fillna(""), strict=True))
    assert results["docker"] == results["bwrap"]
    assert results["docker-verdicts"] == results["bwrap-verdicts"]


def test_subprocess_never_runs_a_network_isolated_task(tmp_path):
    sandbox = open_sandbox("subprocess", image="host")
    _, attempts, tasks = run_all(sandbox, tmp_path / "sub", [0])
    assert set(attempts["status"]) == {"unsupported_execution_contract"}
    assert attempts["runtime_s"].isna().all()
    assert (
        tasks["reason"][0] == "unsupported_execution_contract" and "network isolation" in tasks["detail"][0]
    )


@pytest.mark.bwrap
def test_evidence_files_are_plain_parquet_with_replies(sandboxes, tmp_path):
    _, attempts, tasks = run_all(sandboxes("bwrap"), tmp_path / "r", [0, 1])
    root = tmp_path / "r"
    assert len(attempts) == 16 and not attempts["superseded"].any()
    assert {"reward", "metric_grouping_f1", "metric_norm_kendall_tau", "reply_sha256", "reply_text",
            "workspace_sha256", "image_digest", "exit_code", "oom_killed", "timed_out", "started_at", "role",
            "sample"} <= set(attempts.columns)
    oracle = attempts[attempts["agent"] == "oracle"]
    assert oracle["reply_text"].str.startswith("\\boxed{").all() and not oracle["reply_truncated"].any()
    assert str(attempts["started_at"].dt.tz) == "UTC"
    assert {"family", "meta", "verdict", "missing", "margin", "findings"} <= set(tasks.columns)
    assert len(pd.read_parquet(root / "exclusions.parquet")) == 0
    assert (root / "manifest.json").exists() and not (root / "journal.jsonl").exists()
    check = subprocess.run(["sha256sum", "-c", "checksums"], cwd=root, capture_output=True, text=True)
    assert (
        check.returncode == 0
        and check.stdout.count(": OK") == len((root / "checksums").read_text().splitlines()) >= 5
    )


@pytest.mark.bwrap
def test_resume_after_a_partial_run_equals_an_uninterrupted_run(sandboxes, tmp_path):
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[0, 1, 2], max_papers=2, min_papers=2)
    full = run_agents(make_ctx(manifest, sandbox, tmp_path / "full"), RunPhase())
    partial = run_agents(make_ctx(manifest, sandbox, tmp_path / "part"),
                         RunPhase(agents="oracle,empty", phase="run"))
    assert partial.counts.attempts == 6 and partial.dataset_verdict.verdict == "INCOMPLETE"
    resumed = run_agents(make_ctx(manifest, sandbox, tmp_path / "part"), RunPhase())
    def view(root):
        return list(pd.read_parquet(root / "tasks.parquet")[["task_id", "verdict"]].itertuples(index=False))

    assert (
        view(tmp_path / "part") == view(tmp_path / "full") and resumed.dataset_verdict == full.dataset_verdict
    )
    attempts = pd.read_parquet(tmp_path / "part/attempts.parquet")
    keys = list(zip(attempts["task_id"], attempts["agent"], attempts["attempt"], strict=True))
    assert len(keys) == len(set(keys)) == 24  # nothing duplicated, nothing rerun


@pytest.mark.docker
def test_container_killed_from_outside_is_an_infrastructure_fault_and_retried(sandboxes, tmp_path):
    sandbox = sandboxes("docker")
    manifest = make_manifest(sandbox, idx=[0], env_name="deshuffle-hostile", controls=["slow-oracle"])
    ctx = make_ctx(manifest, sandbox, tmp_path / "kill")
    slow = next(a for a in ctx.env.agents(ctx.env.Config()) if a.name == "slow-oracle")
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
    rows = play_task(ctx, Play("run", manifest, ctx.taskset, [0], [slow], ProgramKind()), ctx.taskset.task(0),
                     slow, 0, 1)
    t.join()
    assert killed, "the killer thread found no container"
    assert rows[0].status == "infrastructure_error" and rows[0].error_class == "SandboxError"
    assert (rows[1].attempt, rows[1].status, rows[1].reward) == (2, "ok", 1.0)


HOSTILE = ["reply-dir", "reply-fifo", "symlink-reply", "long-reply", "crash", "garbage-reply"]


@pytest.mark.bwrap
def test_odd_replies_are_the_agents_own_outcome(sandboxes, tmp_path):
    _, attempts, _ = run_all(sandboxes("bwrap"), tmp_path / "odd", [0], agents="oracle,controls",
                             env_name="deshuffle-hostile", controls=HOSTILE)
    by = attempts.set_index("agent")
    for agent, kind in (("reply-dir", "a directory"), ("reply-fifo", "a FIFO"),
                        ("symlink-reply", "symbolic link")):
        row = by.loc[agent]
        assert (row["status"], row["exit_code"], row["reward"]) == ("no_reply", 0, 0.0), agent
        assert kind in row["error_message"] and "fd" not in row["error_message"]
        assert row["error_class"] == "NotAReply", agent  # the class's name, as rows have always said it
    long = by.loc["long-reply"]
    assert long["status"] == "ok" and long["reply_bytes"] > 200 * 1024 and long["reply_truncated"]
    assert len(long["reply_text"].encode()) == 64 * 1024
    assert by.loc["crash"]["status"] == "exit_nonzero" and "deliberate crash" in by.loc["crash"]["stderr"]
    assert by.loc["garbage-reply"]["reward"] == 0.0


@pytest.mark.bwrap
def test_odd_replies_leak_no_file_descriptor(sandboxes, tmp_path):
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=list(range(50)), env_name="deshuffle-hostile",
                             controls=["reply-dir", "reply-fifo", "symlink-reply", "empty"])
    ctx = make_ctx(manifest, sandbox, tmp_path / "fds")
    before = len(os.listdir("/proc/self/fd"))
    summary = run_agents(ctx, RunPhase(agents="controls"))  # 50 tasks × 4 agents = 200 attempts
    assert summary.counts.attempts == 200
    assert len(os.listdir("/proc/self/fd")) <= before + 2


@pytest.mark.bwrap
def test_an_exception_in_one_attempt_stays_in_that_attempt(sandboxes, tmp_path):
    """Cleanup of one attempt raises (as a 5,000-deep tree once made rmtree do): that attempt
    becomes a harness_error row, every other attempt's evidence is kept, the phase ends."""
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[0, 1, 2], env_name="deshuffle-hostile",
                             controls=["deep-tree", "empty"])
    ctx = make_ctx(manifest, sandbox, tmp_path / "iso")

    @contextmanager
    def fragile_storage(name, limits, gid):
        with attempt_storage(ctx.run_id, name, limits, gid=gid) as root:
            yield root
            if (root / "workspace/d").exists():
                raise RecursionError("maximum recursion depth exceeded while removing the tree")

    ctx.storage = fragile_storage
    summary = run_agents(ctx, RunPhase())
    attempts = pd.read_parquet(tmp_path / "iso/attempts.parquet")
    assert len(attempts) == 9
    deep = attempts[attempts["agent"] == "deep-tree"]
    assert (
        set(deep["status"]) == {"harness_error"}
        and deep["error_message"].str.contains("RecursionError|recursion").all()
    )
    assert set(attempts.loc[attempts["agent"] != "deep-tree", "status"]) <= {"ok", "no_reply"}
    assert summary.counts.excluded == 3 and set(summary.counts.excluded_by_reason) == {
        "infrastructure_failure"
    }


@pytest.mark.bwrap
def test_a_deep_tree_left_by_an_agent_is_cleaned_up(sandboxes, tmp_path):
    from validate.sandbox import Limits

    # Inodes enough for the whole 5,000-deep tree: the removal, not the cap, is under test.
    _, attempts, _ = run_all(sandboxes("bwrap"), tmp_path / "deep", [0], agents="controls",
                             env_name="deshuffle-hostile", controls=["deep-tree"],
                             limits=Limits(storage_inodes=20000))
    assert attempts["status"].tolist() == ["no_reply"]
