"""Evidence on disk: an append-only journal while running, Parquet when done, checksums last.

Nothing is lost on a crash: each finished attempt is appended to ``journal.jsonl`` and
fsynced before the next is handed out; a line cut short by a crash is dropped on reading
(its attempt is simply rerun by ``--resume``). Parquet files are written whole to a temp
file and renamed, so none is ever half-written. `finalize` folds the journal into
``attempts.parquet`` (marking superseded attempts), writes the verdict tables, the run
summary and the ``checksums`` file (``sha256sum -c`` format).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError

from validate.errors import EvidenceError
from validate.paths import RunPaths
from validate.records import Attempt, Exclusion, TaskVerdict, arrow_schema, flat_row

BATCH_ROWS = 1000


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same directory and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise EvidenceError(f"{path}: cannot write ({e.strerror or e})") from None
        raise


def write_parquet(path: Path, rows: Iterable[dict], schema: pa.Schema) -> int:
    """Stream `rows` into `path` in batches, atomically; returns the row count."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    n = 0
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            batch: list[dict] = []
            for row in rows:
                batch.append(row)
                if len(batch) >= BATCH_ROWS:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                    n, batch = n + len(batch), []
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            n += len(batch)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise EvidenceError(f"{path}: cannot write ({e.strerror or e})") from None
        raise
    return n


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_checksums(paths: RunPaths) -> None:
    files = sorted(p for p in paths.root.rglob("*")
                   if p.is_file() and p != paths.checksums and not p.name.startswith("."))
    lines = [f"{file_sha256(p)}  {p.relative_to(paths.root).as_posix()}\n" for p in files]
    atomic_write(paths.checksums, "".join(lines).encode())


def open_run(paths: RunPaths, manifest_json: bytes) -> None:
    """Create the run directory with its manifest copy, or check that a resumed run's matches."""
    paths.root.mkdir(parents=True, exist_ok=True)
    if paths.manifest.exists():
        if paths.manifest.read_bytes() != manifest_json:
            raise EvidenceError(f"{paths.manifest}: this run directory was made with another manifest; "
                                f"resume it with that manifest or start a new run directory")
        return
    atomic_write(paths.manifest, manifest_json)


class Journal:
    """The run's attempts: those already in Parquet plus those appended since."""

    def __init__(self, paths: RunPaths, metric_names: tuple[str, ...]) -> None:
        self.paths = paths
        self.metric_names = metric_names
        self._lock = threading.Lock()
        self._fh = None

    def existing(self) -> list[Attempt]:
        """Every recorded attempt, deduplicated by (phase, task, agent, attempt)."""
        rows: dict[tuple, Attempt] = {}
        for a in self._from_parquet():
            rows[(a.phase, a.task_id, a.agent, a.attempt)] = a
        for a in self._from_journal():
            rows[(a.phase, a.task_id, a.agent, a.attempt)] = a
        return list(rows.values())

    def _from_parquet(self) -> Iterator[Attempt]:
        if not self.paths.attempts.exists():
            return
        try:
            table = pq.read_table(self.paths.attempts)
        except (OSError, pa.ArrowException) as e:
            raise EvidenceError(f"{self.paths.attempts}: unreadable ({e})") from None
        for row in table.to_pylist():
            metrics = {m: row.pop(f"metric_{m}") for m in self.metric_names if f"metric_{m}" in row}
            yield Attempt.model_validate({**row, "metrics": {k: v for k, v in metrics.items() if v is not None}})

    def _from_journal(self) -> Iterator[Attempt]:
        if not self.paths.journal.exists():
            return
        with open(self.paths.journal, "rb") as fh:
            for line in fh:
                try:
                    yield Attempt.model_validate_json(line)
                except ValidationError:
                    continue  # the last line of a crashed run, cut short: that attempt reruns

    def append(self, attempts: list[Attempt]) -> None:
        data = b"".join(a.model_dump_json().encode() + b"\n" for a in attempts)
        with self._lock:
            try:
                if self._fh is None:
                    # Unbuffered: a failed write leaves nothing queued to fail again on close;
                    # a line cut short by a full disk is dropped on reading.
                    self._fh = open(self.paths.journal, "ab", buffering=0)
                    if self._fh.tell() and not self.paths.journal.read_bytes().endswith(b"\n"):
                        data = b"\n" + data  # a crash cut the last line: start on a fresh one
                view = memoryview(data)
                while view:
                    view = view[self._fh.write(view):]
                os.fsync(self._fh.fileno())
            except OSError as e:
                raise EvidenceError(f"{self.paths.journal}: cannot append ({e.strerror or e})") from None

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                try:
                    self._fh.close()
                except OSError:
                    pass  # unbuffered: nothing was pending
                self._fh = None


def mark_superseded(attempts: list[Attempt]) -> list[Attempt]:
    latest: dict[tuple, int] = {}
    for a in attempts:
        key = (a.phase, a.task_id, a.agent)
        latest[key] = max(latest.get(key, 0), a.attempt)
    out = [a.model_copy(update={"superseded": a.attempt < latest[(a.phase, a.task_id, a.agent)]})
           for a in attempts]
    return sorted(out, key=lambda a: (a.phase, a.idx, a.agent, a.attempt))


def write_table(path: Path, records: Iterable[BaseModel], model: type[BaseModel],
                metric_names: tuple[str, ...] = ()) -> int:
    return write_parquet(path, (flat_row(r, metric_names) for r in records), arrow_schema(model, metric_names))


def finalize(journal: Journal, verdicts: list[TaskVerdict], summary: dict) -> list[Attempt]:
    """Fold the journal into Parquet, write verdicts, exclusions, summary and checksums."""
    paths = journal.paths
    journal.close()
    attempts = mark_superseded(journal.existing())
    write_table(paths.attempts, attempts, Attempt, journal.metric_names)
    paths.journal.unlink(missing_ok=True)
    write_table(paths.tasks, verdicts, TaskVerdict)
    exclusions = [Exclusion(run_id=v.run_id, phase=v.phase, task_id=v.task_id, idx=v.idx,
                            task_hash=v.task_hash, reason=v.reason, detail=v.detail)
                  for v in verdicts if not v.compatible]
    write_table(paths.exclusions, exclusions, Exclusion)
    atomic_write(paths.summary, json.dumps(summary, sort_keys=True, indent=2, default=str).encode() + b"\n")
    write_checksums(paths)
    return attempts
