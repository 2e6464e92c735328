"""Evidence files: the journal survives a crash, Parquet is written whole, runs keep their manifest."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import UTC, datetime

import pyarrow.parquet as pq
import pytest

from validate.core.errors import EvidenceError
from validate.core.paths import RunPaths
from validate.core.records import Attempt, TaskVerdict
from validate.evidence.journal import (
    Journal,
    atomic_write,
    fold,
    open_run,
    write_checksums,
    write_table,
    write_verdicts,
)
from validate.evidence.verdicts import Outcome

METRICS = ("parsed_ok", "grouping_f1")


def att(idx, agent="oracle", attempt=1, status="ok"):
    return Attempt(run_id="r", phase="p", task_id=f"t{idx}", idx=idx, task_hash="h", agent=agent,
                   role="oracle", attempt=attempt, status=status, reward=1.0,
                   metrics={"parsed_ok": 1.0, "grouping_f1": 1.0},
                   started_at=datetime(2026, 1, 1, tzinfo=UTC), workspace_sha256="w", backend="b",
                   image_digest="d")


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


def test_text_holding_lone_surrogates_is_journalled_and_folded_escaped(tmp_path):
    """A verifier's reward key (a JSON "\\ud800" escape) or an agent's file name that is not UTF-8
    (b"\\xff", a "\\udcff" to Python) reaching an attempt's text once stopped the journal."""
    paths = RunPaths(tmp_path)
    j = Journal(paths, METRICS)
    odd = att(0).model_copy(update={"status": "scorer_error", "reward": None})
    odd = Attempt.model_validate({**odd.model_dump(), "error_message": "no key 'reward' (keys: \ud800)",
                                  "stderr": "[left in /logs/verifier: \udcff\udcfe-left (0 B)]",
                                  "stdout": "\ud83d", "reply_text": "\udfff"})
    j.append([odd, att(1)])
    fold(j)
    row = next(r for r in pq.read_table(paths.attempts).to_pylist() if r["idx"] == 0)
    assert (row["error_message"], row["stderr"], row["stdout"], row["reply_text"]) == (
        "no key 'reward' (keys: \\ud800)", "[left in /logs/verifier: \\udcff\\udcfe-left (0 B)]", "\\ud83d",
        "\\udfff")
    verdict = TaskVerdict(run_id="r", phase="p", task_id="t0", idx=0, task_hash="h", family="f",
                          verdict="excluded", reason="invalid_task_or_verifier", detail="oracle: \ud800",
                          findings=[
                              {"kind": "malformed_task", "blocking": True, "detail": "\udcff"}],
                          oracle_reward=None, max_control_reward=None, max_control_agent=None, margin=None,
                          n_attempts=1)
    stored = list(write_verdicts(paths, [verdict]))
    assert stored[0].detail == "oracle: \\ud800" and stored[0].findings[0].detail == "\\udcff"


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
    return TaskVerdict(run_id="r", phase="p", task_id=f"t{idx}", idx=idx, task_hash="h", family="f",
                       meta=meta, verdict="excluded" if excluded else "compatible",
                       reason="oracle_fails_on_valid_task" if excluded else None, detail="d",
                       oracle_reward=1.0, max_control_reward=0.0, max_control_agent="noop", margin=1.0,
                       n_attempts=2)


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


def test_each_verdicts_facts_are_kept_whole_in_their_own_keys_and_types(tmp_path):
    """Tasks' facts differ in keys and types (a float, tags, a nested table): a struct column of
    the first row's keys dropped the rest from every row and made 60.0 a 60 or a true a 1."""
    import json

    metas = [{"category": "a", "expected_verdict": "compatible"},
             {"expert_time_estimate_min": 60.0, "tags": ["x", "y"], "author": {"name": "Ada", "n": 1},
              "flag": True, "released": "1979-05-27T07:32:00-08:00"},
             {"flag": 1, "weight": -0.5}]
    stored = list(write_verdicts(RunPaths(tmp_path), iter([verdict(i, m) for i, m in enumerate(metas)])))
    assert [v.meta for v in stored] == metas
    texts = [r["meta"] for r in pq.read_table(tmp_path / "tasks.parquet").to_pylist()]
    assert [json.loads(t) for t in texts] == metas and texts[1].startswith('{"author":{"n":1,"name":"Ada"},')
    assert (
        '"expert_time_estimate_min":60.0' in texts[1] and '"flag":true' in texts[1] and '"flag":1' in texts[2]
    )


def test_verdicts_written_with_a_struct_meta_still_read():
    """Evidence recorded before meta was text holds a struct of the first row's keys, a key a row
    lacked read as null: read back as the row's own facts."""
    from validate.core.records import verdict_of_row

    row = {**verdict(0, {}).model_dump(), "meta": {"n_sections": 3, "source": None}}
    row["findings"] = []
    assert verdict_of_row(row).meta == {"n_sections": 3}


@pytest.mark.parametrize("asked, used", [("", "system"), ("jemalloc", "jemalloc")])
def test_arrow_allocates_from_the_c_library_unless_the_user_names_a_pool(asked, used):
    # mimalloc, Arrow's default, kept ~50 MB more resident in a run's driver (performance.md)
    import sys
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if asked:
        env["ARROW_DEFAULT_MEMORY_POOL"] = asked
    out = subprocess.run([sys.executable, "-c", "import validate.evidence.journal, pyarrow as pa; "
                          "print(pa.default_memory_pool().backend_name)"], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == used


def test_outcomes_read_from_a_folded_run_are_those_of_its_attempts(tmp_path):
    """A folded run's outcomes come from attempts.parquet's columns alone; they must be exactly
    what the whole attempts give, superseded tries, nulls, the sign of a zero and all."""
    paths = RunPaths(tmp_path)
    rows = [att(0, attempt=1, status="infrastructure_error").model_copy(update={
                "reward": None, "error_class": "NodeLost", "error_message": "node n1 died"}),
            att(0, attempt=2),
            att(1, agent="nop").model_copy(update={"reward": -0.0}),
            att(3, agent="nop").model_copy(update={"reward": 0.0}),  # an outcome equal to the one before
            att(2).model_copy(update={"phase": "q", "reward": 0.25})]
    j = Journal(paths, METRICS)
    j.append(rows)
    live = list(j.outcomes())  # read from the journal, attempt by attempt
    fold(j)
    assert not paths.journal.exists()
    folded = list(Journal(paths, METRICS).outcomes())
    expected = [(a.phase, a.task_id, Outcome.of(a)) for a in rows]
    assert live == expected and folded == expected
    signs = [math.copysign(1.0, o.reward) for _, _, o in folded if o.reward == 0.0]
    assert signs == [-1.0, 1.0]  # -0.0 and 0.0 are equal, yet neither became the other
    pq.write_table(pq.read_table(paths.attempts).drop_columns(["status"]), paths.attempts)
    with pytest.raises(EvidenceError, match="attempts.parquet"):
        list(Journal(paths, METRICS).outcomes())


def test_checksums_list_every_sealed_file_in_path_order_part_by_part(tmp_path):
    paths = RunPaths(tmp_path)
    for name in ["a/b", "a.b", "a-c", "a/b.c/d", "z", "replies/ff", "replies/00", ".hidden", "dir/.tmp"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    paths.checksums.write_text("old")
    write_checksums(paths)
    listed = [line.split("  ", 1)[1] for line in paths.checksums.read_text().splitlines()]
    by_path = [p.relative_to(tmp_path).as_posix() for p in sorted(tmp_path.rglob("*"))
               if p.is_file() and not p.name.startswith(".") and p != paths.checksums]
    assert listed == by_path == ["a/b", "a/b.c/d", "a-c", "a.b", "replies/00", "replies/ff", "z"]
    check = subprocess.run(["sha256sum", "-c", "--quiet", paths.checksums.name], cwd=tmp_path,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_links_that_loop_or_dangle_are_not_sealed_and_an_unlistable_directory_is_named(tmp_path, monkeypatch):
    paths = RunPaths(tmp_path)
    (tmp_path / "kept").write_text("x")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dangling").symlink_to("nowhere")
    (tmp_path / "elsewhere").symlink_to(tmp_path / "kept")  # a link to a file: its target is hashed
    (tmp_path / "walked").symlink_to(tmp_path, target_is_directory=True)  # never walked (no loop)
    write_checksums(paths)
    assert [line.split("  ", 1)[1] for line in paths.checksums.read_text().splitlines()] == ["elsewhere",
                                                                                             "kept"]
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "f").write_text("y")
    real = os.scandir

    def scandir(path):  # as an unprivileged sealer sees a directory it may not read (root reads every one)
        if os.fspath(path) == os.fspath(locked):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(EvidenceError, match=f"{locked}: cannot list it to seal the run"):
        write_checksums(paths)
    assert [line.split("  ", 1)[1] for line in paths.checksums.read_text().splitlines()] == ["elsewhere",
                                                                                             "kept"]


def test_a_run_driver_does_not_load_pandas_until_it_reads_a_run_back():
    """What a run's driver imports (the command line, the harness, the phases, the executors)
    leaves pandas out (~34 MB of its peak); the commands that read a run back load it."""
    script = ("import sys\n"
              "import validate.cli.main, validate.api, validate.run.phases, validate.run.lifecycle, "
              "validate.run.smoke\n"
              "import validate.run.executors.ray, validate.run.executors.threads\n"
              "before = 'pandas' in sys.modules\nvalidate.api._reading()\n"
              "print(before, 'pandas' in sys.modules)")
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["False", "True"]


def _scattered_run(tmp_path, monkeypatch, tasks: int, rows_per_group: int):
    """A folded run whose attempts of three phases are recorded out of task order (seeded), in
    row groups of `rows_per_group`, with retries, errors, a -0.0 and tasks never asked for."""
    import random

    import validate.evidence.journal as evidence

    rng = random.Random(7)
    rows = []
    for i in range(tasks):
        for phase in ("oracle", "controls", "other"):
            for agent in ("oracle", "nop"):
                a = att(i, agent=agent).model_copy(update={"phase": phase,
                                                           "reward": rng.choice([0.0, -0.0, 0.5, 1.0])})
                rows.append(a)
                if rng.random() < 0.1:  # a retry after an infrastructure error
                    rows[-1] = a.model_copy(update={"status": "infrastructure_error", "reward": None,
                                                    "error_class": "NodeLost", "error_message": f"n{i} died"})
                    rows.append(a.model_copy(update={"attempt": 2}))
    rng.shuffle(rows)
    monkeypatch.setattr(evidence, "BATCH_ROWS", rows_per_group)
    paths = RunPaths(tmp_path)
    j = Journal(paths, METRICS)
    j.append(rows)
    live = Journal(paths, METRICS)
    fold(j)
    return paths, rows, live


def test_each_tasks_outcomes_from_a_folded_run_are_its_attempts_in_order_a_few_tasks_at_a_time(
    tmp_path, monkeypatch
):
    import validate.evidence.journal as evidence

    tasks = 23
    paths, rows, _ = _scattered_run(tmp_path, monkeypatch, tasks, rows_per_group=7)
    monkeypatch.setattr(evidence, "JUDGED_TOGETHER", 4)  # windows of 4 tasks over row groups of 7 rows
    asked = [f"t{i}" for i in (5, 0, 22, 3, 17)] + ["t-none"] + [f"t{i}" for i in range(6, 17)]
    phases = ("oracle", "controls")
    expected = [[Outcome.of(a) for a in rows if a.task_id == t and a.phase in phases] for t in asked]
    got = list(Journal(paths, METRICS).outcomes_by_task(phases, iter(asked)))
    assert got == expected  # each task's, in the order recorded, superseded tries included
    assert got[asked.index("t-none")] == []
    assert [[math.copysign(1.0, o.reward) for o in g if o.reward == 0.0] for g in got] == [
        [math.copysign(1.0, o.reward) for o in g if o.reward == 0.0] for g in expected
    ]  # no -0.0 became 0.0
    assert pq.ParquetFile(paths.attempts).num_row_groups > 10  # the windows did cross row groups


def test_outcomes_by_task_are_alike_from_the_journal_and_from_the_folded_run(tmp_path, monkeypatch):
    from validate.evidence.verdicts import by_task

    paths, rows, live = _scattered_run(tmp_path, monkeypatch, 9, rows_per_group=5)
    asked = [f"t{i}" for i in range(9, -1, -1)]
    triples = [(a.phase, a.task_id, Outcome.of(a)) for a in rows]
    expected = list(by_task(triples)(("controls",), asked))
    assert list(Journal(paths, METRICS).outcomes_by_task(("controls",), asked)) == expected
    assert list(live.outcomes_by_task(("controls",), asked)) == expected  # read before the fold: the journal


def test_a_folded_run_is_judged_holding_a_few_tasks_outcomes_not_all(tmp_path, monkeypatch):
    import tracemalloc

    import validate.evidence.journal as evidence
    from validate.evidence.verdicts import by_task

    paths, _, _ = _scattered_run(tmp_path, monkeypatch, 800, rows_per_group=100)
    monkeypatch.setattr(evidence, "JUDGED_TOGETHER", 40)
    asked, phases = [f"t{i}" for i in range(800)], ("oracle", "controls")

    def peak(groups) -> int:
        tracemalloc.start()
        try:
            for _ in groups:
                pass
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    whole = peak(by_task(Journal(paths, METRICS).outcomes())(phases, asked))
    windowed = peak(Journal(paths, METRICS).outcomes_by_task(phases, asked))
    assert windowed < whole / 2, (windowed, whole)


@pytest.mark.parametrize("column, value", [("status", "finished"), ("task_id", 7), ("task_id", b"t0"),
                                           ("phase", b"oracle"), ("agent", None)])
def test_outcomes_by_task_refuse_a_folded_run_that_is_not_attempts(tmp_path, monkeypatch, column, value):
    import pyarrow as pa

    paths, _, _ = _scattered_run(tmp_path, monkeypatch, 3, rows_per_group=4)
    table = pq.read_table(paths.attempts)
    at = table.schema.get_field_index(column)
    pq.write_table(table.set_column(at, column, pa.array([value] * table.num_rows)), paths.attempts)
    with pytest.raises(EvidenceError, match="attempts.parquet"):  # ids "0".."2" would match a column of ints
        list(
            Journal(paths, METRICS).outcomes_by_task(
                ("oracle", "controls"), ["0", "1", "2", "t0", "t1", "t2"]
            )
        )


def test_outcomes_by_task_refuse_a_bad_row_of_a_phase_not_asked_for(tmp_path, monkeypatch):
    import pyarrow as pa

    paths, _, _ = _scattered_run(tmp_path, monkeypatch, 3, rows_per_group=4)
    table = pq.read_table(paths.attempts)
    other = [p == "other" for p in table.column("phase").to_pylist()]
    status = [("finished" if o else s)
              for o, s in zip(other, table.column("status").to_pylist(), strict=True)]
    pq.write_table(table.set_column(table.schema.get_field_index("status"), "status", pa.array(status)),
                   paths.attempts)
    # as `outcomes` refuses it: the file is not evidence
    with pytest.raises(EvidenceError, match="attempts.parquet"):
        list(Journal(paths, METRICS).outcomes_by_task(("oracle", "controls"), ["t0", "t1", "t2"]))
