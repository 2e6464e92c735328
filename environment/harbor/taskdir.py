"""Loading a Harbor dataset directory: per task, a parsed task or a blocking problem.

A dataset is a directory; every directory under it that holds a task marker (``task.toml``,
``instruction.md``, ``environment/``, ``tests/`` or ``solution/``) is a task, and a directory
holding none is a group whose subdirectories are searched (so ``DIR/<family>/<task>`` works).
A leaf directory holding no marker is a task that lacks its ``task.toml``. Hidden entries at
the dataset level (``.git``) are skipped.

Nothing here follows a symlink or trusts a size: every entry of a task is ``lstat``-ed once,
a symlink whose target leaves the task, a special file (a FIFO would hang a reader), a
file name that is not UTF-8, or a file over the limits is a `TaskProblem` naming the file;
so is a missing or invalid ``task.toml`` (naming the field), a missing or empty
``instruction.md``, no environment, no ``tests/test.sh``. The loader never raises for a
task; only a dataset root that is not a directory raises `DatasetError`.

Hashes: a task's hash is ``sha256:`` over the canonical JSON list of its entries, each
``[relative path, digest]`` sorted by path, where a file's digest is the sha256 of its
bytes and a symlink's is its target text (``symlink:<target>``); so it covers the whole
directory. The dataset's revision is the same over every entry of every task, paths made
relative to the dataset. Invalid tasks count too: editing one changes the revision.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from environment.harbor.config import TaskConfig
from environment.protocol import EnvError, Finding, canonical_json, safe_text, sha256_tag

TASK_MARKERS = ("task.toml", "instruction.md", "environment", "tests", "solution")
#: Harbor's canary lines: an HTML or ``#`` comment mentioning "canary", case-insensitive.
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


class DatasetError(EnvError, ValueError):
    """The dataset root itself is unusable (the CLI prints it on one line, exit 2)."""


class Limits(BaseModel):
    """What one task (and a published dataset's rows) may hold; over a limit is a problem,
    never a long read."""

    model_config = ConfigDict(frozen=True)

    max_file_bytes: int = 512 * 2**20
    max_task_bytes: int = 2 * 2**30
    max_entries: int = 50_000
    max_depth: int = 32
    #: ``task.toml`` and ``instruction.md`` are read whole into memory.
    max_text_bytes: int = 2**20
    #: A published row's packed task (``task_binary``), before it is unpacked.
    max_archive_bytes: int = 512 * 2**20
    #: Every row of a published dataset, unpacked.
    max_dataset_bytes: int = 64 * 2**30


class TaskProblem(BaseModel):
    """Why a task cannot be validated: the file, the field (for ``task.toml``), the detail."""

    model_config = ConfigDict(frozen=True)

    file: str
    field: str | None = None
    detail: str

    def line(self) -> str:
        where = f"{self.file} [{self.field}]" if self.field else self.file
        return f"{where}: {self.detail}"

    def finding(self) -> Finding:
        return Finding(kind="malformed_task", blocking=True, detail=self.line())


class Entry(BaseModel):
    """One entry of a task directory: a file (digest of its bytes) or a symlink (its target)."""

    model_config = ConfigDict(frozen=True)

    path: str
    digest: str
    size: int = 0


class HarborTask(BaseModel):
    """A task that parsed: what the harness needs to build, run and verify it."""

    id: str = Field(description="The task directory's path relative to the dataset, '/'-separated.")
    hash: str
    config: TaskConfig
    instruction: str = Field(description="instruction.md with Harbor's leading canary lines stripped.")
    #: ``none``: only an Apptainer image (`sif_image`), which no backend here runs.
    environment: Literal["dockerfile", "compose", "image", "none"]
    docker_image: str | None = None
    #: The Apptainer image a published row names (its ``sif_image`` column), recorded.
    sif_image: str | None = None
    has_solution: bool = Field(description="solution/solve.sh exists (only then can the oracle certify).")
    verifier: Literal["shared", "separate"]
    #: For a separate verifier, what its container is built from; ``environment`` = the task's own.
    verifier_build: Literal["dockerfile", "compose", "image", "environment"] | None = None
    steps: list[str] = Field(default_factory=list)
    #: The images the Dockerfile builds FROM (its earlier stages excluded), in order: what a
    #: profile's base-image map must serve. Empty for a compose or docker_image environment.
    base_images: list[str] = Field(default_factory=list)
    entries: list[Entry]


class InvalidTask(BaseModel):
    id: str
    hash: str
    problems: list[TaskProblem]
    entries: list[Entry]

    def findings(self) -> list[Finding]:
        return [p.finding() for p in self.problems]


class HarborDataset(BaseModel):
    revision: str
    tasks: list[HarborTask]
    invalid: list[InvalidTask]


def task_hash(entries: list[Entry]) -> str:
    return sha256_tag(canonical_json(sorted([e.path, e.digest] for e in entries)))


def strip_canary(text: str) -> str:
    """Drop leading canary lines and the blank lines right after them, as Harbor does."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def find_task_dirs(root: Path, limits: Limits = Limits()) -> list[str]:
    """Dataset-relative ids of the task directories under `root`, sorted."""
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory")
    if any((root / m).exists() for m in TASK_MARKERS):
        raise DatasetError(f"{root}: is itself a task directory (it holds {_markers(root)[0]}); "
                           "give the dataset directory that contains it")
    found: list[str] = []

    def visit(d: Path, rel: str, depth: int) -> None:
        for n in sorted(_listdir(d)):
            child, crel = d / n, f"{rel}/{n}" if rel else n
            if n.startswith(".") or not (child.is_dir() or child.is_symlink()):
                continue  # hidden entries (.git) and a dataset's own files (README.md) are not tasks
            # a symlinked directory is never descended into; as a task, the walk reports it
            if child.is_symlink() or _markers(child) or depth + 1 >= limits.max_depth:
                found.append(crel)
            elif not any((child / c).is_dir() for c in _listdir(child)):
                found.append(crel)  # a leaf holding no marker: a task that lacks its task.toml
            else:
                visit(child, crel, depth + 1)

    visit(root, "", 0)
    return sorted(found)


def _listdir(d: Path) -> list[str]:
    try:
        return os.listdir(d)
    except OSError:
        return []  # an unreadable directory: as a task, the walk reports it


def _markers(d: Path) -> list[str]:
    names = set(_listdir(d))
    return [m for m in TASK_MARKERS if m in names]


def load_dataset(root: Path, limits: Limits = Limits()) -> HarborDataset:
    """Every task under `root`, parsed or with its problems; never raises for a task."""
    root = Path(root)
    tasks: list[HarborTask] = []
    invalid: list[InvalidTask] = []
    every: list[list[str]] = []
    for tid in find_task_dirs(root, limits):
        loaded = load_task(root, tid, limits) if safe_text(tid) == tid else _not_utf8(root, tid, limits)
        if isinstance(loaded, HarborTask):
            tasks.append(loaded)
        else:
            invalid.append(loaded)
        every += [[f"{loaded.id}/{e.path}", e.digest] for e in loaded.entries]
    return HarborDataset(revision=sha256_tag(canonical_json(sorted(every))), tasks=tasks, invalid=invalid)


def load_task(root: Path, tid: str, limits: Limits = Limits(),
              sif_image: str | None = None) -> HarborTask | InvalidTask:
    """One task directory, `tid` relative to `root`; `sif_image`: the Apptainer image its
    published row names (then a task without a Docker environment still loads, as one)."""
    task_dir = root / tid
    if task_dir.is_symlink():
        target = os.readlink(task_dir)
        return InvalidTask(id=tid, hash=task_hash([]), entries=[], problems=[TaskProblem(
            file=".", detail=f"the task directory is a symlink (to {target!r}); a task must be "
                             "a real directory")])
    entries, problems = _walk(task_dir, limits)
    digest = task_hash(entries)
    if not problems:
        try:
            return _parse(task_dir, tid, digest, entries, limits, sif_image)
        except _Invalid as e:
            problems = [e.problem]
    return InvalidTask(id=tid, hash=digest, problems=problems, entries=entries)


def _not_utf8(root: Path, tid: str, limits: Limits) -> InvalidTask:
    """A task directory whose path is not UTF-8: invalid, its id the path's bytes escaped
    (``\\xff``), its entries still hashed into the revision."""
    entries = [] if (root / tid).is_symlink() else _walk(root / tid, limits)[0]
    escaped = os.fsencode(tid).decode("utf-8", "backslashreplace")
    return InvalidTask(
        id=escaped,
        hash=task_hash(entries),
        entries=entries,
        problems=[
            TaskProblem(
                file=".",
                detail=f"the task directory's path is not UTF-8 ({escaped}, its bytes escaped); rename it",
            )
        ],
    )


class _Invalid(EnvError):
    def __init__(self, problem: TaskProblem) -> None:
        self.problem = problem


def _walk(task_dir: Path, limits: Limits) -> tuple[list[Entry], list[TaskProblem]]:
    """lstat every entry once, never following a link; hash what may be hashed."""
    real_root = os.path.realpath(task_dir)
    entries: list[Entry] = []
    problems: list[TaskProblem] = []
    total = 0
    stack: list[tuple[Path, str, int]] = [(task_dir, "", 0)]
    while stack:
        d, rel, depth = stack.pop()
        try:
            names = sorted(os.listdir(d))
        except OSError as e:
            problems.append(TaskProblem(file=rel or ".", detail=f"cannot list: {e.strerror}"))
            continue
        for name in names:
            path, rp = d / name, f"{rel}/{name}" if rel else name
            if len(entries) >= limits.max_entries:
                problems.append(TaskProblem(file=".", detail=f"more than {limits.max_entries} entries"))
                return entries, problems
            try:
                os.fsencode(name).decode("utf-8")
            except UnicodeDecodeError:
                problems.append(TaskProblem(file=rp.encode("utf-8", "backslashreplace").decode(),
                                            detail="file name is not UTF-8"))
                continue
            try:
                total = _entry(path, rp, depth, real_root, limits, total, entries, problems, stack)
            except OSError as e:
                problems.append(TaskProblem(file=rp, detail=f"cannot read: {e.strerror}"))
    entries.sort(key=lambda e: e.path)
    return entries, problems


def _entry(path: Path, rp: str, depth: int, real_root: str, limits: Limits, total: int,
           entries: list[Entry], problems: list[TaskProblem], stack: list) -> int:
    """Record one entry (a directory is pushed on `stack`); returns the running byte total."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = os.fsencode(os.readlink(path)).decode("utf-8", "backslashreplace")  # bytes not UTF-8 escaped
        entries.append(Entry(path=rp, digest=f"symlink:{target}"))
        real = os.path.realpath(path)
        if real != real_root and not real.startswith(real_root + os.sep):
            problems.append(TaskProblem(file=rp, detail=f"symlink out of the task directory (to {target!r})"))
    elif stat.S_ISDIR(st.st_mode):
        if depth + 1 > limits.max_depth:
            problems.append(TaskProblem(file=rp, detail=f"nested deeper than {limits.max_depth} directories"))
        else:
            stack.append((path, rp, depth + 1))
    elif stat.S_ISREG(st.st_mode):
        total += st.st_size
        if st.st_size > limits.max_file_bytes or total > limits.max_task_bytes:
            entries.append(Entry(path=rp, digest=f"oversize:{st.st_size}", size=st.st_size))
            what = "file" if st.st_size > limits.max_file_bytes else "task"
            cap = limits.max_file_bytes if what == "file" else limits.max_task_bytes
            problems.append(
                TaskProblem(file=rp, detail=f"{what} larger than {cap} bytes ({st.st_size} bytes)")
            )
        else:
            entries.append(Entry(path=rp, digest=_file_digest(path), size=st.st_size))
    else:
        entries.append(Entry(path=rp, digest="special"))
        problems.append(TaskProblem(file=rp, detail="not a regular file, directory or symlink"))
    return total


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    # O_NOFOLLOW | O_NONBLOCK: if the entry was swapped for a link or a FIFO since lstat, fail, do not hang
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _read_text(task_dir: Path, rel: str, limits: Limits, digests: dict[str, str]) -> str:
    """A text file the walk already hashed; its bytes must still be the hashed ones (a task
    edited while it is loaded must not parse as one content and hash as another)."""
    path = task_dir / rel
    if not path.is_file():
        raise _Invalid(TaskProblem(file=rel, detail="missing"))
    if path.stat().st_size > limits.max_text_bytes:
        raise _Invalid(TaskProblem(file=rel, detail=f"larger than {limits.max_text_bytes} bytes"))
    data = path.read_bytes()
    # an internal symlink was hashed as its target: check the bytes against the file it reaches
    real = Path(os.path.realpath(path)).relative_to(os.path.realpath(task_dir)).as_posix()
    if digests.get(real) != sha256_tag(data):
        raise _Invalid(TaskProblem(file=rel, detail="changed while the task was being read"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Invalid(TaskProblem(file=rel, detail=f"not UTF-8 (byte {e.start})")) from None


def _parse_config(text: str) -> TaskConfig:
    """``task.toml`` text to a `TaskConfig`, or `_Invalid` naming the field."""
    try:
        return TaskConfig.from_toml(text)
    except tomllib.TOMLDecodeError as e:
        raise _Invalid(TaskProblem(file="task.toml", detail=f"not TOML: {e}")) from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise _Invalid(TaskProblem(file="task.toml", detail="nested too deeply to parse")) from None
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise _Invalid(TaskProblem(file="task.toml", field=field, detail=err["msg"] + more)) from None


def _parse(task_dir: Path, tid: str, digest: str, entries: list[Entry], limits: Limits,
           sif_image: str | None = None) -> HarborTask:
    digests = {e.path: e.digest for e in entries}
    config = _parse_config(_read_text(task_dir, "task.toml", limits, digests))
    steps = [s.name for s in config.steps or []]
    instruction = ""
    if steps:
        for name in steps:
            _read_text(task_dir, f"steps/{name}/instruction.md", limits, digests)
    else:
        instruction = strip_canary(_read_text(task_dir, "instruction.md", limits, digests))
        if not instruction.strip():
            raise _Invalid(TaskProblem(file="instruction.md",
                                       detail="empty once the canary lines are stripped"))
    env = config.environment
    kind = "image" if env.docker_image else _build_kind(task_dir / "environment") or ("none" if sif_image
                                                                                      else None)
    if kind is None:
        raise _Invalid(TaskProblem(file="environment/Dockerfile", field="environment.docker_image",
                                   detail="no environment: neither environment/Dockerfile, "
                                          "environment/docker-compose.yaml nor [environment].docker_image"))
    if not steps and not (task_dir / "tests/test.sh").is_file():
        raise _Invalid(TaskProblem(file="tests/test.sh", detail="missing: nothing can verify the task"))
    bases = []
    if kind == "dockerfile":
        bases = dockerfile_bases(_read_text(task_dir, "environment/Dockerfile", limits, digests))
    separate = config.verifier.separate()
    vbuild = None
    if separate:
        venv = config.verifier.environment
        vbuild = "image" if venv and venv.docker_image else _build_kind(task_dir / "tests") or "environment"
    return HarborTask(id=tid, hash=digest, config=config, instruction=instruction, environment=kind,
                      docker_image=env.docker_image, has_solution=_has_solution(task_dir, steps),
                      verifier="separate" if separate else "shared", verifier_build=vbuild, steps=steps,
                      base_images=bases, entries=entries, sif_image=sif_image)


def dockerfile_bases(text: str) -> list[str]:
    """The external images named by a Dockerfile's ``FROM`` lines: continuation lines joined,
    comments and ``--platform=…`` flags skipped, a ``FROM <earlier stage>`` and ``scratch`` left out. An
    ``ARG``-made name stays as written (``${BASE}``): the map cannot serve what it cannot name."""
    logical, stages, bases = [], set(), []
    for line in text.replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            logical.append(line.split())
    for words in logical:
        if words[0].upper() != "FROM":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if not args:
            continue
        if args[0].lower() not in stages and args[0] != "scratch":  # scratch is no image at all
            bases.append(args[0])
        if len(args) >= 3 and args[1].upper() == "AS":
            stages.add(args[2].lower())
    return bases


def _has_solution(task_dir: Path, steps: list[str]) -> bool:
    """solution/solve.sh, or for a multi-step task every step's own solve.sh."""
    if steps:
        return all((task_dir / f"steps/{name}/solution/solve.sh").is_file() for name in steps)
    return (task_dir / "solution/solve.sh").is_file()


def _build_kind(d: Path) -> Literal["dockerfile", "compose"] | None:
    if (d / "Dockerfile").is_file():
        return "dockerfile"
    if (d / "docker-compose.yaml").is_file():
        return "compose"
    return None
