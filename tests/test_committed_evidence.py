"""The evidence committed under ledgers/ checks out, and stops checking out when touched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from validate.audit import audit

LEDGERS = sorted(p for p in (Path(__file__).resolve().parents[1] / "ledgers").iterdir() if p.is_dir())


def test_there_is_a_pilot_and_a_full_pool():
    names = [p.name for p in LEDGERS]
    assert any("-pilot-" in n for n in names) and any("-pool-" in n for n in names)
    pool = next(p for p in LEDGERS if "-pool-" in p.name)
    tasks = pd.read_parquet(pool / "tasks.parquet")
    assert len(tasks) >= 1000 and set(tasks["n_papers"]) == {1, 2, 3}
    assert (pool / "report.md").exists() and (pool / "report.html").exists()
    assert (pool / "smoke/result.json").exists()


@pytest.mark.parametrize("run_dir", LEDGERS, ids=[p.name for p in LEDGERS])
def test_committed_run_passes_audit(run_dir):
    assert audit(run_dir) == []


@pytest.mark.parametrize("name", ["attempts.parquet", "report.md", "manifest.json", "run.json"])
def test_one_changed_byte_fails_audit_naming_the_file(tmp_path, name):
    pool = next(p for p in LEDGERS if "-pool-" in p.name)
    copy = tmp_path / pool.name
    shutil.copytree(pool, copy)
    data = bytearray((copy / name).read_bytes())
    data[len(data) // 3] ^= 0x20
    (copy / name).write_bytes(bytes(data))
    problems = audit(copy)
    assert problems and any(name in p for p in problems), problems
