"""Evidence on disk: an append-only journal while running, Parquet when done, checksums last.

Nothing is lost on a crash: each finished attempt is appended to ``journal.jsonl`` and
fsynced before the next is handed out; a line cut short by a crash is dropped on reading
(its attempt is simply rerun by ``--resume``). Parquet files are written whole to a temp
file and renamed, so none is ever half-written. `fold` folds the journal into
``attempts.parquet`` (marking superseded attempts); `write_verdicts`, the run summary and
`write_checksums` (``sha256sum -c`` format) follow (`validate.run.lifecycle.Run` orders them).

Every reply's whole bytes are kept in ``replies/<hex>``, named by their sha256 (the
attempt's ``reply_sha256``): written atomically and fsynced *before* the attempt's journal
line, so a journalled attempt's reply is never lost; identical replies are stored once;
nothing is held in memory. ``reply_text`` in attempts.parquet is only its capped head, for
people; the audit re-scores from these bytes.

A report names the files it was rendered from (``report.json``'s ``ledgers``: path → sha256).
A resume rewrites some of them, so `open_run` first copies the set a report names into
``earlier/<key>/`` (`keep_earlier`), sealed with the rest; `ledger_source` finds a report's
set again — the run's own files, or that copy — so the audit can re-render it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Generic, TypeVar, get_args

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError

from validate.core.errors import EvidenceError
from validate.core.paths import EARLIER, REPORT_JSON, RunPaths
from validate.core.records import (
    EXACT,
    EXCLUDED,
    PLACEMENT,
    TRIAL,
    VERDICT_TRIAL,
    Attempt,
    Exclusion,
    Status,
    TaskVerdict,
    arrow_schema,
    flat_row,
    unflatten,
    verdict_of_row,
)
from validate.evidence.verdicts import Outcome, by_task, outcomes_of

# Arrow's default allocator in its wheels (mimalloc) keeps what each of Arrow's reader threads
# allocated: streaming a run's attempts back in batches left ~50 MB more resident in the
# driver than the C library's allocator does, for no gain at these sizes (measured in
# docs/performance.md, "ray executor"). It is the whole process's default pool (any Arrow user in a
# process that imports validate); a user's own ARROW_DEFAULT_MEMORY_POOL still decides.
if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
    pa.set_memory_pool(pa.system_memory_pool())

BATCH_ROWS = 1000
#: How many tasks' outcomes `Journal.outcomes_by_task` holds at once from a folded run.
JUDGED_TOGETHER = 1000
#: The columns of attempts.parquet a verdict reads: (phase, task id) and an `Outcome`'s fields
#: (the `EXACT` ones only where a run has them: `outcome_columns`).
OUTCOME_COLUMNS = ("phase", "task_id", *Outcome._fields)


def outcome_columns(source: pq.ParquetFile) -> list[str]:
    """The `OUTCOME_COLUMNS` `source` holds: all but the `EXACT` and `TRIAL` ones it was written without."""
    names = set(source.schema_arrow.names)
    return [c for c in OUTCOME_COLUMNS if c not in (*EXACT, *TRIAL) or c in names]
STATUSES = frozenset(get_args(Status))

M = TypeVar("M", bound=BaseModel)


@contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success fsync it, make it 0644 and rename it over
    `path`; on any failure remove it (the old file stays whole) and name `path` in the error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        tmp.chmod(0o644)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise EvidenceError(f"{path}: cannot write ({e.strerror or e})") from None
        raise


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same directory and a rename."""
    with _replacing(path) as tmp:
        tmp.write_bytes(data)


def write_parquet(path: Path, rows: Iterable[dict], schema: pa.Schema) -> int:
    """Stream `rows` into `path` in batches, atomically; returns the row count."""
    n = 0
    with _replacing(path) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        batch: list[dict] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= BATCH_ROWS:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                n, batch = n + len(batch), []
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        n += len(batch)
    return n


def reply_path(paths: RunPaths, reply_sha256: str) -> Path:
    """Where a reply with this ``sha256:<hex>`` tag is stored."""
    return paths.replies / reply_sha256.removeprefix("sha256:")


def store_reply(paths: RunPaths, data: bytes) -> str:
    """Keep `data` under its sha256 (once: an existing file of that name holds these bytes,
    which the seal and the audit check); return its ``sha256:<hex>`` tag."""
    tag = "sha256:" + hashlib.sha256(data).hexdigest()
    path = reply_path(paths, tag)
    if not path.is_file():
        atomic_write(path, data)
        # The journal line that names this reply is fsynced next: the directory entry must be
        # on disk first, or a crash could keep the line and lose the file.
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return tag


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()  # a link to a file is one (its target is hashed)
    except OSError:  # a link that loops, or one that cannot be followed, is not
        return False


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)  # a link to a directory is not walked
    except OSError:
        return False


def sealed_names(paths: RunPaths) -> list[str]:
    """The names (relative, ``/``-separated) of every file the checksums cover: all but the
    checksums, their signature and dot-files (the live journal's temp files), in the order of
    their paths (part by part: ``a/b`` before ``a.b``). Only the names are held (a 10,000-task
    pool's run directory is tens of thousands of files)."""
    skip = {paths.checksums, paths.signature}
    keys: list[str] = []  # the parts joined by NUL, which sorts below every character of a name
    todo: list[tuple[str, ...]] = [()]
    while todo:
        parts = todo.pop()
        where = paths.root.joinpath(*parts)
        try:
            # an entry at a time: replies/ alone is ~20,000 at 10,000 tasks
            with os.scandir(where) as listing:
                for entry in listing:
                    if _is_dir(entry):
                        todo.append((*parts, entry.name))
                    elif (_is_file(entry) and not entry.name.startswith(".")
                          and where / entry.name not in skip):
                        keys.append("\0".join((*parts, entry.name)))
        except OSError as e:
            raise EvidenceError(f"{where}: cannot list it to seal the run ({e.strerror or e})") from None
    keys.sort()
    for i, key in enumerate(keys):  # in place: one list of names is held, not two
        keys[i] = key.replace("\0", "/")
    return keys


def sealed_files(paths: RunPaths) -> list[Path]:
    """Every file the checksums cover, as `sealed_names` orders them."""
    return [paths.root / name for name in sealed_names(paths)]


def write_checksums(paths: RunPaths) -> None:
    """``checksums.sha256`` of every sealed file, written a line at a time."""
    with _replacing(paths.checksums) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as out:
        for name in sealed_names(paths):
            try:
                digest = file_sha256(paths.root / name)
            except OSError as e:
                raise EvidenceError(f"{paths.root / name}: cannot hash it to seal the run "
                                    f"({e.strerror or e})") from None
            out.write(f"{digest}  {name}\n")
    paths.signature.unlink(missing_ok=True)  # it signed the old checksums


def new_entry(parent: Path) -> Path:
    """A fresh directory ``parent/<UTC time>`` (suffixed if that exists): evidence appended,
    never overwritten."""
    from datetime import UTC, datetime

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        entry = parent / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            entry.mkdir()
            return entry
        except FileExistsError:
            continue
    raise EvidenceError(f"{parent}: cannot make a new entry")


def open_run(paths: RunPaths, manifest_json: bytes) -> None:
    """Create the run directory with its manifest copy, or check that a resumed run's matches
    (and keep the ledgers its reports were rendered from, which the resume will rewrite)."""
    paths.root.mkdir(parents=True, exist_ok=True)
    if paths.manifest.exists():
        if paths.manifest.read_bytes() != manifest_json:
            raise EvidenceError(f"{paths.manifest}: this run directory was made with another manifest; "
                                f"resume it with that manifest or start a new run directory")
        keep_earlier(paths)
        return
    atomic_write(paths.manifest, manifest_json)



def ledger_key(ledgers: dict[str, str]) -> str:
    """The name of a set of input files (path → sha256): the sha256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(ledgers, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _matches(base: Path, ledgers: dict[str, str]) -> bool:
    return all((base / name).is_file() and file_sha256(base / name) == digest
               for name, digest in ledgers.items())


def _safe(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts and parts[0] != EARLIER


def ledger_source(paths: RunPaths, ledgers: dict[str, str]) -> Path | None:
    """Where a report's input files are now, each with its recorded sha256: the run directory
    itself, or the copy kept at a resume; None if neither holds them all."""
    if not ledgers or not all(_safe(n) for n in ledgers):
        return None
    for base in (paths.root, paths.earlier / ledger_key(ledgers)):
        if base.is_dir() and _matches(base, ledgers):
            return base
    return None


def keep_earlier(paths: RunPaths) -> None:
    """Copy every input set a report names that the run directory holds now into
    ``earlier/<key>/`` (same relative paths), before a resume rewrites it. Copies, not moves:
    the resume reads attempts.parquet to continue. The copy is sealed by the next checksums."""
    for record in sorted(paths.reports.glob(f"*/{REPORT_JSON}")) if paths.reports.is_dir() else []:
        try:
            ledgers = json.loads(record.read_bytes()).get("ledgers")
        except (OSError, ValueError, AttributeError):
            continue  # an unreadable report is the audit's finding, not the resume's
        if not isinstance(ledgers, dict) or not all(_safe(n) for n in ledgers):
            continue
        dest = paths.earlier / ledger_key(ledgers)
        if dest.exists() or not _matches(paths.root, ledgers):
            continue
        tmp = dest.with_name(f".{dest.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for name in ledgers:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(paths.root / name, tmp / name)
        os.replace(tmp, dest)  # whole or absent: a crash leaves only a dot-directory


class AppendLog(Generic[M]):
    """An append-only JSON-lines file of one record model: each append is written whole through
    one unbuffered handle and fsynced before it returns; a line cut short by a crash (or a full
    disk) is dropped on reading, and the next append starts on a fresh line. The one way the
    harness journals what it must not lose (attempts; an eval's samples and turns)."""

    def __init__(self, path: Path, model: type[M]) -> None:
        self.path, self.model = path, model
        self._lock = threading.Lock()
        self._fh = None

    def append(self, records: Sequence[M]) -> None:
        data = b"".join(r.model_dump_json().encode() + b"\n" for r in records)
        with self._lock:
            try:
                if self._fh is None:
                    # Unbuffered: a failed write leaves nothing queued to fail again on close.
                    self._fh = open(self.path, "ab", buffering=0)
                    if self._fh.tell() and not _ends_with_newline(self.path):
                        data = b"\n" + data  # a crash cut the last line: start on a fresh one
                view = memoryview(data)
                while view:
                    view = view[self._fh.write(view):]
                os.fsync(self._fh.fileno())
            except OSError as e:
                raise EvidenceError(f"{self.path}: cannot append ({e.strerror or e})") from None

    def read(self) -> Iterator[M]:
        """Every whole line's record, in the order appended."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            for line in fh:
                try:
                    yield self.model.model_validate_json(line)
                except ValidationError:
                    continue  # the last line of a crashed run, cut short: that record is made again

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                try:
                    self._fh.close()
                except OSError:
                    pass  # unbuffered: nothing was pending
                self._fh = None


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


class _Keys:
    """(phase, task, agent, sample[, try]) of an attempt as one int: each name numbered the first
    time it is seen, the numbers packed 32 bits apart. A 10,000-task pool's 80,000 keys cost a
    few MB this way, where tuples of the names' strings cost tens."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def _id(self, name: str) -> int:
        return self.ids.setdefault(name, len(self.ids))

    def of(self, a: Attempt, attempt: int = 0) -> int:
        fields = (self._id(a.phase), self._id(a.task_id), self._id(a.agent), a.sample, attempt)
        key = 0
        for f in fields:
            if not 0 <= f < 1 << 32:
                raise EvidenceError(f"attempt {a.phase}/{a.task_id}/{a.agent}: a sample or try "
                                    "number out of range")
            key = key << 32 | f
        return key


class Journal:
    """The run's attempts: those already in Parquet plus those appended since.

    Reading streams: rows are parsed one batch at a time and never all held at once; only
    the set of (phase, task, agent, attempt) keys is remembered, to drop duplicates.
    """

    def __init__(self, paths: RunPaths, metric_names: tuple[str, ...] = ()) -> None:
        self.paths = paths
        self.metric_names = metric_names
        self._log = AppendLog(paths.journal, Attempt)
        #: Some attempt read or appended names the cluster node it ran on (its `PLACEMENT`
        #: columns are written).
        self.placed = False
        #: Some attempt read or appended is a trial (its `TRIAL` columns are written).
        self.trialled = False
        #: Some attempt read holds a reward's exact text (its `EXACT` columns are written).
        self.exact = False

    def __iter__(self) -> Iterator[Attempt]:
        """Every recorded attempt once, in the order recorded (the ``superseded`` flag as stored).
        Each source holds an attempt once; only a fold cut short (Parquet written, the journal
        not yet removed) leaves one in both, so keys are remembered only when both are there."""
        both = (self.paths.attempts.exists() and self.paths.journal.exists()
                and self.paths.journal.stat().st_size > 0)
        keys, seen = _Keys(), set()
        for a in itertools.chain(self._from_parquet(), self._from_journal()):
            if both:
                key = keys.of(a, a.attempt)
                if key in seen:
                    continue
                seen.add(key)
            self.placed = self.placed or a.node is not None
            self.trialled = self.trialled or a.trial is not None
            self.exact = self.exact or a.reward_decimal is not None
            yield a

    def existing(self) -> list[Attempt]:
        """Every recorded attempt, superseded ones flagged (for small runs and tests)."""
        return list(self.marked())

    def latest(self) -> dict[tuple[str, str, str, int], int]:
        """The highest attempt number of each (phase, task, agent, sample)."""
        out: dict[tuple[str, str, str, int], int] = {}
        for a in self:
            key = (a.phase, a.task_id, a.agent, a.sample)
            out[key] = max(out.get(key, 0), a.attempt)
        return out

    def marked(self) -> Iterator[Attempt]:
        """Every attempt with ``superseded`` set: a later try of the same (phase, task, agent,
        sample) exists. Two passes over the evidence; what is held meanwhile is one small int
        (`_Keys`) and its latest try for each (phase, task, agent, sample) tried more than once,
        not the attempts (a try numbered 1 is the latest unless another is held)."""
        keys, latest = _Keys(), {}
        for a in self:
            if a.attempt > 1:
                key = keys.of(a)
                if a.attempt > latest.get(key, 1):
                    latest[key] = a.attempt
        for a in self:
            superseded = bool(latest) and a.attempt < latest.get(keys.of(a), 1)
            yield a if a.superseded == superseded else a.model_copy(update={"superseded": superseded})

    def outcomes(self) -> Iterator[tuple[str, str, Outcome]]:
        """(phase, task id, outcome) of every recorded attempt, superseded ones included. A
        folded run (no journal left) is read from attempts.parquet's `OUTCOME_COLUMNS` alone, not
        as whole attempts (at the end of a 10,000-task pool, parsing every attempt's logs and
        reply head cost the driver ~40 MB more). Equal outcomes are one object (most of a pool's
        are alike)."""
        if not self._folded():
            yield from _shared(outcomes_of(self))
            return
        try:
            yield from _shared(self._outcome_triples(self._outcome_source()))
        except (OSError, KeyError, TypeError, pa.ArrowException) as e:
            raise EvidenceError(f"{self.paths.attempts}: unreadable as attempts ({e})") from None

    def outcomes_by_task(self, phases: Collection[str], task_ids: Iterable[str]) -> Iterator[list[Outcome]]:
        """Each of `task_ids`' outcomes in `phases`, in their order, superseded tries included:
        what the verdicts are judged from (a `validate.evidence.verdicts.TaskOutcomes`). From a folded run,
        the outcomes of at most `JUDGED_TOGETHER` tasks are held at once, so the driver judging a
        10,000-task pool holds what it holds for 1,000 (grouping all 80,000 outcomes first had
        left ~8 MB more resident at its end). The journal of a run still playing is read once
        and grouped whole (`by_task`): reading it again per group would parse every attempt again."""
        if not self._folded():
            yield from by_task(self.outcomes())(phases, task_ids)
            return
        source = self._outcome_source()
        try:
            ids, wanted = pa.array(list(task_ids), pa.string()), pa.array(list(phases), pa.string())
            for name in ("phase", "task_id"):  # matched in Arrow, which would match b"t1" or 7 to "t1" or "7"
                kind = source.schema_arrow.field(name).type
                kind = kind.value_type if pa.types.is_dictionary(kind) else kind
                if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                    raise EvidenceError(f"{self.paths.attempts}: unreadable as attempts (its {name} column "
                                        f"holds {kind}, not text)")
            # Where each row group's rows go: their tasks' positions among `ids` (null: not asked
            # for). A run's attempts are recorded roughly in task order, so each group of tasks
            # reads the few row groups that hold its rows, and the whole file is read about twice.
            # Every row is checked on this first reading, as `outcomes` checks it, asked for or not.
            where = []
            columns = outcome_columns(source)
            for g in range(source.num_row_groups):
                rows = source.read_row_group(g, columns=columns)
                for _ in _shared(self._triples(rows)):
                    pass
                asked = pc.is_in(rows.column("phase"), value_set=wanted)
                where.append(pc.if_else(asked, pc.index_in(rows.column("task_id"), value_set=ids), None))
            spans = [pc.min_max(w).as_py() for w in where]
            for first in range(0, len(ids), JUDGED_TOGETHER):
                last = min(first + JUDGED_TOGETHER, len(ids))
                held: list[list[Outcome]] = [[] for _ in range(first, last)]
                share = _sharing()
                for g, span in enumerate(spans):
                    if span["min"] is None or span["max"] < first or span["min"] >= last:
                        continue
                    inside = pc.and_(pc.greater_equal(where[g], first), pc.less(where[g], last))
                    rows = source.read_row_group(g, columns=columns).filter(inside)
                    for at, outcome in zip(where[g].filter(inside).to_pylist(), self._outcomes_of_rows(rows),
                                           strict=True):
                        held[at - first].append(share(outcome))
                yield from held
        except (OSError, KeyError, TypeError, pa.ArrowException) as e:
            raise EvidenceError(f"{self.paths.attempts}: unreadable as attempts ({e})") from None

    def _folded(self) -> bool:
        """Only attempts.parquet holds the run's attempts (the journal was folded into it)."""
        journal = self.paths.journal
        return self.paths.attempts.exists() and not (journal.exists() and journal.stat().st_size > 0)

    def _outcome_source(self) -> pq.ParquetFile:
        try:
            return pq.ParquetFile(self.paths.attempts)
        except (OSError, pa.ArrowException) as e:
            raise EvidenceError(f"{self.paths.attempts}: unreadable as attempts ({e})") from None

    def _outcome_triples(self, source: pq.ParquetFile) -> Iterator[tuple[str, str, Outcome]]:
        for rows in source.iter_batches(batch_size=BATCH_ROWS, columns=outcome_columns(source)):
            yield from self._triples(rows)

    def _triples(self, rows: pa.Table | pa.RecordBatch) -> Iterator[tuple[str, str, Outcome]]:
        """(phase, task id, outcome) of each row of attempts.parquet's `OUTCOME_COLUMNS`, checked."""
        return zip(rows.column("phase").to_pylist(), rows.column("task_id").to_pylist(),
                   self._outcomes_of_rows(rows), strict=True)

    def _outcomes_of_rows(self, rows: pa.Table | pa.RecordBatch) -> Iterator[Outcome]:
        """The `Outcome` of each row of attempts.parquet's `OUTCOME_COLUMNS`, checked."""
        held = set(rows.schema.names)
        columns = [rows.column(name).to_pylist() if name in held else [None] * rows.num_rows
                   for name in OUTCOME_COLUMNS]
        for (phase, task_id, agent, attempt, status, reward, error_class, error_message, sample, decimal,
             shared, planted) in zip(*columns, strict=True):
            if status not in STATUSES or not isinstance(attempt, int) or not isinstance(sample, int):
                raise EvidenceError(f"{self.paths.attempts}: attempt {phase}/{task_id}/{agent}: not an "
                                    f"attempt's status, try or sample ({status!r}, {attempt!r}, {sample!r})")
            if decimal is not None and not isinstance(decimal, str):
                raise EvidenceError(f"{self.paths.attempts}: attempt {phase}/{task_id}/{agent}: its "
                                    f"reward_decimal {decimal!r} is not text")
            yield Outcome(sys.intern(agent), attempt, sys.intern(status), reward,
                          None if error_class is None else sys.intern(error_class), error_message, sample,
                          decimal, shared, planted)

    def _from_parquet(self) -> Iterator[Attempt]:
        if not self.paths.attempts.exists():
            return
        try:
            source = pq.ParquetFile(self.paths.attempts)
            for batch in source.iter_batches(batch_size=BATCH_ROWS):
                for row in batch.to_pylist():
                    yield Attempt.model_validate(unflatten(row))
        except (OSError, pa.ArrowException, ValidationError) as e:
            raise EvidenceError(f"{self.paths.attempts}: unreadable ({e})") from None

    def _from_journal(self) -> Iterator[Attempt]:
        return self._log.read()

    def append(self, attempts: list[Attempt]) -> None:
        self._log.append(attempts)

    def close(self) -> None:
        self._log.close()


def _sharing() -> Callable[[Outcome], Outcome]:
    """Each outcome given, or the equal one given before it (most of a pool's are alike)."""
    shared: dict[tuple[Outcome, bool], Outcome] = {}
    return lambda o: shared.setdefault(_signed(o), o)


def _shared(triples: Iterable[tuple[str, str, Outcome]]) -> Iterator[tuple[str, str, Outcome]]:
    """(phase, task id, outcome) triples, the phases and equal outcomes shared."""
    share = _sharing()
    for phase, task_id, o in triples:
        yield sys.intern(phase), task_id, share(o)


def _signed(o: Outcome) -> tuple[Outcome, bool]:
    # -0.0 == 0.0 and hashes alike: the sign is part of the key so no reward is changed.
    return o, o.reward is not None and math.copysign(1.0, o.reward) < 0


def write_table(path: Path, records: Iterable[BaseModel], model: type[BaseModel],
                metric_names: tuple[str, ...] = (), omit: tuple[str, ...] = ()) -> int:
    return write_parquet(path, (flat_row(r, metric_names) for r in records),
                         arrow_schema(model, metric_names, omit=omit))


def fold(journal: Journal) -> None:
    """Fold the journal into attempts.parquet (streamed, superseded attempts flagged)."""
    journal.close()
    marked = journal.marked()
    # `marked` reads every attempt once (the latest tries) before it yields the first, so by then
    # the journal knows whether any ran on a cluster node: only then are the placement columns kept.
    first = next(marked, None)
    rows = (flat_row(a, journal.metric_names) for a in itertools.chain([first] if first else [], marked))
    omit = (() if journal.placed else PLACEMENT) + (() if journal.trialled else TRIAL) + \
        (() if journal.exact else EXACT)
    write_parquet(journal.paths.attempts, rows, arrow_schema(Attempt, journal.metric_names, omit=omit))
    journal.paths.journal.unlink(missing_ok=True)


def write_verdicts(paths: RunPaths, verdicts: Iterable[TaskVerdict]) -> StoredVerdicts:
    """Stream `verdicts` into tasks.parquet and the excluded ones into exclusions.parquet; the
    verdicts as stored (never all held: a 10,000-task pool's verdicts are tens of MB)."""
    verdicts = iter(verdicts)
    first = next(verdicts, None)
    omit = VERDICT_TRIAL if first is None or first.oracle_certified is None else ()
    write_table(paths.tasks, itertools.chain([first] if first is not None else [], verdicts), TaskVerdict,
                omit=omit)
    stored = StoredVerdicts(paths.tasks)
    exclusions = (Exclusion(run_id=v.run_id, phase=v.phase, task_id=v.task_id, idx=v.idx,
                            task_hash=v.task_hash, reason=v.reason, detail=v.detail)
                  for v in stored if v.verdict == EXCLUDED)
    write_table(paths.exclusions, exclusions, Exclusion)
    return stored


class StoredVerdicts(Sequence[TaskVerdict]):
    """A run's verdicts as tasks.parquet holds them, read a batch at a time on each pass."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._len = pq.ParquetFile(path).metadata.num_rows

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[TaskVerdict]:
        source = pq.ParquetFile(self.path)
        for batch in source.iter_batches(batch_size=BATCH_ROWS):
            for row in batch.to_pylist():
                yield verdict_of_row(row)

    def __getitem__(self, i):  # a Sequence's; whole passes are what the conclusions make
        if isinstance(i, slice):
            return list(itertools.islice(self, *i.indices(self._len)))
        if not -self._len <= i < self._len:
            raise IndexError(i)
        return next(itertools.islice(self, i % self._len, None))


def write_json(path: Path, model: BaseModel) -> None:
    atomic_write(path, model.model_dump_json(indent=2).encode() + b"\n")


def read_attempts(paths: RunPaths) -> list[Attempt]:
    """Every attempt of a run directory (finished or not), superseded ones flagged."""
    return Journal(paths).existing()
