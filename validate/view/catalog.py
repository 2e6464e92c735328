"""Which runs the viewer can show, and the only way it opens a file.

A run is a directory holding a regular ``run.json``: each directory given on the command
line if it is one, else each of its children that is one, plus the smoke reruns nested in a
run (``smoke/<UTC time>/run/``). Nothing is ever reached through a symbolic link: a
symlinked run, file or directory under a run is skipped, and `open_inside` refuses any path
component that is one (checked with ``lstat``, the last opened with ``O_NOFOLLOW``). Every
file is opened read-only; the viewer writes nothing anywhere.

A run's key (its URL name) is its directory name, ``<run key>/smoke/<entry>`` for a nested
smoke rerun, suffixed ``~2``, ``~3`` … when two directories given share a name.
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

from validate.jsonio import JSONInputError, loads
from validate.paths import (
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
from validate.run_evidence import current_verdict
from validate.summary import RunSummary
from validate.verdicts import DatasetVerdict

#: The largest JSON file the viewer parses (a 1,000,000-task manifest is ~300 MB; run.json is small).
MAX_JSON_BYTES = 512 * 1024 * 1024


class NotInside(LookupError):
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


def read_json(root: Path, parts: Sequence[str]):
    with open_inside(root, parts) as fh:
        data = fh.read(MAX_JSON_BYTES + 1)
    return loads(data, max_bytes=MAX_JSON_BYTES)


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


def _load(key: str, root: Path, parent_key: str | None) -> RunEntry:
    entry = RunEntry(key=key, root=root, parent_key=parent_key)
    try:
        entry.summary = RunSummary.model_validate(read_json(root, [SUMMARY]))
    except ValidationError as e:
        first = e.errors()[0]
        entry.error = (f"{SUMMARY}: not a run summary this version reads ({'.'.join(map(str, first['loc']))}: "
                       f"{first['msg']}); older evidence is read by the version that wrote it")
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
            run_key = f"{key}/{SMOKE}/{name}" if is_plain_dir(nested) and is_plain_file(nested / SUMMARY) else None
            entry.smokes.append(Smoke(entry=name, result=result if isinstance(result, dict) else None, run_key=run_key))
    if is_plain_dir(root / REPORTS):
        for name in plain_children(root / REPORTS):
            files = [f for f in REPORT_FILES if is_plain_file(root / REPORTS / name / f)]
            if files:
                entry.reports[name] = files
    smokes = {s.entry: s.result for s in entry.smokes if s.result is not None}
    entry.verdict = current_verdict(entry.summary, smokes)
    return entry


def _signature(root: Path) -> tuple:
    """What changes when a run's top-level files or entries change (cache key): a phase, a
    smoke test and a report each end by renaming a fresh ``checksums`` into the root."""
    out = []
    for name in (".", SUMMARY, MANIFEST, FROZEN_MANIFEST, VARIANTS, SMOKE, REPORTS):
        st = _lstat(root / name)
        out.append(None if st is None else (st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class Catalog:
    """The runs under the given directories, rescanned on every call (a listing and a few
    ``lstat`` calls per run); each run's files are parsed again only when they change."""

    def __init__(self, dirs: Sequence[Path]) -> None:
        self.dirs = [Path(d).absolute() for d in dirs]
        self._cache: dict[Path, tuple[tuple, RunEntry]] = {}
        self._lock = threading.Lock()

    def _candidates(self) -> list[Path]:
        out: list[Path] = []
        for d in self.dirs:
            if is_plain_file(d / SUMMARY):
                out.append(d)
            else:
                out += [d / n for n in plain_children(d) if is_plain_file(d / n / SUMMARY)]
        return out

    def _entry(self, key: str, root: Path, parent_key: str | None = None) -> RunEntry:
        sig = _signature(root)
        with self._lock:
            hit = self._cache.get(root)
        if hit is not None and hit[0] == sig and hit[1].key == key:
            return hit[1]
        entry = _load(key, root, parent_key)
        with self._lock:
            self._cache[root] = (sig, entry)
        return entry

    def runs(self) -> dict[str, RunEntry]:
        """Every run by key: the given directories' runs in order, each followed by its smoke reruns."""
        out: dict[str, RunEntry] = {}
        for root in self._candidates():
            key, n = root.name, 1
            while key in out:
                n += 1
                key = f"{root.name}~{n}"
            entry = out[key] = self._entry(key, root)
            for smoke in entry.smokes:
                if smoke.run_key is not None:
                    out[smoke.run_key] = self._entry(smoke.run_key, root / SMOKE / smoke.entry / SMOKE_RUN, key)
        return out
