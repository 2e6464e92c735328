"""The trusted verifier over an unpacked tree (the bwrap trial): the agent's changes read from
its overlay's writable layer, and the layer of them a verifier gets.

The same reading serves a trusted docker trial on the harness's own machine (the overlay2
driver): the agent's container's writable layer is read as it lies on the daemon's disk, and
the carried paths are written into the verifier's container's writable layer before it starts
(`validate.taskdir.trial.trusted`), no archive through the daemon. A bwrap trial runs on an overlay whose
lower layer is the task image's unpacked tree (never written) and whose upper layer is the trial's own capped
tmpfs. Once the agent's sandbox is gone and the overlay unmounted, that upper directory is exactly what the
agent changed, as the kernel recorded it: a deleted path is a whiteout (a character device 0/0), a directory
replaced whole is marked opaque. `diff` reads it as the daemon's diff reads a container
(`validate.taskdir.trial.workpaths.plan` takes either); `carried_layer` copies the planned subtrees —
whiteouts and opaque marks included, devices, fifos and sockets dropped — into a directory
that becomes the middle layer of the verifier's fresh overlay: the pristine tree below, only
the agent's changes under its work paths above it, a fresh writable layer on top.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from validate.core.errors import SandboxError
from validate.taskdir.trial.workpaths import under

#: Entries of an upper layer read, at most (a tree past it is named, not read further).
MAX_ENTRIES = 200_000


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def diff(upper: Path, lower: Path | list[Path]) -> tuple[list[dict], bool]:
    """The changes the upper layer holds, as ``[{"Path": "/x", "Kind": 0|1|2}]`` (changed,
    added, deleted: a path of the upper layer that a lower layer has is changed), and whether
    the listing stopped at `MAX_ENTRIES`. Iterative: no depth the agent made is a recursion."""
    lowers = lower if isinstance(lower, list) else [lower]
    out: list[dict] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(upper / rel if rel else upper) as it:
                names = sorted(e.name for e in it)
        except OSError:
            continue
        for name in names:
            path = f"{rel}/{name}" if rel else name
            try:
                st = os.lstat(upper / path)
            except OSError:
                continue
            if _is_whiteout(st):
                kind = 2
            else:
                kind = 0 if any(os.path.lexists(low / path) for low in lowers) else 1
            out.append({"Path": "/" + path, "Kind": kind})
            if len(out) >= MAX_ENTRIES:
                return out, True
            if stat.S_ISDIR(st.st_mode):
                stack.append(path)
    return out, False


def carried_layer(upper: Path, target: Path, paths: tuple[str, ...], deleted: tuple[str, ...],
                  work: tuple[str, ...] = ()) -> list[str]:
    """Copy each of `paths` and `deleted` (absolute, as planned) from the upper layer into
    `target` with its subtree, whiteouts and opaque marks kept, its files hard-linked (``cp
    -al``, as root: the carried layer costs the trial's storage no second copy of the agent's
    work), parents made with the upper layer's modes (and its opaque mark, inside the `work`
    paths: a directory the agent replaced stays replaced); return the devices, fifos and
    sockets left out (named)."""
    if not target.exists():
        target.mkdir(mode=0o755)
    dropped: list[str] = []
    for path in (*paths, *deleted):
        rel = path.lstrip("/")
        source = upper / rel
        if not os.path.lexists(source):
            continue
        _parents(upper, target, rel)
        if os.path.lexists(target / rel):  # what the target layer holds there gives way to the agent's
            subprocess.run(["rm", "-rf", "--one-file-system", str(target / rel)], capture_output=True)
        done = subprocess.run(["cp", "-a", "--no-target-directory", str(source), str(target / rel)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SandboxError(f"trusted verifier: cannot carry {path}: {done.stderr.strip()[:300]}")
        if path in paths:
            dropped += _drop_specials(target, rel)
    return sorted(dropped)


def _parents(upper: Path, target: Path, rel: str, work: tuple[str, ...] = ()) -> None:
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        made = target / sub
        if made.is_dir() and not made.is_symlink():
            continue
        st = os.lstat(upper / sub)
        os.mkdir(made, stat.S_IMODE(st.st_mode))
        os.chown(made, st.st_uid, st.st_gid)
        if _opaque(upper / sub) and any(under("/" + sub, w) for w in work):
            os.setxattr(made, OPAQUE, b"y", follow_symlinks=False)


def _drop_specials(target: Path, rel: str) -> list[str]:
    """Remove the devices (whiteouts aside), fifos and sockets copied under `rel`; their paths."""
    dropped: list[str] = []
    stack = [rel]
    while stack:
        path = stack.pop()
        try:
            st = os.lstat(target / path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                stack += [f"{path}/{n}" for n in sorted(os.listdir(target / path))]
            except OSError:
                pass
        elif not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) or _is_whiteout(st)):
            os.unlink(target / path)
            dropped.append("/" + path)
    return dropped


OPAQUE = "trusted.overlay.opaque"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Reverted:
    """What `revert` moved out of a writable layer (into `stash`, each entry under a name of its
    own) and the opaque marks it took off; `restore` puts them back: the agent's own layer
    again, for the reference solution's replay in its container."""

    def __init__(self, upper: Path, stash: Path) -> None:
        self.upper, self.stash = upper, stash
        self.moved: list[tuple[str, str]] = []  # (path below the layer, name in the stash)
        self.unmarked: list[str] = []
        self.dropped: list[str] = []

    def restore(self) -> bool:
        """Everything moved put back where it was, never through a link: a path whose parent
        is no longer a directory of the layer (what ran since changed it) stays aside, and the
        answer is False. What now stands where an entry goes back is moved aside itself."""
        whole = True
        stash_fd = os.open(self.stash, _DIR)
        try:
            for n, (rel, name) in enumerate(reversed(self.moved)):
                parent = _open_below(self.upper, rel.split("/")[:-1])
                if parent is None:
                    whole = False
                    continue
                leaf = rel.split("/")[-1]
                try:
                    try:
                        os.lstat(leaf, dir_fd=parent)
                        os.rename(leaf, f"since-{n}", src_dir_fd=parent, dst_dir_fd=stash_fd)
                    except FileNotFoundError:
                        pass
                    os.rename(name, leaf, src_dir_fd=stash_fd, dst_dir_fd=parent)
                finally:
                    os.close(parent)
            for rel in self.unmarked:
                fd = _open_below(self.upper, rel.split("/"))
                if fd is None:
                    whole = False
                    continue
                try:
                    os.setxattr(fd, OPAQUE, b"y")
                finally:
                    os.close(fd)
        finally:
            os.close(stash_fd)
        self.moved, self.unmarked = [], []
        return whole


def _open_below(root: Path, parts: list[str]) -> int | None:
    """A descriptor of the directory `parts` below `root`, every component opened without
    following a link; None when one is missing or not a directory."""
    fd = os.open(root, _DIR)
    for part in parts:
        try:
            nxt = os.open(part, _DIR, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = nxt
    return fd


def revert(upper: Path, stash: Path, keep: tuple[str, ...], work: list[str]) -> Reverted:
    """Make a stopped container's writable layer hold only the agent's changes at or under
    `keep` (the carried paths, deletions included): walked from the top, every entry that is
    neither kept nor above a kept path moved aside into `stash` (on the same filesystem: a
    rename), so the image's own version shows again — whatever a listing of the changes
    said, however many there are; a directory above a kept path but outside the work paths
    loses its opaque mark (the image's other entries there show again); devices, fifos and
    sockets under a kept path moved aside too (`Reverted.dropped`). Started again, the
    container is the image with only the carried changes."""
    done = Reverted(upper, stash)
    kept = set(keep)
    above = {a for k in keep for a in _ancestors(k)}
    stack = [""]
    while stack:
        rel = stack.pop()
        fd = _open_below(upper, rel.split("/") if rel else [])
        if fd is None:
            continue
        try:
            names = sorted(os.listdir(fd))
        finally:
            os.close(fd)
        for name in names:
            child = f"{rel}/{name}" if rel else name
            path = "/" + child
            if path in kept:
                _drop_specials_below(done, child)
            elif path in above:
                st = os.lstat(upper / child)
                if not stat.S_ISDIR(st.st_mode):
                    _move(done, child)
                    continue
                if not any(under(path, w) for w in work) and _opaque(upper / child):
                    os.removexattr(upper / child, OPAQUE, follow_symlinks=False)
                    done.unmarked.append(child)
                stack.append(child)
            else:
                _move(done, child)
    return done


def _ancestors(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def _drop_specials_below(done: Reverted, rel: str) -> None:
    """Devices (whiteouts aside), fifos and sockets at or under `rel` moved aside, named."""
    stack = [rel]
    while stack:
        path = stack.pop()
        try:
            st = os.lstat(done.upper / path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                stack += [f"{path}/{n}" for n in sorted(os.listdir(done.upper / path))]
            except OSError:
                pass
        elif not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) or _is_whiteout(st)):
            _move(done, path)
            done.dropped.append("/" + path)


def _opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _move(done: Reverted, rel: str) -> None:
    name = str(len(done.moved))
    os.rename(done.upper / rel, done.stash / name)
    done.moved.append((rel, name))
