"""Offline patches for a Harbor dataset: one unified diff per task, applied to a copy.

Upstream tasks often reach for the network where these profiles have none (a ``test.sh``
that downloads its checker at verify time). A *patch set* is a directory holding one diff
per task, ``<task id>.diff`` (the task's path in the dataset, so ``DIR/group/task.diff`` for
``group/task``), with paths relative to the task directory (``a/…``/``b/…`` prefixes, as
``git diff`` writes them). Typical use: install the verifier's dependencies from the
distribution at build time instead of downloading them in ``test.sh``.

`patched_copy` copies the dataset into a fresh private directory of the process (made once
per process and patch set, removed at exit: a copy another process left is never trusted),
applies each diff there with ``git apply`` — which refuses a path that leaves the tree
(``..``, absolute) and a diff that does not apply cleanly — and the caller loads the copy. The original
dataset is never written. What the contract then records is the *patched* dataset: its revision and every
task's hash are over the patched files, so the manifest holds the patches' effect, and the audit, which loads
the environment again, applies them again and must find the same hashes.

Each patched task carries a non-blocking finding (``patched``) naming its diff, the diff's
sha256 and the files it touches: it lands in the verdict's detail, so ``tasks.parquet`` and
the report list it per task. Anything wrong with the patch set (a diff for no task, one that
does not apply, a file that is not a diff) is a `ConfigError` naming the file.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from environment.protocol import ConfigError, Finding, canonical_json, sha256_tag

#: Bumped when what a key covers, or how a patch is applied, changes.
PATCH_VERSION = 1
SUFFIX = ".diff"


@dataclass(frozen=True)
class TaskPatch:
    """One task's diff: where it is, its digest, the task files it touches."""

    task_id: str
    file: Path
    sha256: str
    touches: tuple[str, ...]

    def finding(self) -> Finding:
        return Finding(kind="patched", blocking=False,
                       detail=f"patched offline by {self.task_id}{SUFFIX} ({self.sha256}): "
                              f"{', '.join(self.touches)}")


def read_patch_set(directory: Path, task_ids: list[str]) -> list[TaskPatch]:
    """Every ``*.diff`` under `directory`, each for a task of `task_ids` (sorted by task id)."""
    if not directory.is_dir():
        raise ConfigError(f"patches: {directory} is not a directory (one <task id>{SUFFIX} per task)")
    known = set(task_ids)
    out: list[TaskPatch] = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(directory).as_posix()
        if path.is_symlink() or not rel.endswith(SUFFIX):
            raise ConfigError(f"patches: {path}: only regular <task id>{SUFFIX} files belong in a patch set")
        tid = rel[: -len(SUFFIX)]
        if tid not in known:
            raise ConfigError(f"patches: {path}: the dataset has no task {tid!r} (name each diff after its "
                              "task's directory)")
        data = path.read_bytes()
        out.append(TaskPatch(tid, path, sha256_tag(data), _touches(path, data)))
    if not out:
        raise ConfigError(f"patches: {directory} holds no {SUFFIX} file")
    return out


def _git(args: list[str], cwd: Path, data: bytes) -> subprocess.CompletedProcess:
    # No repository is discovered above the copy: the diff applies to these files only.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.parent), "GIT_DIR": str(cwd / ".no-git")}
    try:
        return subprocess.run(["git", "apply", *args], cwd=cwd, input=data, capture_output=True, env=env,
                              timeout=60)
    except FileNotFoundError:
        raise ConfigError("patches: applying a patch set needs git (`apt-get install git`)") from None


def _touches(path: Path, data: bytes) -> tuple[str, ...]:
    """The files a diff touches, from ``git apply --numstat`` (it reads, applies nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        got = _git(["--numstat", "-"], Path(tmp), data)
    if got.returncode != 0:
        raise ConfigError(f"patches: {path}: not a diff git can read: "
                          f"{got.stderr.decode(errors='replace').strip()}")
    files = [line.split("\t", 2)[2] for line in got.stdout.decode(errors="replace").splitlines()
             if line.count("\t") >= 2]
    if not files:
        raise ConfigError(f"patches: {path}: the diff touches no file")
    return tuple(sorted(files))


def patch_key(revision: str, patches: list[TaskPatch]) -> str:
    return sha256_tag(canonical_json([PATCH_VERSION, revision, [[p.task_id, p.sha256] for p in patches]]))


#: This process's patched copies by key: made once per process, removed when it exits.
_COPIES: dict[str, Path] = {}
_LOCK = threading.Lock()


def patched_copy(root: Path, revision: str, patches: list[TaskPatch]) -> Path:
    """The dataset at `root` with `patches` applied, in a fresh private directory of this
    process (never a copy another process could have left: what is frozen is made here)."""
    key = patch_key(revision, patches)
    with _LOCK:
        if key in _COPIES and _COPIES[key].is_dir():
            return _COPIES[key]
        base = Path(tempfile.mkdtemp(prefix="harbor-patched-"))
        atexit.register(shutil.rmtree, base, True)
        tree = base / root.name
        shutil.copytree(root, tree, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        for p in patches:
            got = _git(["--whitespace=nowarn", "-p1", "-"], tree / p.task_id, p.file.read_bytes())
            if got.returncode != 0:
                shutil.rmtree(base, ignore_errors=True)
                raise ConfigError(f"patches: {p.file} does not apply to task {p.task_id}: "
                                  f"{got.stderr.decode(errors='replace').strip()[:500]}")
        _COPIES[key] = tree
        return tree
