"""Package a validated task-directory dataset (protocol step 5): ``validate package RUN --out DIR``.

The package is a Harbor dataset directory that holds exactly what the run certified:

- every retained (``compatible``) task directory, its files byte for byte as validated (the
  dataset the contract froze, found by its revision; each copy's hash is checked against the
  contract's before anything else is written); a dataset frozen with offline patches
  (``--patches``) is served patched by its environment, and the contract's hashes are the
  patched tasks', so the package holds the tasks as validated, patches applied;
- ``exclusions.json``: the run's exclusion ledger, canonical JSON;
- ``README.md``: the dataset card, rendered from the evidence (`validate.taskdir.package_card`);
- ``package.json``: the hash manifest — every other file's sha256 by relative path, sorted,
  the package's own dataset revision, and the run, contract and source revision it came
  from; canonical JSON, so `verify_package` recomputes it byte for byte.

Harbor (and this harness's loader) treats every directory under the dataset as a task and
ignores its top-level files, so the package loads as the retained tasks and nothing else.
With ``--format parquet`` the retained tasks are instead one Parquet file in the shape
datasets are published in (`environment.harbor.published`: a row per task, the directory
packed in ``task_binary``, the row's own public columns kept), read back before anything
else is written and held to the contract's hashes; the package then loads as a published
dataset (a folder of Parquet files), and can be uploaded as it is.

Refused, each naming the reason: a run that is not sealed (no ``checksums``: it never
finished), a run whose audit fails, a run that is not of a task-directory dataset, an
``--out`` that exists and is not empty.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from environment.harbor.published import (
    is_published,
    open_source,
    parquet_files,
    unpack_source,
    write_published,
)
from environment.harbor.taskdir import HarborTask, InvalidTask, load_dataset, load_task
from environment.protocol import LoadHints, canonical_json, sha256_tag
from validate.contract.manifest import Manifest, check_environment, load_manifest
from validate.core.errors import ValidateError
from validate.core.jsonio import JSONInputError, loads
from validate.core.paths import RunPaths
from validate.evidence.journal import atomic_write, file_sha256
from validate.evidence.run import load_run
from validate.taskdir.package_card import card, exclusion_ledger, retained_ids

HASH_MANIFEST = "package.json"
EXCLUSIONS = "exclusions.json"
CARD = "README.md"
SCHEMA_VERSION = 1
#: The published shape's one file in a package (`--format parquet`), where Hub datasets keep it.
PARQUET = "data/train-00000-of-00001.parquet"
FORMATS = ("directories", "parquet")


def copy_task(src: Path, dest: Path) -> None:
    """Copy a task directory byte for byte (modes kept; a symlink stays a symlink)."""
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        rel = Path(dirpath).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in sorted(filenames) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            shutil.copy2(Path(dirpath) / name, dest / rel / name, follow_symlinks=False)


def materialise(taskset, task_ids: Sequence[str], expected: dict[str, str], dest: Path) -> None:
    """Write the tasks `task_ids` of `taskset` (a task-directory dataset) under `dest`, each
    checked to hash as the contract froze it (`expected`: id → hash)."""

    by_id = {taskset.task(i).id: taskset.task(i) for i in range(taskset.size)}
    for tid in sorted(task_ids):
        task = by_id.get(tid)
        if task is None:
            raise ValidateError(f"package: task {tid} is not in the dataset the contract froze")
        copy_task(taskset.task_dir(task), dest / tid)
        got = load_task(dest, tid).hash
        if got != expected.get(tid):
            raise ValidateError(f"package: the copy of task {tid} hashes to {got}, the contract froze "
                                f"{expected.get(tid)}")


def file_hashes(root: Path, skip: Iterable[str] = (HASH_MANIFEST,)) -> dict[str, str]:
    """Every file under `root` (symlinks by their target) → its sha256 tag, by sorted relative path."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel in skip:
            continue
        if p.is_symlink():
            out[rel] = sha256_tag(f"symlink:{os.readlink(p)}".encode())
        elif p.is_file():
            out[rel] = "sha256:" + file_sha256(p)
    return dict(sorted(out.items()))


def package_revision(root: Path) -> str:
    """The package's dataset revision, as the harbor environment names it when it loads the
    package: a directory of tasks', or a published shape's (its Parquet files')."""
    if is_published(root):
        return open_source(parquet_files(root), "parquet", str(root)).revision()
    return load_dataset(root).revision


def hash_manifest(root: Path, source: dict[str, str]) -> bytes:
    """``package.json``'s bytes: the files' hashes, the package's revision, where it came from."""

    return canonical_json({"schema_version": SCHEMA_VERSION, "revision": package_revision(root),
                           "source": dict(sorted(source.items())), "files": file_hashes(root)})


def publish(staging: Path, ids: Sequence[str], expected: dict[str, str], taskset, out: Path) -> None:
    """The tasks `ids` materialised in `staging` written to ``out/`` `PARQUET` in the published
    shape (each row's own public columns kept), then read back as any published dataset is:
    every task must unpack to the hash the contract froze."""
    tasks = {t.id: t for t in (taskset.task(i) for i in range(taskset.size)) if t.id in set(ids)}
    columns = getattr(taskset, "columns", {})
    write_published(staging, list(ids), out / PARQUET, {t: tasks[t].prompt for t in ids}, columns)
    files = parquet_files(out)
    _, back, _ = unpack_source(open_source(files, "parquet", str(out)), files)
    every: list[HarborTask | InvalidTask] = [*back.tasks, *back.invalid]
    got = {t.id: t.hash for t in every}
    wrong = [t for t in ids if got.get(t) != expected.get(t)]
    if wrong or len(got) != len(ids):
        raise ValidateError(f"package: {PARQUET} does not unpack to the tasks the contract "
                            f"froze ({wrong[:3]})")


def verify_package(root: Path) -> list[str]:
    """Every way the package at `root` differs from its own hash manifest (empty: it verifies)."""

    try:
        said = loads((root / HASH_MANIFEST).read_bytes())
    except (OSError, JSONInputError) as e:
        return [f"{root / HASH_MANIFEST}: not readable ({e})"]
    files = file_hashes(root)
    problems = [f"{rel}: sha256 {files.get(rel)} is not the manifest's {h}"
                for rel, h in said.get("files", {}).items()
                if files.get(rel) != h]
    problems += [f"{rel}: not in the hash manifest" for rel in files if rel not in said.get("files", {})]
    if not problems and hash_manifest(root, said.get("source", {})) != (root / HASH_MANIFEST).read_bytes():
        problems.append(f"{root / HASH_MANIFEST}: is not the canonical hash manifest of the package")
    return problems


def _refuse_unpackable(run: Path, data: Sequence[Path], audit: Callable[..., Any]) -> None:
    paths = RunPaths(run)
    if not paths.manifest.is_file() or not paths.tasks.is_file():
        raise ValidateError(f"RUN: {run} is not a finished run directory (no manifest.json or tasks.parquet)")
    if not paths.checksums.is_file() or not paths.summary.is_file():
        raise ValidateError(f"RUN: {run} is not sealed (no checksums): only a finished run is packaged")
    result = audit(run, data=tuple(data))
    if result.problems:
        raise ValidateError(f"RUN: {run} fails its audit ({len(result.problems)} problem(s), first: "
                            f"{result.problems[0]}); only a run that passes `validate audit` is packaged")


def package(run: Path, out: Path, audit: Callable[..., Any], data: Sequence[Path] = (),
            format: str = "directories") -> dict:
    """Write the package of the sealed, audited run `run` into `out` (new or empty); return
    its hash manifest as a dict. `audit` is `validate.audit.run.audit` (passed in: the audit reads
    packages, so this module cannot import it). `format` ``parquet``: the retained tasks as
    one Parquet file in the published shape (`PARQUET`, a row per task) instead of directories."""
    if format not in FORMATS:
        raise ValidateError(f"--format: {format!r}; give one of {', '.join(FORMATS)}")

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValidateError(f"--out: {out} exists and is not an empty directory; give a new one")
    _refuse_unpackable(run, data, audit)
    paths = RunPaths(run)
    manifest = load_manifest(paths.manifest)
    _, _, taskset = check_environment(manifest, LoadHints(search=tuple(data)))
    if not hasattr(taskset, "task_dir"):
        raise ValidateError(f"RUN: {run} validated {manifest.environment.name}, not a task-directory "
                            "dataset; `validate package` writes Harbor dataset directories")

    ev = load_run(paths.root)
    ids = retained_ids(ev.tasks)
    out.mkdir(parents=True, exist_ok=True)
    expected = {t.id: t.hash for t in manifest.tasks}
    if format == "parquet":
        with tempfile.TemporaryDirectory(prefix="package-") as staging:
            materialise(taskset, ids, expected, Path(staging))
            publish(Path(staging), ids, expected, taskset, out)
    else:
        materialise(taskset, ids, expected, out)
    atomic_write(out / EXCLUSIONS, exclusion_ledger(ev.exclusions))
    source = _source(manifest, paths)
    atomic_write(out / CARD, card(manifest, ev, taskset, ids, source).encode())
    data_ = hash_manifest(out, source)
    atomic_write(out / HASH_MANIFEST, data_)
    return loads(data_)


def _source(manifest: Manifest, paths: RunPaths) -> dict[str, str]:
    return {"run_id": paths.root.name, "contract": manifest.name, "contract_sha256": manifest.sha256,
            "dataset_revision": manifest.environment.revision,
            "checksums_sha256": "sha256:" + file_sha256(paths.checksums)}
