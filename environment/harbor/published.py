"""Harbor datasets as they are published: Parquet rows, one packed task per row.

The shape (the Hugging Face dataset repositories of Harbor tasks, and the converters that
write them): one row per task; ``path``, the task directory's path in the dataset (the task's
id here, as a directory dataset's ids are its paths; ``task_id`` when there is no ``path``);
``task_binary``, the task directory packed as a tar archive (gzip-compressed or plain, its
members relative to the task or wrapped in one folder); and any other columns
(``task_id``, ``instruction``, ``sif_image``, split flags), kept as the task's public
metadata under ``row.<column>``.

`open_source` names the files and hashes them (`PublishedSource`: what the contract records;
its revision is the sha256 over every file's name and sha256, i.e. the bytes the tasks are
made from). `unpack_source` reads the rows a batch at a time and unpacks each
(`environment.harbor.unpack`, hostile input) into a fresh private directory of this process,
never one another process could have left; the same source is unpacked once per process. A
row that cannot be a task keeps its place as an `InvalidTask` whose problem names the file
and row (``data/train.parquet#7``): a path that is not a plain relative path, given twice or
inside another row's task, or an archive refused. Every other row is loaded from its
unpacked directory as a directory dataset's task is (its hash is its directory's).

`pack_task` and `write_published` write task directories back in that shape, byte for byte
reproducibly (members sorted, owners and times zeroed, gzip without a timestamp).
"""

from __future__ import annotations

import atexit
import gzip
import hashlib
import io
import math
import os
import re
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from environment.harbor.taskdir import (
    HarborDataset,
    HarborTask,
    InvalidTask,
    Limits,
    TaskProblem,
    find_task_dirs,
    load_task,
)
from environment.harbor.unpack import ArchiveProblem, task_root, unpack_archive
from environment.protocol import ConfigError, MetaValue, canonical_json, sha256_tag

ARCHIVE = "task_binary"
SIF = "sif_image"
PATH_COLUMNS = ("path", "task_id")
META_PREFIX = "row."
#: A column's text longer than this is kept as its sha256 (the instruction is in the task).
MAX_META_CHARS = 4096
_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+@=-]{0,199}$")
_MAX_PATH_DEPTH = 8
_LOCK = threading.Lock()
_UNPACKED: dict[str, tuple[Path, HarborDataset, dict[str, dict[str, MetaValue]]]] = {}


class PublishedSource(BaseModel):
    """Where a published dataset came from: recorded in the contract (``environment.source``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["parquet", "hub"]
    location: str = Field(description="the config's dataset, as given")
    repo: str | None = Field(default=None, description="the Hub repository, owner/name")
    requested: str | None = Field(default=None,
                                  description="the revision asked for (a branch, tag or commit)")
    commit: str | None = Field(default=None, description="the immutable commit the request resolved to")
    files: dict[str, str] = Field(description="every Parquet file read, by relative name → its sha256")

    def revision(self) -> str:
        return sha256_tag(canonical_json({"files": dict(sorted(self.files.items()))}))


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()


def parquet_files(folder: Path) -> list[tuple[str, Path]]:
    """Every ``*.parquet`` under `folder` (none hidden), by relative name, sorted."""
    found = []
    for p in sorted(folder.rglob("*.parquet")):
        rel = p.relative_to(folder).as_posix()
        if not any(part.startswith(".") for part in rel.split("/")) and p.is_file():
            found.append((rel, p))
    return found


def is_published(folder: Path) -> bool:
    """A folder of Parquet files and no task directory (a task's own data files do not count)."""
    if not parquet_files(folder):
        return False
    try:
        return not any((folder / tid / "task.toml").exists() for tid in find_task_dirs(folder))
    except Exception:
        return True


def open_source(files: list[tuple[str, Path]], kind: Literal["parquet", "hub"], location: str,
                **hub: str | None) -> PublishedSource:
    """The source record of `files` (name, path), every file hashed."""
    return PublishedSource(kind=kind, location=location, files={name: _sha256(path) for name, path in files},
                           **hub)


def unpack_source(source: PublishedSource, files: list[tuple[str, Path]], limits: Limits = Limits(),
                  log: Callable[[str], None] | None = None) -> tuple[Path, HarborDataset, dict]:
    """(the private directory the tasks are unpacked in, the dataset, each task id → its row's
    public columns): see the module docstring. Once per process and source."""
    key = sha256_tag(canonical_json([source.revision(), limits.model_dump()]))
    with _LOCK:
        if key in _UNPACKED and _UNPACKED[key][0].is_dir():
            return _UNPACKED[key]
        base = Path(tempfile.mkdtemp(prefix="harbor-published-"))
        atexit.register(shutil.rmtree, base, True)
        _UNPACKED[key] = _Rows(base, limits, log or (lambda m: None)).read(source, files)
        return _UNPACKED[key]


class _Rows:
    """Every row of every file into ``<base>/tasks/<path>``, scratch space beside it."""

    def __init__(self, base: Path, limits: Limits, log: Callable[[str], None]) -> None:
        self.tasks, self.scratch = base / "tasks", base / "scratch"
        self.tasks.mkdir()
        self.scratch.mkdir()
        self.limits, self.log = limits, log
        self.ids: dict[str, str] = {}  # task id → the row it came from
        self.inside: dict[str, str] = {}  # every proper prefix of an id → that id
        self.invalid: list[InvalidTask] = []
        self.columns: dict[str, dict[str, MetaValue]] = {}
        self.written = 0

    def read(self, source: PublishedSource,
             files: list[tuple[str, Path]]) -> tuple[Path, HarborDataset, dict]:
        opened = [(name, _open_parquet(name, path)) for name, path in files]
        total = sum(pf.metadata.num_rows for _, pf in opened)
        done, said = 0, time.monotonic()
        for name, pf in opened:
            column = next(c for c in PATH_COLUMNS if c in pf.schema_arrow.names)
            row = 0
            for batch in pf.iter_batches(batch_size=16):
                for values in batch.to_pylist():
                    self.row(f"{name}#{row}", values, column)
                    row, done = row + 1, done + 1
                    if time.monotonic() - said > 2:
                        self.log(f"unpacking tasks: {done}/{total} rows")
                        said = time.monotonic()
        shutil.rmtree(self.scratch, ignore_errors=True)
        refused = {t.id for t in self.invalid}
        tasks = [load_task(self.tasks, tid, self.limits, _sif(self.columns.get(tid, {})))
                 for tid in sorted(self.ids) if tid not in refused]
        dataset = HarborDataset(revision=source.revision(),
                                tasks=[t for t in tasks if isinstance(t, HarborTask)],
                                invalid=[*self.invalid, *(t for t in tasks if isinstance(t, InvalidTask))])
        self.log(f"unpacked {total} rows: {len(dataset.tasks)} tasks loaded, {len(dataset.invalid)} refused "
                 f"({self.written} bytes)")
        return self.tasks, dataset, self.columns

    def _refuse(self, tid: str, where: str, field: str, detail: str, data: bytes = b"") -> None:
        self.invalid.append(InvalidTask(id=tid, hash=sha256_tag(data), entries=[],
                                        problems=[TaskProblem(file=where, field=field, detail=detail)]))

    def row(self, where: str, values: Mapping[str, Any], column: str) -> None:
        raw, data = values.get(column), values.get(ARCHIVE)
        tid, why = _task_path(raw)
        if why is None and tid in self.ids:
            why = f"{column} {tid!r} is also row {self.ids[tid]}'s"
        elif why is None and (tid in self.inside or any(p in self.ids for p in _prefixes(tid))):
            other = self.inside.get(tid) or next(p for p in _prefixes(tid) if p in self.ids)
            why = f"{column} {tid!r} and row {self.ids[other]}'s {other!r}: one task inside the other"
        if why is not None:
            self._refuse(where, where, column, why, data if isinstance(data, bytes) else b"")
            return
        self.ids[tid] = where
        self.inside.update({p: tid for p in _prefixes(tid)})
        self.columns[tid] = public_columns(values, column)
        if not isinstance(data, bytes):
            self._refuse(tid, where, ARCHIVE, f"no archive (the row's {ARCHIVE} is {type(data).__name__})")
            return
        try:
            self._unpack(tid, data)
        except ArchiveProblem as e:
            self._refuse(tid, where, ARCHIVE, str(e), data)

    def _unpack(self, tid: str, data: bytes) -> None:
        room = self.limits.max_dataset_bytes - self.written
        if room <= 0:
            raise ArchiveProblem(f"the dataset already unpacked to {self.written} bytes, its limit")
        scratch = Path(tempfile.mkdtemp(dir=self.scratch))
        try:
            self.written += unpack_archive(data, scratch, self.limits.model_copy(
                update={"max_task_bytes": min(self.limits.max_task_bytes, room)}))
            target = self.tasks / tid
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(task_root(scratch), target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _sif(columns: Mapping[str, MetaValue]) -> str | None:
    """The row's Apptainer image (``sif_image``), when it names one."""
    value = columns.get(META_PREFIX + SIF)
    return value if isinstance(value, str) and value.strip() else None


def _open_parquet(name: str, path: Path):
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow's errors (ArrowInvalid, OSError) on a file that is not Parquet
        raise ConfigError(
            f"dataset: {name} is not a readable Parquet file ({type(e).__name__}: {e})"
        ) from None
    names = pf.schema_arrow.names
    if ARCHIVE not in names or not any(c in names for c in PATH_COLUMNS):
        raise ConfigError(f"dataset: {name} has columns {', '.join(names)}; a published Harbor dataset has "
                          f"one row per task with 'path' (or 'task_id') and '{ARCHIVE}' (the task directory "
                          "as a tar archive)")
    return pf


def _prefixes(tid: str) -> list[str]:
    parts = tid.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _task_path(raw: object) -> tuple[str, str | None]:
    """(the row's task id, or why its path cannot be one)."""
    if not isinstance(raw, str):
        return "", f"the task's path is {type(raw).__name__}, not text"
    parts = raw.split("/")
    if len(parts) > _MAX_PATH_DEPTH or not all(_PLAIN.match(p) for p in parts):
        return "", (f"path {raw!r} is not a relative path of plain names (letters, digits and . _ - + @ =, "
                    f"none starting with '.', at most {_MAX_PATH_DEPTH} deep)")
    return raw, None


def public_columns(values: Mapping[str, Any], id_column: str) -> dict[str, MetaValue]:
    """The row's other columns as metadata scalars: text (long text as its sha256), numbers,
    booleans; bytes as their sha256; anything else as its canonical JSON; nulls dropped."""
    out: dict[str, MetaValue] = {}
    for key in sorted(values):
        v = values[key]
        if key in (ARCHIVE, id_column) or v is None or (isinstance(v, float) and not math.isfinite(v)):
            continue
        if isinstance(v, bytes):
            v = sha256_tag(v)
        elif not isinstance(v, bool | int | float | str):
            try:
                v = canonical_json(v).decode()
            except (TypeError, ValueError):
                v = str(v)
        if isinstance(v, str) and len(v) > MAX_META_CHARS:
            v = sha256_tag(v.encode("utf-8", "surrogatepass"))
        out[META_PREFIX + key] = v
    return out


# --- writing the shape -------------------------------------------------------------------

def pack_task(task_dir: Path) -> bytes:
    """The task directory as a gzip-compressed tar archive whose bytes depend only on its
    content: members by sorted path, modes 0755/0644, owner 0, time 0, no gzip timestamp."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(task_dir):
            dirnames.sort()
            rel_dir = Path(dirpath).relative_to(task_dir)
            for name in sorted([*dirnames, *filenames]):
                path = Path(dirpath) / name
                info = tar.gettarinfo(str(path), arcname=(rel_dir / name).as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
                if info.isreg():
                    with open(path, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def write_published(root: Path, task_ids: list[str], out_file: Path, instructions: Mapping[str, str],
                    columns: Mapping[str, Mapping[str, MetaValue]] = {}) -> None:
    """One Parquet file of the tasks `task_ids` under `root` in the published shape: ``path``,
    ``task_binary``, ``task_id``, ``instruction``, and each task's own public columns (those
    it was published with) as text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = sorted(task_ids)
    extra = sorted(
        {k[len(META_PREFIX) :] for t in ids for k in columns.get(t, {})}
        - {"path", ARCHIVE, "task_id", "instruction"}
    )
    table: dict[str, pa.Array] = {"path": pa.array(ids, pa.string()),
             ARCHIVE: pa.array([pack_task(root / t) for t in ids], pa.binary()),
             "task_id": pa.array(ids, pa.string()),
             "instruction": pa.array([instructions.get(t, "") for t in ids], pa.string())}
    for name in extra:
        table[name] = pa.array([_text(columns.get(t, {}).get(META_PREFIX + name)) for t in ids], pa.string())
    out_file.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(table), out_file)


def _text(value: MetaValue | None) -> str | None:
    return None if value is None else value if isinstance(value, str) else canonical_json(value).decode()

