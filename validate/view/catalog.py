"""Which runs the viewer can show, and the only way it opens a file.

A dataset run is a directory holding a regular ``run.json``; a model evaluation one holding
``eval-contract.json`` (whatever else it holds, as `validate.evidence.summary.run_kind` reads it); a
comparison of two evaluations one holding ``compare.json``. The runs are each directory given
on the command line if it is one, else each of its children that is one, plus the smoke
reruns nested in a dataset run (``smoke/<UTC time>/run/``); comparisons are also looked for
two levels further down in the directories that are no run (``compare/<A>--<B>/<UTC time>/``,
where `validate compare` writes them). Nothing is ever reached through a symbolic link: a
symlinked run, file or directory under a run is skipped, and `open_inside` refuses any path
component that is one (checked with ``lstat``, the last opened with ``O_NOFOLLOW``). Every
file is opened read-only; the viewer writes nothing anywhere.

A run's key (its URL name) is its directory name, ``<run key>/smoke/<entry>`` for a nested
smoke rerun, a comparison's its path below the directory given (``compare/<A>--<B>/<time>``),
suffixed ``~2``, ``~3`` … when two directories given share a name.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError

from validate.core.errors import ContractError, InputError
from validate.core.jsonio import JSONInputError, loads
from validate.core.paths import (
    COMPARE_JSON,
    EVAL_CONTRACT,
    EVAL_SUMMARY,
    FROZEN_MANIFEST,
    MANIFEST,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    REPORTS,
    SMOKE,
    SMOKE_RESULT,
    SMOKE_RUN,
    SUMMARY,
    VARIANTS,
    RunPaths,
)
from validate.eval.compare import Comparison
from validate.eval.contract import EvalContract
from validate.eval.summary import EvalSummary
from validate.evidence.run import current_verdict
from validate.evidence.summary import RunSummary
from validate.evidence.verdicts import DatasetVerdict
from validate.report.profiles import ProfileComparison

#: The largest JSON file the viewer parses (a 1,000,000-task manifest is ~300 MB; run.json is small).
MAX_JSON_BYTES = 512 * 1024 * 1024


class NotInside(InputError):
    """The path is not a regular file reached without symlinks inside the run directory."""


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def is_plain_dir(path: Path) -> bool:
    st = _lstat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def is_plain_file(path: Path) -> bool:
    st = _lstat(path)
    return st is not None and stat.S_ISREG(st.st_mode)


def plain_children(path: Path, want_dir: bool = True) -> list[str]:
    """Names of `path`'s entries that are real directories (or regular files), sorted."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    test = is_plain_dir if want_dir else is_plain_file
    return [n for n in names if not n.startswith(".") and test(path / n)]


def resolve_inside(root: Path, parts: Sequence[str]) -> Path:
    """``root/parts…`` if each part is a plain name, no component is a symlink and the last
    is a regular file; else `NotInside`."""
    path = root
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\x00" in part:
            raise NotInside(f"not a plain file name: {part!r}")
        path = path / part
        st = _lstat(path)
        if st is None or stat.S_ISLNK(st.st_mode):
            raise NotInside(f"{'/'.join(parts)}: no such file")
    if not is_plain_file(path):
        raise NotInside(f"{'/'.join(parts)}: not a regular file")
    return path


def open_inside(root: Path, parts: Sequence[str]) -> BinaryIO:
    path = resolve_inside(root, parts)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise NotInside(f"{'/'.join(parts)}: cannot open ({e.strerror})") from None
    return os.fdopen(fd, "rb")


def read_bytes(root: Path, parts: Sequence[str]) -> bytes:
    with open_inside(root, parts) as fh:
        data = fh.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise NotInside(f"{'/'.join(parts)}: larger than {MAX_JSON_BYTES} bytes")
    return data


def read_json(root: Path, parts: Sequence[str]):
    return loads(read_bytes(root, parts), max_bytes=MAX_JSON_BYTES)


@dataclass(frozen=True)
class Contract:
    """What the viewer shows of a manifest: its name, hash and parent."""

    name: str
    sha256: str
    parent_sha256: str | None
    tasks: int


def _contract(root: Path, parts: Sequence[str]) -> Contract | None:
    try:
        m = read_json(root, parts)
        return Contract(name=str(m["name"]), sha256=str(m["sha256"]), parent_sha256=m.get("parent_sha256"),
                        tasks=len(m.get("tasks", ())))
    except (NotInside, JSONInputError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Smoke:
    """One ``smoke/<entry>/`` of a run: its result (None: it stopped before writing one)."""

    entry: str
    result: dict | None
    run_key: str | None = None


@dataclass
class RunEntry:
    key: str
    root: Path
    summary: RunSummary | None = None
    error: str | None = None
    contract: Contract | None = None
    frozen: Contract | None = None
    variants: dict[str, Contract] = field(default_factory=dict)
    smokes: list[Smoke] = field(default_factory=list)
    reports: dict[str, list[str]] = field(default_factory=dict)
    verdict: DatasetVerdict | None = None
    parent_key: str | None = None

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.root)

    @property
    def latest_smoke(self) -> Smoke | None:
        done = [s for s in self.smokes if s.result is not None]
        return done[-1] if done else None


REPORT_FILES = (REPORT_HTML, REPORT_MD, REPORT_JSON)


def _reports(root: Path) -> dict[str, list[str]]:
    out = {}
    if is_plain_dir(root / REPORTS):
        for name in plain_children(root / REPORTS):
            files = [f for f in REPORT_FILES if is_plain_file(root / REPORTS / name / f)]
            if files:
                out[name] = files
    return out


def _unreadable(name: str, e: Exception) -> str:
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        return (f"{name}: not what this version reads ({'.'.join(map(str, first['loc']))}: {first['msg']}); "
                "older evidence is read by the version that wrote it")
    return f"{name}: {e}"


@dataclass
class EvalEntry:
    """A model evaluation's run directory: its summary and contract (None: unreadable, see `error`)."""

    key: str
    root: Path
    summary: EvalSummary | None = None
    contract: EvalContract | None = None
    error: str | None = None
    reports: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class CompareEntry:
    """A comparison of two evaluations (one ``compare/<A>--<B>/<time>/`` entry)."""

    key: str
    root: Path
    comparison: Comparison | None = None
    error: str | None = None


def _load_eval(key: str, root: Path) -> EvalEntry:
    entry = EvalEntry(key=key, root=root)
    for name in (EVAL_SUMMARY, EVAL_CONTRACT):
        try:
            if name == EVAL_SUMMARY:
                entry.summary = EvalSummary.model_validate(read_json(root, [name]))
            else:
                entry.contract = EvalContract.parse(read_bytes(root, [name]), name)
        except (ValidationError, NotInside, JSONInputError, ContractError) as e:
            entry.summary, entry.error = None, _unreadable(name, e)
            return entry
    entry.reports = _reports(root)
    return entry


def _load_compare(key: str, root: Path) -> CompareEntry:
    try:
        return CompareEntry(key=key, root=root,
                            comparison=Comparison.model_validate(read_json(root, [COMPARE_JSON])))
    except (ValidationError, NotInside, JSONInputError) as e:
        return CompareEntry(key=key, root=root, error=_unreadable(COMPARE_JSON, e))


def _load(key: str, root: Path, parent_key: str | None) -> RunEntry:
    entry = RunEntry(key=key, root=root, parent_key=parent_key)
    try:
        entry.summary = RunSummary.model_validate(read_json(root, [SUMMARY]))
    except ValidationError as e:
        first = e.errors()[0]
        entry.error = (f"{SUMMARY}: not a run summary this version reads "
                       f"({'.'.join(map(str, first['loc']))}: {first['msg']}); older evidence is read by the "
                       "version that wrote it")
        return entry
    except (NotInside, JSONInputError) as e:
        entry.error = f"{SUMMARY}: {e}"
        return entry
    entry.contract = _contract(root, [MANIFEST])
    entry.frozen = _contract(root, [FROZEN_MANIFEST])
    if is_plain_dir(root / VARIANTS):
        for name in plain_children(root / VARIANTS, want_dir=False):
            if name.endswith(".json") and (c := _contract(root, [VARIANTS, name])) is not None:
                entry.variants[name[:-len(".json")]] = c
    if is_plain_dir(root / SMOKE):
        for name in plain_children(root / SMOKE):
            try:
                result = read_json(root, [SMOKE, name, SMOKE_RESULT])
            except (NotInside, JSONInputError):
                result = None
            nested = root / SMOKE / name / SMOKE_RUN
            run_key = (
                f"{key}/{SMOKE}/{name}" if is_plain_dir(nested) and is_plain_file(nested / SUMMARY) else None
            )
            entry.smokes.append(Smoke(entry=name, result=result if isinstance(result, dict) else None,
                                      run_key=run_key))
    entry.reports = _reports(root)
    smokes = {s.entry: s.result for s in entry.smokes if s.result is not None}
    entry.verdict = current_verdict(entry.summary, smokes)
    return entry


def _signature(root: Path) -> tuple:
    """What changes when a run's top-level files or entries change (cache key): a phase, a
    smoke test and a report each end by renaming a fresh ``checksums`` into the root."""
    out = []
    for name in (".", SUMMARY, MANIFEST, FROZEN_MANIFEST, VARIANTS, SMOKE, REPORTS, EVAL_SUMMARY,
                 EVAL_CONTRACT, COMPARE_JSON):
        st = _lstat(root / name)
        out.append(None if st is None else (st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


EVAL, RUN, COMPARE = "eval", "run", "compare"


def _kind(path: Path) -> str | None:
    """What the directory holds: an eval run, a dataset run, a comparison, or none of them."""
    if is_plain_file(path / EVAL_CONTRACT):
        return EVAL
    if is_plain_file(path / SUMMARY):
        return RUN
    return COMPARE if is_plain_file(path / COMPARE_JSON) and not _profile_comparison(path) else None


def _profile_comparison(path: Path) -> bool:
    """A `validate compare-profiles` entry holds a compare.json too, of another document
    (`validate.report.profiles.ProfileComparison`): it is no evaluation comparison, so it is not
    listed as one (told apart by the document's own fields, not by where it lies)."""
    try:
        ProfileComparison.model_validate(read_json(path, [COMPARE_JSON]))
    except (ValidationError, NotInside, JSONInputError):
        return False
    return True


@dataclass
class Listing:
    """Everything the viewer shows, by key (one key space: no two entries share a key)."""

    runs: dict[str, RunEntry] = field(default_factory=dict)
    evals: dict[str, EvalEntry] = field(default_factory=dict)
    compares: dict[str, CompareEntry] = field(default_factory=dict)

    def taken(self, key: str) -> bool:
        return key in self.runs or key in self.evals or key in self.compares

    def root(self, key: str) -> Path | None:
        entry = self.runs.get(key) or self.evals.get(key) or self.compares.get(key)
        return None if entry is None else entry.root


class Catalog:
    """The runs under the given directories, rescanned on every call (a listing and a few
    ``lstat`` calls per run); each run's files are parsed again only when they change."""

    def __init__(self, dirs: Sequence[Path]) -> None:
        self.dirs = [Path(d).absolute() for d in dirs]
        self._cache: dict[Path, tuple[tuple, RunEntry | EvalEntry | CompareEntry]] = {}
        self._lock = threading.Lock()

    def _candidates(self) -> list[tuple[str, Path, str]]:
        """(kind, directory, key) of every run and comparison, in the order of the directories given."""
        out: list[tuple[str, Path, str]] = []
        for d in self.dirs:
            kind = _kind(d)
            if kind is not None:
                out.append((kind, d, d.name))
            else:
                self._walk(d, [], out)
        return out

    def _walk(self, d: Path, rel: list[str], out: list, depth: int = 0) -> None:
        for name in plain_children(d):
            kind = _kind(d / name)
            if kind is not None and (depth == 0 or kind == COMPARE):
                out.append((kind, d / name, "/".join([*rel, name])))
            elif kind is None and depth < 2:  # never into a run: its replies are thousands of files
                self._walk(d / name, [*rel, name], out, depth + 1)

    def _entry(self, kind: str, key: str, root: Path, parent_key: str | None = None):
        sig = _signature(root)
        with self._lock:
            hit = self._cache.get(root)
        if hit is not None and hit[0] == (kind, sig) and hit[1].key == key:
            return hit[1]
        entry = (_load_eval(key, root) if kind == EVAL else _load_compare(key, root) if kind == COMPARE
                 else _load(key, root, parent_key))
        with self._lock:
            self._cache[root] = ((kind, sig), entry)
        return entry

    def scan(self) -> Listing:
        """Every run and comparison by key: the given directories' in order, each dataset run
        followed by its smoke reruns."""
        out = Listing()
        for kind, root, base in self._candidates():
            key, n = base, 1
            while out.taken(key):
                n += 1
                key = f"{base}~{n}"
            if kind == EVAL:
                out.evals[key] = self._entry(kind, key, root)
            elif kind == COMPARE:
                out.compares[key] = self._entry(kind, key, root)
            else:
                entry = out.runs[key] = self._entry(kind, key, root)
                for smoke in entry.smokes:
                    if smoke.run_key is not None:
                        nested = root / SMOKE / smoke.entry / SMOKE_RUN
                        out.runs[smoke.run_key] = self._entry(RUN, smoke.run_key, nested, key)
        return out

    def runs(self) -> dict[str, RunEntry]:
        """Every dataset run by key (`scan` has the evaluations and comparisons too)."""
        return self.scan().runs
