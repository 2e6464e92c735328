"""Package a validated task-directory dataset (protocol step 5): ``validate package RUN --out DIR``.

The package is a Harbor dataset directory that holds exactly what the run certified:

- every retained (``compatible``) task directory, its files byte for byte as validated (the
  dataset the contract froze, found by its revision; each copy's hash is checked against the
  contract's before anything else is written); a dataset frozen with offline patches
  (``--patches``) is served patched by its environment, and the contract's hashes are the
  patched tasks', so the package holds the tasks as validated, patches applied;
- ``exclusions.json``: the run's exclusion ledger, canonical JSON;
- ``README.md``: the dataset card, rendered from the evidence (`validate.package_card`);
- ``package.json``: the hash manifest — every other file's sha256 by relative path, sorted,
  the package's own dataset revision, and the run, contract and source revision it came
  from; canonical JSON, so `verify_package` recomputes it byte for byte.

Harbor (and this harness's loader) treats every directory under the dataset as a task and
ignores its top-level files, so the package loads as the retained tasks and nothing else.

Refused, each naming the reason: a run that is not sealed (no ``checksums``: it never
finished), a run whose audit fails, a run that is not of a task-directory dataset, an
``--out`` that exists and is not empty.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from environment.protocol import LoadHints, canonical_json, sha256_tag
from validate.contract import Manifest, check_environment, load_manifest
from validate.errors import ValidateError
from validate.evidence import atomic_write, file_sha256
from validate.paths import RunPaths
from validate.jsonio import JSONInputError, loads
from validate.package_card import card, exclusion_ledger, retained_ids
from validate.run_evidence import load_run
from environment.harbor.taskdir import load_dataset, load_task

HASH_MANIFEST = "package.json"
EXCLUSIONS = "exclusions.json"
CARD = "README.md"
SCHEMA_VERSION = 1


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


def hash_manifest(root: Path, source: dict[str, str]) -> bytes:
    """``package.json``'s bytes: the files' hashes, the package's revision, where it came from."""

    return canonical_json({"schema_version": SCHEMA_VERSION, "revision": load_dataset(root).revision,
                           "source": dict(sorted(source.items())), "files": file_hashes(root)})


def verify_package(root: Path) -> list[str]:
    """Every way the package at `root` differs from its own hash manifest (empty: it verifies)."""

    try:
        said = loads((root / HASH_MANIFEST).read_bytes())
    except (OSError, JSONInputError) as e:
        return [f"{root / HASH_MANIFEST}: not readable ({e})"]
    files = file_hashes(root)
    problems = [f"{rel}: sha256 {files.get(rel)} is not the manifest's {h}" for rel, h in said.get("files", {}).items()
                if files.get(rel) != h]
    problems += [f"{rel}: not in the hash manifest" for rel in files if rel not in said.get("files", {})]
    if not problems and hash_manifest(root, said.get("source", {})) != (root / HASH_MANIFEST).read_bytes():
        problems.append(f"{root / HASH_MANIFEST}: is not the canonical hash manifest of the package")
    return problems


def _refuse_unpackable(run: Path, data: Sequence[Path], audit: Callable[..., object]) -> None:
    paths = RunPaths(run)
    if not paths.manifest.is_file() or not paths.tasks.is_file():
        raise ValidateError(f"RUN: {run} is not a finished run directory (no manifest.json or tasks.parquet)")
    if not paths.checksums.is_file() or not paths.summary.is_file():
        raise ValidateError(f"RUN: {run} is not sealed (no checksums): only a finished run is packaged")
    result = audit(run, data=tuple(data))
    if result.problems:
        raise ValidateError(f"RUN: {run} fails its audit ({len(result.problems)} problem(s), first: "
                            f"{result.problems[0]}); only a run that passes `validate audit` is packaged")


def package(run: Path, out: Path, audit: Callable[..., object], data: Sequence[Path] = ()) -> dict:
    """Write the package of the sealed, audited run `run` into `out` (new or empty); return
    its hash manifest as a dict. `audit` is `validate.audit.audit` (passed in: the audit reads
    packages, so this module cannot import it)."""

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValidateError(f"--out: {out} exists and is not an empty directory; give a new one")
    _refuse_unpackable(run, data, audit)
    paths = RunPaths(run)
    manifest = load_manifest(paths.manifest)
    _, _, taskset = check_environment(manifest, LoadHints(search=tuple(data)))
    if not hasattr(taskset, "task_dir"):
        raise ValidateError(f"RUN: {run} validated {manifest.environment.name}, not a task-directory dataset; "
                            f"`validate package` writes Harbor dataset directories")

    ev = load_run(paths.root)
    ids = retained_ids(ev.tasks)
    out.mkdir(parents=True, exist_ok=True)
    materialise(taskset, ids, {t.id: t.hash for t in manifest.tasks}, out)
    atomic_write(out / EXCLUSIONS, exclusion_ledger(ev.exclusions))
    source = _source(manifest, paths)
    atomic_write(out / CARD, card(manifest, ev, taskset, ids, source).encode())
    data_ = hash_manifest(out, source)
    atomic_write(out / HASH_MANIFEST, data_)
    return loads(data_)


def _source(manifest: Manifest, paths: RunPaths) -> dict[str, str]:
    return {"run_id": paths.root.name, "contract": manifest.name, "contract_sha256": manifest.sha256,
            "dataset_revision": manifest.environment.revision, "checksums_sha256": "sha256:" + file_sha256(paths.checksums)}
