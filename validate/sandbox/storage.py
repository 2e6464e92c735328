"""Per-attempt storage: one fresh, size- and inode-capped tmpfs per attempt, and its removal.

    <parent>/                       mode 0711 root (default DEFAULT_PARENT)
        <run label>/                mode 0711 root: one per run, swept by the next start
            <attempt name>/         a tmpfs: size=storage_mb, nr_inodes=storage_inodes,
                                    nosuid, nodev, noexec; mode 0700 root (0710 with a group)

Everything an attempt writes (its workspace, its /tmp, the agent's files) lives on that
tmpfs, so the sum of its bytes and its count of files are capped, whatever their sizes
(RLIMIT_FSIZE caps one file only). The tmpfs is in memory, never on a host disk; leaving
the context unmounts it (lazily: a leftover process holding a file cannot stop the removal).
A run that was killed leaves its tmpfs mounted: `sweep` removes them, and every backend
calls it for its run label when it opens (`open_sandbox`).

`remove_tree` removes a directory tree without recursion and without following symlinks,
file-descriptor relative, so neither a 5,000-deep tree nor a symlink planted by an agent
can make it fail or reach outside the tree.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import signal
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from validate.core.errors import SandboxError
from validate.sandbox.base import Limits

#: Where attempt storage is mounted unless a caller says otherwise; only mount points live here.
DEFAULT_PARENT = Path("/run/deshuffle-validate/attempts")

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MNT_DETACH, _UMOUNT_NOFOLLOW = 0x2, 0x8
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _component(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} is not a plain file name ([A-Za-z0-9._-], at most 200 characters)"
        )
    return value


def _mkdir(path: Path) -> None:
    """Create `path` (and its parents) as root-owned 0711: traversable, not listable."""
    for p in reversed([path, *path.parents]):
        try:
            p.mkdir(mode=0o711)
        except FileExistsError:
            continue
        p.chmod(0o711)


def mount_tmpfs(target: Path, limits: Limits, gid: int | None = None, noexec: bool = True) -> None:
    """Mount a fresh tmpfs capped at `limits.storage_mb` MiB and `limits.storage_inodes` inodes.

    The root is mode 0700 root; with `gid`, 0710 root:gid, for a sandbox that resolves its
    bind sources as the agent's uid (bwrap drops root before it mounts anything). `noexec`
    False: programs on it may run (a trial's ``/solution`` and ``/tests``, bound from it)."""
    mode, group = ("0710", gid) if gid is not None else ("0700", 0)
    options = f"size={limits.storage_mb}m,nr_inodes={limits.storage_inodes},mode={mode},uid=0,gid={group}"
    flags = _MS_NOSUID | _MS_NODEV | (_MS_NOEXEC if noexec else 0)
    if _libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, options.encode()) != 0:
        e = ctypes.get_errno()
        raise SandboxError(f"storage: cannot mount a tmpfs at {target} ({options}): {os.strerror(e)}")


_MS_REMOUNT = 0x20


def ensure_room(target: Path, inodes: int, size_bytes: int, noexec: bool = True) -> bool:
    """The tmpfs at `target` (`mount_tmpfs`) grown, when it must be, so that at least `inodes`
    inodes and `size_bytes` bytes are free: what a harness needs to start a container again on
    a layer its agent filled. Whether it was grown."""
    st = os.statvfs(target)
    more_inodes = max(0, inodes - st.f_favail)
    more_bytes = max(0, size_bytes - st.f_bavail * st.f_frsize)
    if not more_inodes and not more_bytes:
        return False
    size_kib = -(-(st.f_blocks * st.f_frsize + more_bytes) // 1024)
    options = f"size={size_kib}k,nr_inodes={st.f_files + more_inodes}"
    flags = _MS_REMOUNT | _MS_NOSUID | _MS_NODEV | (_MS_NOEXEC if noexec else 0)
    if _libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, options.encode()) != 0:
        e = ctypes.get_errno()
        raise SandboxError(f"storage: cannot grow the tmpfs at {target} ({options}): {os.strerror(e)}")
    return True


def unmount(target: Path) -> None:
    """Detach every mount stacked on `target` (never following a symlink); none is fine."""
    for _ in range(64):
        if _libc.umount2(os.fsencode(target), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
            e = ctypes.get_errno()
            if e in (errno.EINVAL, errno.ENOENT):
                return
            raise SandboxError(f"storage: cannot unmount {target}: {os.strerror(e)}")


@contextmanager
def attempt_storage(run_label: str, name: str, limits: Limits, gid: int | None = None,
                    parent: Path = DEFAULT_PARENT, noexec: bool = True) -> Iterator[Path]:
    """A fresh tmpfs at ``parent/run_label/name`` for one attempt; yields its path.

    On exit it is unmounted and its mount point removed, whatever the attempt left in it."""
    base = parent / _component(run_label, "run label")
    target = base / _component(name, "attempt name")
    _mkdir(base)
    made = False
    try:
        with _interrupts_held():  # made and mounted whole, or released in `finally`
            try:
                target.mkdir(mode=0o700)
            except FileExistsError:
                raise SandboxError(f"storage: {target} already exists (attempt names must be unique "
                                   "per run)") from None
            made = True
            mount_tmpfs(target, limits, gid, noexec)
        yield target
    finally:
        if made:
            with _interrupts_held():
                release(target)


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold a SIGINT that arrives meanwhile and raise it after: a Ctrl-C, or a cancelled Ray
    task (Ray raises its KeyboardInterrupt through SIGINT in the worker's main thread). One that
    landed between the unmount and the removal left the mount point behind, one right after
    the mount left it mounted. Only the main thread receives signals, so only it holds them."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # not the main thread, or a handler Python did not install (it could not be put back)
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)  # now, to the handler that was there


def release(target: Path) -> None:
    """Unmount `target` and remove what is left of it (nothing, unless it was never mounted)."""
    unmount(target)
    remove_tree(target)


def sweep(parent: Path, run_label: str) -> list[str]:
    """Unmount and remove every attempt storage a killed process of run `run_label` left under
    `parent`; returns the names removed (sorted)."""
    base = parent / _component(run_label, "run label")
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    for name in names:
        release(base / name)
    try:
        base.rmdir()
    except OSError:
        pass  # a concurrent attempt of this run created a new one meanwhile
    return names


def remove_tree(path: Path) -> None:
    """Remove `path` and everything under it; a symlink is removed, never followed.

    Iterative and fd-relative: one open directory at a time (the parent is reopened through
    ``..`` and checked against the device and inode seen on the way down), so the depth of
    the tree costs neither stack nor file descriptors, and no path ever exceeds PATH_MAX."""
    path = Path(path)
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top.st_mode):
        os.unlink(path)
        return
    parent_fd = os.open(path.parent, _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        fd = os.open(path.name, _DIR_FLAGS, dir_fd=parent_fd)
        _empty_and_climb(fd, [(path.name, (top.st_dev, top.st_ino))], parent_fd)
    finally:
        os.close(parent_fd)


def _first_subdir(fd: int) -> str | None:
    """Unlink every non-directory of the open directory `fd` up to its first subdirectory."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                return entry.name
            os.unlink(entry.name, dir_fd=fd)
    return None


def _empty_and_climb(fd: int, stack: list[tuple[str, tuple[int, int]]], top_parent_fd: int) -> None:
    """Depth-first removal below the open directory `fd`, whose path from the top is `stack`."""
    try:
        while True:
            sub = _first_subdir(fd)
            if sub is not None:
                child = os.open(sub, _DIR_FLAGS, dir_fd=fd)
                st = os.fstat(child)
                os.close(fd)
                fd = child
                stack.append((sub, (st.st_dev, st.st_ino)))
                continue
            name, _ = stack.pop()
            if not stack:
                os.close(fd)
                fd = -1
                os.rmdir(name, dir_fd=top_parent_fd)
                return
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            st = os.fstat(up)
            if (st.st_dev, st.st_ino) != stack[-1][1]:
                os.close(up)
                raise OSError(errno.ESTALE,
                              f"remove_tree: the directory above {name!r} was moved during removal")
            os.close(fd)
            fd = up
            os.rmdir(name, dir_fd=fd)
    finally:
        if fd >= 0:
            os.close(fd)
