"""Unpacking one task archive (a published row's ``task_binary``) as hostile input.

`unpack_archive` writes a tar archive (plain, gzip, bzip2 or xz) into a new directory the
caller made private, and returns what was wrong with it instead of raising: the first
problem ends the row (a task that unpacked only in part is no task). Nothing is ever written
outside that directory, and nothing is read that the limits do not allow:

- a member's name must be a relative path of plain components (no ``..``, not absolute, UTF-8,
  no deeper than ``max_depth``); ``./`` prefixes are dropped;
- a symlink must point inside the task (resolved lexically from where it stands); no later
  member may be written through one; a hard link must name an earlier regular file of the
  same archive (its bytes are copied);
- device files, FIFOs and sparse members are refused, and so is a name given twice to a
  file;
- the archive's bytes, every member's declared size, the running total, the member count
  and every extended header (PAX, GNU long names, read whole into memory by `tarfile`) are
  capped before anything is read, so a compression bomb stops at its first header.

Files are written with ``O_EXCL | O_NOFOLLOW``, modes reduced to 0644 or 0755 (the
executable bit is all a task's build sees); directories are made one component at a time,
each checked to be a directory and not a link.
"""

from __future__ import annotations

import io
import lzma
import os
import posixpath
import stat
import tarfile
import zlib
from pathlib import Path

from environment.harbor.taskdir import Limits
from environment.protocol import EnvError

#: PAX and GNU long-name headers are read whole into memory by `tarfile`: kept small.
MAX_HEADER_BYTES = 1 << 20
_HEADERS = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
            tarfile.GNUTYPE_LONGLINK)


class ArchiveProblem(EnvError):
    """Why an archive is refused: one line naming the member."""


class _BoundedInfo(tarfile.TarInfo):
    """A header whose extended-header payload is checked before `tarfile` reads it."""

    def _proc_member(self, tarfile_):
        if self.type in _HEADERS and self.size > MAX_HEADER_BYTES:
            raise ArchiveProblem(f"an extended header of {self.size} bytes (more than {MAX_HEADER_BYTES})")
        return super()._proc_member(tarfile_)


def member_name(raw: str, max_depth: int) -> str:
    """The member's path inside the task ('' for the task directory itself), or `ArchiveProblem`."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ArchiveProblem(f"member {ascii(raw)}: its name is not UTF-8") from None
    if raw.startswith("/"):
        raise ArchiveProblem(f"member {raw!r}: an absolute path")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveProblem(f"member {raw!r}: its path leaves the task directory ('..')")
    if len(parts) > max_depth:
        raise ArchiveProblem(f"member {raw!r}: nested deeper than {max_depth} directories")
    return "/".join(parts)


class _Unpacker:
    """One archive into `dest`: the state the checks need across members."""

    def __init__(self, dest: Path, limits: Limits) -> None:
        self.dest, self.limits = dest, limits
        self.files: set[str] = set()
        self.links: set[str] = set()
        self.written = 0

    def _through_link(self, name: str) -> str | None:
        parts = name.split("/")
        return next((p for p in ("/".join(parts[:i]) for i in range(1, len(parts))) if p in self.links), None)

    def _parent(self, name: str) -> int:
        """An fd of `name`'s parent directory, made one component at a time, never through a link."""
        fd = os.open(self.dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for part in name.split("/")[:-1]:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except OSError:
            os.close(fd)
            raise ArchiveProblem(
                f"member {name!r}: its directory is not a directory in the archive"
            ) from None
        return fd

    def _write(self, name: str, chunks, mode: int) -> None:
        fd_dir = self._parent(name)
        try:
            fd = os.open(name.rsplit("/", 1)[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o755 if mode & 0o111 else 0o644, dir_fd=fd_dir)
        except OSError:
            raise ArchiveProblem(f"member {name!r}: given twice, or over a directory") from None
        finally:
            os.close(fd_dir)
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
        self.files.add(name)

    def _charge(self, name: str, size: int) -> None:
        lim = self.limits
        if size > lim.max_file_bytes:
            raise ArchiveProblem(f"member {name!r}: {size} bytes, over the "
                                 f"{lim.max_file_bytes}-byte file limit")
        if self.written + size > lim.max_task_bytes:
            raise ArchiveProblem(f"member {name!r}: the task unpacks to more than {lim.max_task_bytes} bytes")
        self.written += size

    def member(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        name = member_name(m.name, self.limits.max_depth)
        if not name:
            return  # the task directory's own entry
        via = self._through_link(name)
        if via is not None:
            raise ArchiveProblem(f"member {name!r}: written through the symlink {via!r}")
        if m.isdir():
            fd = self._parent(name + "/x")
            os.close(fd)
        elif m.issym():
            self._symlink(name, m.linkname)
        elif m.islnk():
            self._hardlink(name, m.linkname)
        elif m.isreg() and not m.issparse():
            self._charge(name, m.size)
            data = tar.extractfile(m)
            assert data is not None  # extractfile gives None only for what is not a regular file
            self._write(name, iter(lambda: data.read(1 << 20), b""), m.mode)
        else:
            kind = "a device file" if m.ischr() or m.isblk() else "a FIFO" if m.isfifo() else \
                "a sparse file" if m.issparse() else f"an entry of type {m.type!r}"
            raise ArchiveProblem(
                f"member {name!r}: {kind}; a task holds regular files, directories and links"
            )

    def _symlink(self, name: str, target: str) -> None:
        if not target or target.startswith("/"):
            raise ArchiveProblem(f"member {name!r}: a symlink out of the task (to {target!r})")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if resolved == ".." or resolved.startswith("../"):
            raise ArchiveProblem(f"member {name!r}: a symlink out of the task (to {target!r})")
        fd_dir = self._parent(name)
        try:
            os.symlink(target, name.rsplit("/", 1)[-1], dir_fd=fd_dir)
        except OSError:
            raise ArchiveProblem(f"member {name!r}: given twice, or over a directory") from None
        finally:
            os.close(fd_dir)
        self.links.add(name)

    def _hardlink(self, name: str, target: str) -> None:
        try:
            source = member_name(target, self.limits.max_depth)
        except ArchiveProblem:
            source = None
        if source not in self.files:
            raise ArchiveProblem(f"member {name!r}: a hard link to {target!r}, which is no earlier "
                                 "file of the task")
        fd = os.open(self.dest / source, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as src:
            st = os.fstat(src.fileno())
            self._charge(name, st.st_size)
            self._write(name, iter(lambda: src.read(1 << 20), b""), st.st_mode)


def unpack_archive(data: bytes, dest: Path, limits: Limits = Limits()) -> int:
    """Unpack `data` into the empty private directory `dest` and return the bytes written;
    `ArchiveProblem` names the first thing wrong (the directory then holds a partial task,
    which the caller discards)."""
    if len(data) > limits.max_archive_bytes:
        raise ArchiveProblem(f"the archive is {len(data)} bytes, over the "
                             f"{limits.max_archive_bytes}-byte limit")
    unpacker = _Unpacker(dest, limits)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|*", tarinfo=_BoundedInfo) as tar:
            for n, m in enumerate(tar, 1):
                if n > limits.max_entries:
                    raise ArchiveProblem(f"more than {limits.max_entries} members")
                unpacker.member(tar, m)
    except ArchiveProblem:
        raise
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError) as e:
        raise ArchiveProblem(f"not a readable tar archive ({type(e).__name__}: {e})") from None
    return unpacker.written


def task_root(dest: Path) -> Path:
    """The task directory an archive unpacked to: `dest`, or its one subdirectory when the
    archive wrapped the task in a folder of its own (``<name>/task.toml``)."""
    names = os.listdir(dest)
    if len(names) == 1 and "task.toml" not in names:
        only = dest / names[0]
        if stat.S_ISDIR(os.lstat(only).st_mode) and (only / "task.toml").is_file():
            return only
    return dest
