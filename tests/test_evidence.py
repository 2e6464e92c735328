"""Evidence files: the journal survives a crash, Parquet is written whole, runs keep their manifest."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime

import pyarrow.parquet as pq
import pytest

from validate.errors import EvidenceError
from validate.evidence import Journal, atomic_write, open_run, write_table, write_verdicts
from validate.paths import RunPaths
from validate.records import Attempt, TaskVerdict

METRICS = ("parsed_ok", "grouping_f1")


def att(idx, agent="oracle", attempt=1, status="ok"):
    return Attempt(run_id="r", phase="p", task_id=f"t{idx}", idx=idx, task_hash="h", agent=agent, role="oracle",
                   attempt=attempt, status=status, reward=1.0, metrics={"parsed_ok": 1.0, "grouping_f1": 1.0},
                   started_at=datetime(2026, 1, 1, tzinfo=UTC), workspace_sha256="w", backend="b", image_digest="d")


def test_a_line_cut_short_by_a_crash_is_dropped(tmp_path):
    paths = RunPaths(tmp_path)
    j = Journal(paths, METRICS)
    j.append([att(0), att(1)])
    j.close()
    with open(paths.journal, "ab") as fh:
        fh.write(att(2).model_dump_json().encode()[:57])  # SIGKILL mid-write
    got = Journal(paths, METRICS).existing()
    assert sorted(a.idx for a in got) == [0, 1]
    resumed = Journal(paths, METRICS)
    resumed.append([att(3)])  # must not be glued to the cut line
    assert sorted(a.idx for a in resumed.existing()) == [0, 1, 3]


def test_parquet_and_journal_merge_without_duplicates(tmp_path):
    paths = RunPaths(tmp_path)
    write_table(paths.attempts, [att(0), att(1)], Attempt, METRICS)
    j = Journal(paths, METRICS)
    j.append([att(1), att(2)])  # att(1) in both: a crash between the Parquet rename and the journal unlink
    got = j.existing()
    assert sorted(a.idx for a in got) == [0, 1, 2]
    assert got[0].metrics == {"parsed_ok": 1.0, "grouping_f1": 1.0}


def test_superseded_marks_all_but_the_latest_try(tmp_path):
    j = Journal(RunPaths(tmp_path), METRICS)
    j.append([att(0, attempt=1, status="infrastructure_error"), att(1)])
    j.append([att(0, attempt=2)])
    rows = sorted(j.marked(), key=lambda a: (a.idx, a.attempt))
    assert [(a.idx, a.attempt, a.superseded) for a in rows] == [(0, 1, True), (0, 2, False), (1, 1, False)]


def test_metrics_become_columns_and_every_column_carries_its_description(tmp_path):
    write_table(tmp_path / "a.parquet", [att(0)], Attempt, METRICS)
    table = pq.read_table(tmp_path / "a.parquet")
    assert "metric_grouping_f1" in table.column_names and "metrics" not in table.column_names
    assert str(table.schema.field("started_at").type) == "timestamp[us, tz=UTC]"
    for name in table.column_names:
        about = (table.schema.field(name).metadata or {}).get(b"description", b"")
        expected = Attempt.model_fields[name].description if name in Attempt.model_fields else None
        assert about and (expected is None or about.decode() == expected), name
    assert table.schema.metadata[b"model"] == b"Attempt"


def test_resuming_with_another_manifest_is_refused(tmp_path):
    paths = RunPaths(tmp_path / "run")
    open_run(paths, b'{"a": 1}\n')
    open_run(paths, b'{"a": 1}\n')
    with pytest.raises(EvidenceError, match="manifest.json.*another manifest"):
        open_run(paths, b'{"a": 2}\n')


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 256 KiB filesystem that fills up."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_disk_full_is_a_clear_error_and_keeps_what_was_there(tiny_disk):
    target = tiny_disk / "run.json"
    atomic_write(target, b"old")
    with pytest.raises(EvidenceError, match="run.json: cannot write.*No space left"):
        atomic_write(target, b"x" * (1 << 20))
    assert target.read_bytes() == b"old"
    assert [p.name for p in tiny_disk.iterdir()] == ["run.json"]


def test_disk_full_while_writing_parquet_leaves_no_half_file(tiny_disk):
    rows = [att(i).model_copy(update={"task_hash": os.urandom(2000).hex()}) for i in range(400)]
    write_table(tiny_disk / "attempts.parquet", rows[:2], Attempt, METRICS)
    before = pq.read_table(tiny_disk / "attempts.parquet").num_rows
    with pytest.raises(EvidenceError, match="attempts.parquet: cannot write"):
        write_table(tiny_disk / "attempts.parquet", rows, Attempt, METRICS)
    assert pq.read_table(tiny_disk / "attempts.parquet").num_rows == before == 2
    assert [p.name for p in tiny_disk.iterdir()] == ["attempts.parquet"]


def verdict(idx, meta, excluded=False):
    return TaskVerdict(run_id="r", phase="p", task_id=f"t{idx}", idx=idx, task_hash="h", family="f", meta=meta,
                       verdict="excluded" if excluded else "compatible",
                       reason="oracle_fails_on_valid_task" if excluded else None, detail="d", oracle_reward=1.0,
                       max_control_reward=0.0, max_control_agent="noop", margin=1.0, n_attempts=2)


@pytest.mark.parametrize("meta", [{}, {"n_sections": 3, "source": "arxiv"}])
def test_verdicts_read_back_from_parquet_are_the_verdicts_written(tmp_path, meta):
    # An environment without public meta (a task-directory dataset) stores it null; reading
    # the verdicts back for the summary must give the empty meta again, not fail on it.
    written = [verdict(0, meta), verdict(1, meta, excluded=True)]
    stored = write_verdicts(RunPaths(tmp_path), iter(written))
    assert len(stored) == 2
    assert list(stored) == written
    assert stored[1] == written[1] and stored[-2] == written[0]
    assert [r["task_id"] for r in pq.read_table(tmp_path / "exclusions.parquet").to_pylist()] == ["t1"]


@pytest.mark.parametrize("asked, used", [("", "system"), ("jemalloc", "jemalloc")])
def test_arrow_allocates_from_the_c_library_unless_the_user_names_a_pool(asked, used):
    # mimalloc, Arrow's default, kept ~50 MB more resident in a run's driver (performance.md)
    import sys
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if asked:
        env["ARROW_DEFAULT_MEMORY_POOL"] = asked
    out = subprocess.run([sys.executable, "-c", "import validate.evidence, pyarrow as pa; "
                          "print(pa.default_memory_pool().backend_name)"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == used
