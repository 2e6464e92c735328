"""Tasks a reviewer will try: each gets the right verdict with a clear detail.

These papers are made up on purpose (a real corpus has none of them, by its filters): a
paper of one paragraph, a paper whose two paragraphs are identical, papers of two units
whose displayed order is already right or whose reverse is.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from environment.deshuffle import Corpus
from tests.conftest import HINTS, make_ctx, make_manifest
from validate.contract.manifest import check_environment, derive
from validate.run.phases import RunPhase, run_agents

pytestmark = pytest.mark.bwrap


def paper(pid: str, texts: list[str]) -> dict:
    return {"paper_id": f"arxiv:{pid}", "source": "arxiv", "license": "CC-BY-4.0",
            "paragraphs": [{"text": t, "section": "Body"} for t in texts]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "tiny.jsonl"
    records = [
        paper("single", ["The only paragraph of a one-paragraph paper."]),
        paper("twins", ["A repeated paragraph.", "A repeated paragraph.", "A different closing paragraph."]),
        paper("pair", ["First of two.", "Second of two."]),
        paper("long", [f"Paragraph number {i} of a longer paper." for i in range(12)]),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path, Corpus.from_path(path)


def verdicts_for(tiny, sandboxes, tmp_path, idx, manifest=None):
    path, _ = tiny
    sandbox = sandboxes("bwrap")
    manifest = manifest or make_manifest(sandbox, idx=idx, corpus=str(path))
    run_agents(make_ctx(manifest, sandbox, tmp_path / "run"), RunPhase())
    tasks = pd.read_parquet(tmp_path / "run/tasks.parquet")
    return {row.idx: row for row in tasks.itertuples()}, pd.read_parquet(tmp_path / "run/attempts.parquet")


def test_single_paragraph_paper_is_invalid_not_infrastructure(tiny, sandboxes, tmp_path):
    v = verdicts_for(tiny, sandboxes, tmp_path, [0])[0][0]
    assert v.reason == "invalid_task_or_verifier"
    assert "single unit" in v.detail and "even the oracle cannot pass" in v.detail
    assert v.oracle_reward == 0.0


def test_identical_units_are_flagged_in_the_detail(tiny, sandboxes, tmp_path):
    v = verdicts_for(tiny, sandboxes, tmp_path, [1])[0][1]
    assert "repeat an earlier unit's text" in v.detail and "cannot be recovered" in v.detail


def pair_task(tiny, sandboxes, gold: list[int]):
    """An idx anchoring the two-paragraph paper (idx 2, 6, 10, ...) whose shuffle gave `gold`,
    and a contract holding just that task. The shuffle is keyed by the contract's secret, so
    the idx is searched for in one contract's tasks and the child contract keeps its salt."""
    path, _ = tiny
    sandbox = sandboxes("bwrap")
    parent = make_manifest(sandbox, idx=list(range(2, 400, 4)), corpus=str(path))
    env, _, taskset = check_environment(parent, HINTS)
    idx = next(i for i in range(2, 400, 4) if list(taskset.task(i).gold[0]) == gold)
    return idx, derive(parent, env, taskset, name="pair", idx=[idx],
                       rule=f"the pair task whose shuffle gave {gold}")


def test_displayed_order_correct_makes_identity_pass(tiny, sandboxes, tmp_path):
    idx, manifest = pair_task(tiny, sandboxes, [1, 2])
    v = verdicts_for(tiny, sandboxes, tmp_path, [idx], manifest)[0][idx]
    assert v.reason == "invalid_task_or_verifier"
    assert "control identity passed" in v.detail and "displayed order is already the true order" in v.detail


def test_a_control_passing_by_chance_on_a_tiny_paper(tiny, sandboxes, tmp_path):
    idx, manifest = pair_task(tiny, sandboxes, [2, 1])
    v = verdicts_for(tiny, sandboxes, tmp_path, [idx], manifest)[0][idx]
    assert v.reason == "invalid_task_or_verifier" and "control reversed passed" in v.detail


def test_a_longer_paper_is_compatible(tiny, sandboxes, tmp_path):
    v = verdicts_for(tiny, sandboxes, tmp_path, [3])[0][3]
    assert v.verdict == "compatible" and pd.isna(v.reason)
