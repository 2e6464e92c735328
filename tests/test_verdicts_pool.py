"""A pool (bwrap, the toy environment) whose contract plays the oracle three times per task,
with the oracle frozen out of one task as a task without a reference solution is: the
repeats are samples, each judged; the task without a reference is never frozen but its
controls still run (phase ``runtime-only``) and it is excluded as ``no_reference_solution``,
counted apart in the claim; the audit derives all of it again and catches a repeat removed."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environment.protocol import Environment
from tests.conftest import make_ctx, make_manifest
from tests.toyenv import ToyEnvironment
from validate.audit.run import audit
from validate.core.paths import RunPaths
from validate.evidence.journal import write_checksums
from validate.report.run import write_report
from validate.run.phases import RUNTIME_ONLY, PoolPhase, pool

pytestmark = pytest.mark.bwrap

NO_REFERENCE = 2
WHY = "toy: this task ships no reference solution"


def _no_reference(self, agent, task):
    """The toy's own rule, plus the oracle (by its role) frozen out of one task."""
    if agent.role == "oracle" and task.idx == NO_REFERENCE:
        return WHY
    return Environment.not_applicable(self, agent, task)


@pytest.fixture(scope="module")
def repeats_pool(tmp_path_factory, sandboxes):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ToyEnvironment, "not_applicable", _no_reference)
        sandbox = sandboxes("bwrap")
        manifest = make_manifest(sandbox, idx=[0, 1, NO_REFERENCE], env_name="toy", oracle_repeats=3,
                                 min_task_count=2)
        root = tmp_path_factory.mktemp("repeats") / "pool"
        summary = pool(make_ctx(manifest, sandbox, root), PoolPhase(), log=lambda m: None)
        write_report(root)
        yield root, summary, manifest


def test_the_oracle_plays_three_repeats_and_never_the_task_without_a_reference(repeats_pool):
    root, _, manifest = repeats_pool
    assert manifest.tasks[NO_REFERENCE].skip == {"oracle": WHY}
    rows = pq.read_table(root / "attempts.parquet").to_pylist()
    oracle = sorted((r["idx"], r["sample"]) for r in rows if r["role"] == "oracle")
    assert oracle == [(i, s) for i in (0, 1) for s in range(3)]
    runtime = sorted((r["idx"], r["agent"]) for r in rows if r["phase"] == RUNTIME_ONLY)
    assert runtime == [(NO_REFERENCE, "empty"), (NO_REFERENCE, "off-by-two")]
    assert all(r["sample"] == 0 for r in rows if r["role"] != "oracle")


def test_verdicts_counts_frozen_set_and_claim(repeats_pool):
    root, summary, _ = repeats_pool
    tasks = {t["idx"]: t for t in pq.read_table(root / "tasks.parquet").to_pylist()}
    assert [tasks[i]["verdict"] for i in (0, 1)] == ["compatible", "compatible"]
    assert tasks[0]["detail"] == "oracle passed all 3 repeats; every control rejected"
    assert (tasks[NO_REFERENCE]["verdict"], tasks[NO_REFERENCE]["reason"]) == ("excluded",
                                                                               "no_reference_solution")
    assert WHY in tasks[NO_REFERENCE]["detail"] and tasks[NO_REFERENCE]["oracle_reward"] is None
    frozen = json.loads((root / "frozen-manifest.json").read_text())
    assert frozen["selection"]["idx"] == [0, 1] and frozen["expectations"]["oracle_repeats"] == 3
    assert summary.counts.excluded_by_reason == {"no_reference_solution": 1}
    text = (sorted((root / "reports").iterdir())[-1] / "report.md").read_text()
    assert "2/3 (66.7 %) oracle-certified, 1/3 (33.3 %) runtime-tested only" in text
    assert "on each of its 3 repeats" in text and "| oracle repeats | 3 (every repeat must pass) |" in text


def test_the_audit_derives_it_again(repeats_pool):
    root, _, _ = repeats_pool
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ToyEnvironment, "not_applicable", _no_reference)
        result = audit(root)
    assert result.problems == []
    assert any("3 task rows and 1 exclusion rows re-derived" in line
               for line in result.checked), result.checked


def test_the_audit_catches_a_repeat_removed(repeats_pool, tmp_path):
    """Without its third repeat task 0 is incomplete, not the compatible its row says."""
    copy = tmp_path / "pool"
    shutil.copytree(repeats_pool[0], copy)
    table = pq.read_table(copy / "attempts.parquet")
    kept = [r for r in table.to_pylist() if not (r["idx"] == 0 and r["role"] == "oracle"
                                                 and r["sample"] == 2)]
    pq.write_table(pa.Table.from_pylist(kept, schema=table.schema), copy / "attempts.parquet")
    write_checksums(RunPaths(copy))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ToyEnvironment, "not_applicable", _no_reference)
        problems = " ".join(audit(copy).problems)
    assert "verdict compatible (None) but its attempts give incomplete" in problems, problems
