"""An eval run directory's own files, and the journal of its trajectories.

An eval run directory (drawn in `validate.core.paths`, its names `validate.core.paths.EvalPaths`) holds
the attempts (phases eval-greedy and eval, role model; `validate.evidence.journal.Journal`), one
trajectory row per model call (`validate.eval.records.TurnRow`), one sample row per attempt
(`validate.eval.records.SampleRow`, failure class included), one row per task of the sampled
pass (`validate.eval.metrics.TaskEval`) and the summary (`validate.eval.summary.EvalSummary`).
Each finished attempt's sample row and turns are fsynced to the eval journal before its
attempt row.

A crash between an attempt's eval-journal line and its attempt row leaves an orphan line;
folding keeps only lines whose attempt is recorded, the last line of a key winning, so the
rerun of that attempt replaces it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from validate.core.paths import EvalPaths
from validate.core.records import arrow_schema, flat_row
from validate.eval.records import SampleRow, TurnRow
from validate.evidence.journal import AppendLog, write_parquet


class Entry(BaseModel):
    """One eval-journal line: an attempt's sample row and its turns."""

    sample: SampleRow
    turns: list[TurnRow]


class EvalJournal(AppendLog[Entry]):
    """The eval journal (`validate.evidence.journal.AppendLog` of entries)."""

    def __init__(self, paths: EvalPaths) -> None:
        super().__init__(paths.journal, Entry)
        self.paths = paths


def latest_entries(journal: EvalJournal, recorded: set[tuple],
                   previous: Path | None = None) -> dict[tuple, Entry]:
    """The last entry of each attempt key that `recorded` holds, previous samples.parquet
    rows included (their turns are read back from trajectories.parquet)."""
    out: dict[tuple, Entry] = {}
    if previous is not None and previous.exists():
        out.update(_from_parquet(journal.paths))
    for e in journal.read():
        out[e.sample.key()] = e
    return {k: v for k, v in out.items() if k in recorded}


def _from_parquet(paths: EvalPaths) -> dict[tuple, Entry]:
    import pyarrow.parquet as pq

    turns: dict[tuple, list[TurnRow]] = {}
    if paths.trajectories.exists():
        for row in pq.read_table(paths.trajectories).to_pylist():
            t = TurnRow.model_validate(row)
            turns.setdefault(t.key(), []).append(t)
    out = {}
    for row in pq.read_table(paths.samples).to_pylist():
        s = SampleRow.model_validate(row)
        out[s.key()] = Entry(sample=s, turns=sorted(turns.get(s.key(), []), key=lambda t: t.turn))
    return out


def write_side_tables(paths: EvalPaths, entries: list[Entry]) -> None:
    """trajectories.parquet and samples.parquet, in attempt-key order; the journal is then removed."""
    entries = sorted(entries, key=lambda e: e.sample.key())
    write_parquet(paths.samples, (flat_row(e.sample) for e in entries), arrow_schema(SampleRow))
    write_parquet(paths.trajectories, (flat_row(t) for e in entries for t in e.turns), arrow_schema(TurnRow))
    paths.journal.unlink(missing_ok=True)
