"""The trusted verifier's rule: which of the agent's changes reach the verifier, and the plan
that carries them into a fresh container of the task's pristine image.

The verifier of a trusted trial runs in a container of the image the task was built into,
never in the agent's: its interpreters, libraries, site-packages, ``/etc`` and dynamic
linker are the image's. Only the agent's changes under the task's **work paths** are carried
over (`RULE`, recorded in the contract as its version):

1. the task's working directory (``[environment].workdir``, else the image's ``WORKDIR``);
2. ``/logs/artifacts`` and the sources of the task's declared ``artifacts``;
3. every absolute path named in the task's ``instruction.md`` or in a file of its ``tests/``
   (the paths its tests read, as written there);

less the filesystem root itself and every path at or under a **protected** prefix
(`PROTECTED`: the system's programs, libraries, headers, configuration, package databases,
the Python user site of root and of every home directory, the harness's own mounts). A
change under a work path but at or under a protected prefix is not carried either: a
working directory of ``/usr/src/app`` carries what the agent did there, never ``/usr/lib``.
Devices, fifos and sockets the agent made are never carried (named in the evidence).

Everything else the agent changed (the container's diff, from the daemon) is recorded as
evidence (`Change`), never carried. A task whose reference solution passes only when such
changes reach the verifier (it installs a package, edits ``/etc``) cannot be shown to resist
tampering: the oracle's verdict says so (`validate.evidence.verdicts`).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

#: The rule's version, recorded in every trusted contract and on every trusted attempt.
RULE = "work-paths/1"
#: Never carried, even under a work path.
PROTECTED = (
    "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32",
    "/usr/lib64", "/usr/libx32", "/usr/libexec", "/usr/include", "/usr/share", "/usr/local/bin", "/usr/local/sbin",
    "/usr/local/lib", "/usr/local/libexec", "/usr/local/include", "/usr/local/share", "/etc", "/boot", "/dev",
    "/proc", "/sys", "/run", "/var/lib", "/var/cache", "/root/.local", "/root/.config", "/root/.cache",
    "/logs/agent", "/logs/verifier", "/tests", "/solution", "/.dv",
)
#: Home directories whose own Python user site and configuration are protected like root's.
_HOME_DOTS = re.compile(r"^/home/[^/]+/\.(local|config|cache)(/|$)")
#: The harness's own paths in the agent's container: neither carried nor reported as the agent's.
HARNESS_PATHS = ("/logs", "/tests", "/solution", "/.dv", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf")
ARTIFACTS = "/logs/artifacts"
_PATH = re.compile(r"(?<![\w.~:/$-])(/(?:[\w.+@-]+/)*[\w.+@-]+)")
MAX_NAMED = 256
#: Kinds of change as the daemon's diff gives them (0, 1, 2).
KINDS: tuple[Literal["changed", "added", "deleted"], ...] = ("changed", "added", "deleted")


class Change(BaseModel):
    """A path the agent changed, as the daemon's diff of its container gives it."""

    model_config = ConfigDict(frozen=True)

    path: str
    kind: Literal["changed", "added", "deleted"]


def under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def protected(path: str) -> bool:
    return any(under(path, p) for p in PROTECTED) or bool(_HOME_DOTS.match(path))


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


def work_paths(workdir: str | None, artifacts: Sequence[str], named: Sequence[str]) -> list[str]:
    """The task's work paths by `RULE`: sorted, none under another, none protected or ``/``."""
    candidates = [workdir or "", ARTIFACTS, *artifacts, *named]
    clean = sorted({c for c in (_clean(p) for p in candidates) if c is not None and not protected(c)})
    kept: list[str] = []
    for c in clean:  # sorted: an ancestor comes before its descendants
        if not any(under(c, k) for k in kept):
            kept.append(c)
    return kept


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
    """What a trusted verifier's container gets of the agent's changes."""

    #: Paths whose whole subtree is copied from the agent's container (none under another).
    copy: tuple[str, ...]
    #: Paths removed in the verifier's container (the agent deleted them).
    delete: tuple[str, ...]
    #: The agent's changes outside its work paths (or protected): recorded, not carried.
    outside: tuple[Change, ...]


def plan(diff: Iterable[dict], work: Sequence[str]) -> Plan:
    """The copy plan from the daemon's diff (``[{"Path": ..., "Kind": 0|1|2}]``) and the work
    paths. Within a work path: a deletion is removed (the topmost deleted path); an addition
    is copied with its subtree (the topmost added path); a change is copied when nothing
    below it changed (a file, a link, or a directory whose own entry changed), else what
    changed below it is."""
    changes = sorted({(str(d.get("Path", "")), int(d.get("Kind", 0))) for d in diff if isinstance(d, dict)})
    carried, outside = [], []
    for path, kind in changes:
        clean = _clean(path)
        if clean is None or clean == ARTIFACTS or _harness_made(clean):
            continue
        change = Change(path=clean, kind=KINDS[kind] if 0 <= kind < 3 else "changed")
        if protected(clean) or not any(under(clean, w) for w in work):
            outside.append(change)
        else:
            carried.append(change)
    paths = [c.path for c in carried]
    has_below = {p for p in paths if any(q != p and under(q, p) for q in paths)}
    delete = _topmost(c.path for c in carried if c.kind == "deleted")
    copy = _topmost(c.path for c in carried if c.kind == "added"
                    or (c.kind == "changed" and c.path not in has_below))
    copy = [p for p in copy if not any(under(p, d) for d in delete)]
    return Plan(copy=tuple(copy), delete=tuple(delete), outside=tuple(outside))


def _harness_made(path: str) -> bool:
    """A path of the harness's own in the agent's container (its mounts, log directories and
    uploads; the agent's artifacts below /logs/artifacts are the agent's)."""
    return any(under(path, h) for h in HARNESS_PATHS) and not under(path, ARTIFACTS)


def _topmost(paths: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for p in sorted(set(paths)):
        if not any(under(p, k) for k in kept):
            kept.append(p)
    return kept
