"""The evidence committed under ledgers/ checks out — every verdict and count re-derived, with
the findings re-derived from the real corpus and packaged data — and stops checking out when
touched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import CORPUS_PATH
from validate.audit.run import audit
from validate.evidence.summary import RunSummary

#: Validation runs (run.json); the eval runs and compares are tests/test_eval_committed.py's.
LEDGERS = sorted(p for p in (Path(__file__).resolve().parents[1] / "ledgers").iterdir()
                 if (p / "run.json").is_file())
DATA = (CORPUS_PATH,)


def summary(run_dir: Path) -> RunSummary:
    return RunSummary.model_validate_json((run_dir / "run.json").read_bytes())


def latest_report(run_dir: Path) -> Path:
    return sorted((run_dir / "reports").iterdir())[-1]


def test_every_environment_has_a_passing_pool_with_a_report_and_a_smoke_test():
    pools = {}
    for run_dir in LEDGERS:
        s = summary(run_dir)
        if s.kind == "pool":
            pools.setdefault(s.environment, []).append(run_dir)
    assert {"deshuffle-papers", "twohop-env", "curator"} <= set(pools)
    for dirs in pools.values():
        for run_dir in dirs:
            s = summary(run_dir)
            assert s.dataset_verdict.verdict == "PASS", (run_dir.name, s.dataset_verdict.headline)
            assert s.backend == "docker" and list((run_dir / "smoke").glob("*/result.json"))
            first = (latest_report(run_dir) / "report.md").read_text().splitlines()[2]
            assert first == "**Dataset verdict: PASS**", first
    deshuffle = [summary(d) for d in pools["deshuffle-papers"]]
    assert max(s.counts.tasks for s in deshuffle) >= 1000
    curator = {json.loads((d / "manifest.json").read_text())["environment"]["scorer"]["deterministic"]
               for d in pools["curator"]}
    assert curator == {True, False}  # one pool without the judge, one with it
    assert any(summary(d).kind == "pilot" and summary(d).environment == "deshuffle-papers" for d in LEDGERS)


@pytest.mark.parametrize("run_dir", LEDGERS, ids=[p.name for p in LEDGERS])
def test_committed_run_passes_audit(run_dir):
    result = audit(run_dir, data=DATA)
    stale = [p for p in result.problems if "names no renderer version" in p]
    assert not stale, (f"{run_dir.name}: its report was written before the audit rendered reports again byte "
                       f"for byte, so it cannot be checked; re-record it (`validate report {run_dir.name}`, "
                       "or the run) and commit the new entry", stale)
    assert result.problems == [], result.problems


@pytest.mark.parametrize("name", ["attempts.parquet", "tasks.parquet", "manifest.json", "run.json"])
def test_one_changed_byte_fails_audit_naming_the_file(tmp_path, name):
    pool = next(p for p in LEDGERS if summary(p).kind == "pool" and summary(p).environment == "twohop-env")
    copy = tmp_path / pool.name
    shutil.copytree(pool, copy)
    data = bytearray((copy / name).read_bytes())
    data[len(data) // 3] ^= 0x20
    (copy / name).write_bytes(bytes(data))
    problems = audit(copy, data=DATA).problems
    assert problems and any(name in p for p in problems), problems


def test_a_smoke_rerun_missing_an_attempt_is_a_mismatch_not_a_smaller_pass(tmp_path):
    """A rerun cut short (one oracle attempt gone) must not compare clean on what it kept."""
    import pyarrow.parquet as pq

    from validate.run.smoke import compare

    pool = next(p for p in LEDGERS if summary(p).kind == "pool" and summary(p).environment == "twohop-env")
    entry = next((pool / "smoke").iterdir())
    rerun = tmp_path / "run"
    shutil.copytree(entry / "run", rerun)
    tolerance = json.loads((pool / "manifest.json").read_text())["environment"]["scorer"]["smoke_tolerance"]
    n, mismatches = compare(pool, rerun, tolerance)
    assert n > 0 and mismatches == []
    table = pq.read_table(rerun / "attempts.parquet")
    rows = table.to_pylist()
    gone = next(r for r in rows if r["agent"] == "oracle")
    pq.write_table(table.from_pylist([r for r in rows if r is not gone], schema=table.schema),
                   rerun / "attempts.parquet")
    n, mismatches = compare(pool, rerun, tolerance)
    assert mismatches == [f"{(gone['task_id'], 'oracle')}: missing from the rerun"]
