"""The trusted verifier's rule: which of the agent's changes reach the verifier, and the plan
that carries them into a fresh container (or overlay) of the task's pristine image.

The verifier of a trusted trial runs in the image the task was built into, never in the
agent's environment: its interpreters, libraries, site-packages, ``/etc`` and dynamic linker
are the image's. Only the agent's changes under the task's **work paths** are carried over
(`RULE`, recorded in the contract as its version):

1. the task's working directory (``[environment].workdir``, else the image's ``WORKDIR``),
   ``/logs/artifacts`` and the sources of the task's declared ``artifacts``: every change
   under them is carried;
2. every absolute path named in the task's ``instruction.md`` or in a file of its ``tests/``
   (the paths its tests read, as written there) outside those: only what the agent **added**
   there is carried — a file the image already holds (a program the tests run, a script they
   source) never changes for the verifier;

less the filesystem root itself and every path at or under a **protected** prefix
(`PROTECTED`: the system's programs, libraries, headers, configuration, package databases,
the harness's own mounts) or holding a **protected name** (`PROTECTED_NAMES`: the start-up
files and configuration of shells, version control, package managers and the Python user
site, wherever they are: a working directory of ``/root`` carries the agent's work, never its
``.bashrc`` or ``.gitconfig``; a repository's ``.git`` carries its objects and refs, never its
``config`` or ``hooks``). Devices, fifos and sockets the agent made are never carried (named in
the evidence).

Everything else the agent changed (the engine's record of its container's writable layer) is
recorded as evidence (`Change`), never carried. A task whose reference solution passes only
when such changes reach the verifier (it installs a package, edits ``/etc``) cannot be shown to
resist tampering: the oracle's verdict says so (`validate.evidence.verdicts`).
"""

from __future__ import annotations

import bisect
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

#: The rule's version, recorded in every trusted contract and on every trusted attempt.
RULE = "work-paths/2"
#: Never carried, even under a work path.
PROTECTED = (
    "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32",
    "/usr/lib64", "/usr/libx32", "/usr/libexec", "/usr/include", "/usr/share", "/usr/local/bin",
    "/usr/local/sbin", "/usr/local/lib", "/usr/local/libexec", "/usr/local/include", "/usr/local/share",
    "/etc", "/boot", "/dev", "/proc", "/sys", "/run", "/var/lib", "/var/cache", "/logs/agent",
    "/logs/verifier", "/tests", "/solution", "/.dv",
)
#: A path holding one of these names as a component is never carried: what shells, version
#: control, package managers and Python read at their start, wherever it lies.
PROTECTED_NAMES = frozenset({
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc", ".zshenv", ".zprofile",
    ".zlogin", ".kshrc", ".inputrc", ".gitconfig", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pypirc",
    ".pydistutils.cfg", ".netrc", ".curlrc", ".wgetrc", ".ssh", ".gnupg", ".cargo", ".rustup", ".local",
    ".config", ".cache", ".pip",
})
#: Inside a ``.git`` directory: what git runs or reads as its configuration.
PROTECTED_IN_GIT = frozenset({"config", "hooks", "info"})
#: The harness's own paths in the agent's container: neither carried nor reported as the agent's.
HARNESS_PATHS = ("/logs", "/tests", "/solution", "/.dv", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf")
ARTIFACTS = "/logs/artifacts"
_PATH = re.compile(r"(?<![\w.~:/$-])(/(?:[\w.+@-]+/)*[\w.+@-]+)")
MAX_NAMED = 256
#: Kinds of change as the daemon's diff gives them (0, 1, 2).
KINDS: tuple[Literal["changed", "added", "deleted"], ...] = ("changed", "added", "deleted")


class Change(BaseModel):
    """A path the agent changed, as the engine's record of its container gives it."""

    model_config = ConfigDict(frozen=True)

    path: str
    kind: Literal["changed", "added", "deleted"]


def under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def protected(path: str) -> bool:
    if any(under(path, p) for p in PROTECTED):
        return True
    parts = path.split("/")
    if PROTECTED_NAMES.intersection(parts):
        return True
    return any(a == ".git" and b in PROTECTED_IN_GIT for a, b in pairwise(parts))


def _clean(path: str) -> str | None:
    if not path.startswith("/"):
        return None
    norm = posixpath.normpath(path)
    norm = "/" + norm.lstrip("/")
    return None if norm == "/" else norm


def named_paths(texts: Iterable[str]) -> list[str]:
    """The absolute paths named in `texts` (an instruction, the tests' files), as written."""
    found: set[str] = set()
    for text in texts:
        for p in _PATH.findall(text):
            clean = _clean(p.rstrip("."))
            if clean is not None:
                found.add(clean)
    return sorted(found)[:MAX_NAMED]


@dataclass(frozen=True)
class WorkPaths:
    """A task's work paths by `RULE`: `full` (every change carried) and `named` (only what the
    agent added); each sorted, none under another, none protected or ``/``."""

    full: tuple[str, ...]
    named: tuple[str, ...] = ()

    def all(self) -> list[str]:
        return sorted({*self.full, *self.named})


def tree_order(path: str) -> list[str]:
    """A sort key that puts every path right before its descendants ("/a", "/a/b", "/a.txt"):
    plain string order would put "/a.txt" between them."""
    return path.split("/")


def _kept(candidates: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for c in sorted({c for c in (_clean(p) for p in candidates) if c is not None and not protected(c)},
                    key=tree_order):
        if not (kept and under(c, kept[-1])):  # an ancestor comes right before its descendants
            kept.append(c)
    return sorted(kept)


def work_paths(workdir: str | None, artifacts: Sequence[str], named: Sequence[str]) -> WorkPaths:
    """The task's work paths by `RULE`."""
    full = _kept([workdir or "", ARTIFACTS, *artifacts])
    rest = [n for n in _kept(named) if not any(under(n, f) for f in full)]
    return WorkPaths(full=tuple(full), named=tuple(rest))


def task_texts(task_dir: Path, instruction: str, max_bytes: int = 1 << 20) -> list[str]:
    """The instruction and every regular file of the task's ``tests/`` (each its first
    `max_bytes`, as text), where the paths its tests read are named."""
    texts = [instruction]
    tests = task_dir / "tests"
    if tests.is_dir():
        for path in sorted(tests.rglob("*")):
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as f:
                    texts.append(f.read(max_bytes).decode("utf-8", "replace"))
    return texts


@dataclass(frozen=True)
class Plan:
    """What a trusted verifier gets of the agent's changes."""

    #: Paths whose whole subtree is carried from the agent's (none under another; none holds a
    #: protected path or a change that is not carried).
    copy: tuple[str, ...]
    #: Paths removed for the verifier (the agent deleted them).
    delete: tuple[str, ...]
    #: The agent's changes not carried (outside the work paths, protected, or a change of what
    #: the image held under a named path): recorded only.
    outside: tuple[Change, ...]


class _Tree:
    """Sorted paths with a prefix test in O(log n): is anything of the set at or below a path?"""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = sorted(set(paths))

    def below(self, path: str, strict: bool = True) -> bool:
        prefix = path + "/"
        i = bisect.bisect_left(self.paths, prefix)
        if i < len(self.paths) and self.paths[i].startswith(prefix):
            return True
        return not strict and path in self.paths


def plan(diff: Iterable[dict], work: WorkPaths | Sequence[str]) -> Plan:
    """The copy plan from the engine's record of the agent's changes
    (``[{"Path": ..., "Kind": 0|1|2}]``) and the work paths. Within a work path: a deletion is
    removed (the topmost deleted path); an addition or a change is carried with its subtree,
    from the topmost path whose subtree holds only carried changes (a change above others,
    such as a directory whose entries changed, is not itself carried). In O(n log n)."""
    if not isinstance(work, WorkPaths):
        work = WorkPaths(full=tuple(work))
    changes = sorted({(str(d.get("Path", "")), int(d.get("Kind", 0))) for d in diff if isinstance(d, dict)})
    carried: dict[str, str] = {}
    outside: list[Change] = []
    for path, kind in changes:
        clean = _clean(path)
        if clean is None or clean == ARTIFACTS or _harness_made(clean):
            continue
        change = Change(path=clean, kind=KINDS[kind] if 0 <= kind < 3 else "changed")
        if _carried(clean, change.kind, work):
            carried[clean] = change.kind
        else:
            outside.append(change)
    not_carried = _Tree(c.path for c in outside)
    all_carried = _Tree(carried)
    delete: list[str] = []
    copy: list[str] = []
    for path in sorted(carried, key=tree_order):  # an ancestor right before its descendants
        if (delete and under(path, delete[-1])) or (copy and under(path, copy[-1])):
            continue
        change_kind = carried[path]
        if change_kind == "deleted":
            delete.append(path)
        elif not not_carried.below(path) and (change_kind == "added" or not all_carried.below(path)):
            copy.append(path)
    return Plan(copy=tuple(copy), delete=tuple(delete), outside=tuple(outside))


def _carried(path: str, kind: str, work: WorkPaths) -> bool:
    if protected(path):
        return False
    if any(under(path, w) for w in work.full):
        return True
    return kind == "added" and any(under(path, n) for n in work.named)


def _harness_made(path: str) -> bool:
    """A path of the harness's own in the agent's container (its mounts, log directories and
    uploads; the agent's artifacts below /logs/artifacts are the agent's)."""
    return any(under(path, h) for h in HARNESS_PATHS) and not under(path, ARTIFACTS)
