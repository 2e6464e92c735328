"""Executors and attempt kinds are open registries (``validate.executors``,
``validate.attempt_kinds``), like environments and backends: an executor and a kind that
live in tests/ (`tests.toyexecutor`, `tests.toykind`: one module and one entry point each,
no edit under validate/) run a real pool through real bubblewrap, and the run passes the
audit. The evidence does not depend on the executor; the kind decides where the reward is
made (here: a verifier inside the sandbox, after the agent)."""

from __future__ import annotations

import json
import subprocess

import pyarrow.parquet as pq
import pytest

from tests.conftest import VALIDATE, make_ctx, make_manifest, subprocess_env
from validate.audit.run import audit
from validate.core.records import EXCEPTION_STATUSES
from validate.kinds import kind_names, kind_of
from validate.run.executors import AttemptSpec, executor_names, make_executor
from validate.run.phases import PoolPhase, RunPhase, pool, run_agents

pytestmark = pytest.mark.bwrap

KEY = ("phase", "task_id", "agent", "sample", "attempt", "status", "reward", "reply_sha256", "as_expected")


def _rows(run) -> list[tuple]:
    rows = pq.read_table(run / "attempts.parquet").to_pylist()
    return sorted(tuple(r[k] for k in KEY) for r in rows)


def test_the_registries_list_the_projects_and_the_tests_own():
    assert executor_names() == ["ray", "threads", "toy-reversed"]
    assert kind_names() == ["chat", "program", "task-shell", "toy-insandbox", "trial"]


def test_an_executor_from_tests_gives_the_same_evidence_as_threads_and_passes_the_audit(tmp_path, sandboxes):
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[0, 1, 2], env_name="toy", broken=[1], min_task_count=2)
    threads = run_agents(make_ctx(manifest, sandbox, tmp_path / "threads"), RunPhase())
    ctx = make_ctx(manifest, sandbox, tmp_path / "toy", executor="toy-reversed")
    toy = run_agents(ctx, RunPhase())
    # Every (task, agent) went through the toy executor as data, in reverse order of the plan.
    assert all(isinstance(s, AttemptSpec) for s in ctx.executor.seen)
    assert [s.idx for s in ctx.executor.seen] == sorted((s.idx for s in ctx.executor.seen), reverse=True)
    assert len(ctx.executor.seen) == len(_rows(tmp_path / "toy")) >= 3 * 3  # no retries: one row per spec
    assert _rows(tmp_path / "toy") == _rows(tmp_path / "threads")
    assert (toy.counts.compatible, toy.counts.excluded) == (threads.counts.compatible,
                                                            threads.counts.excluded) == (2, 1)
    result = audit(tmp_path / "toy")
    assert result.problems == [] and result.checked


def test_a_kind_from_tests_scores_inside_the_sandbox_after_the_agent_and_passes_the_audit(
    tmp_path, sandboxes
):
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[0, 1, 2, 3], env_name="toy-insandbox", min_task_count=4)
    ctx = make_ctx(manifest, sandbox, tmp_path / "pool")
    assert kind_of(ctx.env).name == "toy-insandbox"
    summary = pool(ctx, PoolPhase())
    rows = pq.read_table(tmp_path / "pool" / "attempts.parquet").to_pylist()
    assert not {r["status"] for r in rows} & set(EXCEPTION_STATUSES)
    # read from the verifier in the sandbox
    assert {r["reward"] for r in rows if r["role"] == "oracle"} == {1.0}
    assert all(r["reward"] < 1.0 for r in rows if r["role"] == "control")
    assert summary.counts.compatible == 4
    result = audit(tmp_path / "pool")
    assert result.problems == [] and result.checked


def test_an_unknown_executor_is_refused_naming_the_installed_ones(tmp_path):
    with pytest.raises(Exception, match="no executor named 'slurm'; installed: ray, threads, toy-reversed"):
        make_executor("slurm")
    r = subprocess.run([*VALIDATE, "run", "--manifest", "x.json", "--executor", "slurm"], capture_output=True,
                       text=True, env=subprocess_env(), cwd=tmp_path)
    assert r.returncode == 2 and "--executor" in r.stderr and "Traceback" not in r.stderr


def test_a_cancel_ends_that_run_only_and_the_next_run_of_the_executor_plays_everything():
    """`cancel()` stops handing out work and drops what the cancelled work returns; the same
    executor's next run (the next play of a phase) is not stopped by it."""
    import threading

    executor = make_executor("threads", 2)
    from validate.sandbox import Limits

    specs = [AttemptSpec(phase="p", idx=i, agent="a", sample=0, attempt=1, contract="sha256:" + "0" * 64,
                         limits=Limits()) for i in range(8)]
    cancelled = threading.Event()

    class Worker:
        def __call__(self, spec):
            if spec.idx == 1:
                executor.cancel()
            return [spec.idx]

        def cancel(self):
            cancelled.set()

    first: list[int] = []
    executor.run(specs, Worker(), first.extend)
    assert cancelled.is_set() and len(first) < len(specs) and 1 not in first
    class Plain:
        def __call__(self, spec):
            return [spec.idx]

        def cancel(self):
            pass

    second: list[int] = []
    executor.run(specs, Plain(), second.extend)
    assert sorted(second) == list(range(8))


def test_a_phase_config_refuses_a_bad_value_naming_the_option(tmp_path):
    r = subprocess.run([*VALIDATE, "run", "--manifest", "x.json", "--phase", ""], capture_output=True,
                       text=True, env=subprocess_env(), cwd=tmp_path)
    assert (
        r.returncode == 2
        and r.stderr.count("\n") <= 2
        and "--phase" in r.stderr
        and "Traceback" not in r.stderr
    )


def test_a_cancel_without_ctrl_c_ends_the_phase_as_interrupted_and_a_resume_completes_it(tmp_path, sandboxes):
    from tests.toyexecutor import ReversedJsonExecutor
    from validate.run.context import Interrupted

    class CancelAfterOne(ReversedJsonExecutor):
        def run(self, specs, worker, record):
            def once(results):
                record(results)
                self.cancel()
            super().run(specs, worker, once)

    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[0, 1], env_name="toy")
    ctx = make_ctx(manifest, sandbox, tmp_path / "run")
    ctx.executor = CancelAfterOne()
    with pytest.raises(Interrupted, match="--resume"):
        run_agents(ctx, RunPhase())
    summary = json.loads((tmp_path / "run" / "run.json").read_text())
    assert summary["interrupted"] is True and len(_rows(tmp_path / "run")) == 1
    done = run_agents(make_ctx(manifest, sandbox, tmp_path / "run"), RunPhase())
    assert not done.interrupted and len(_rows(tmp_path / "run")) >= 2 * 3
