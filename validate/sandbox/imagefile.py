"""The sandbox image as one file: `validate image export` and `validate image import`.

The file *is* the image store's ``rootfs.tar``, byte for byte, named ``sha256-<hex>.tar``
after its own sha256 — which is the contract's ``execution.image_digest`` and docker's layer
diff_id. Nothing else travels: the store's record (``image.json``) is recomputed from those
bytes, bwrap's tree is unpacked from them and docker imports them, so the file is
content-addressed by construction and ``sha256sum`` checks it on any machine. That is what
lets a reviewer re-verify a committed contract after Debian's archive moved on and a fresh
``validate image build`` gives other bytes.

An imported file is hostile input until proven otherwise; the importing harness runs as root
and unpacks it. It is copied into a staging directory of the store (never read twice from a
path someone else may rewrite), and refused, before anything in the store or the daemon
changes, unless: its sha256 is the digest its name (or ``--digest``) gives; it is a complete
uncompressed tar archive (a multiple of 512 bytes ending in the end-of-archive blocks, every
member readable); every member's path stays under the root, its parent directory came before
it (so nothing is ever written through a symlink), no path comes twice, a hard link points
to an earlier regular file, and a device is one of the harmless character devices a Debian
rootfs holds; and it is a sandbox image (a python3 interpreter package, ``usr/bin/python3``).
An image already in the store (or docker) under that name with another digest is replaced
only with ``--replace``. The record written carries this code's build recipe, so a later
``validate image build`` keeps the imported image instead of rebuilding over it.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from validate.core.errors import ProfileUnavailable, ValidateError
from validate.core.paths import ImagePaths
from validate.evidence.journal import atomic_write, file_sha256
from validate.sandbox import backend_class
from validate.sandbox.docker.image import image_layers
from validate.sandbox.image import (
    DPKG_STATUS,
    ImageRecord,
    describe_tarball,
    member_path,
    read_record,
    require_record,
)

NAME_RE = re.compile(r"sha256-([0-9a-f]{64})\.tar")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
CHUNK = 1 << 20
BLOCK = 512
#: Character devices (major, minor) an image may hold: null, zero, full, random, urandom,
#: tty, console, ptmx — what mmdebstrap puts in /dev. Any other device (a disk, memory) is refused.
HARMLESS_DEVICES = frozenset({(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2)})

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


class ImageFileRefused(ValidateError):
    """An image file that is not what its name says, or not a safe sandbox image."""


def file_name(digest: str) -> str:
    """The exported file's name for an image digest: ``sha256:<hex>`` → ``sha256-<hex>.tar``."""
    return f"sha256-{digest.removeprefix('sha256:')}.tar"


def export(image: str, out: Path, log=print, progress: Progress | None = None) -> Path:
    """Write the store's image `image` to `out` (a directory, created if missing, or a file
    path named ``sha256-<hex>.tar``); returns the file. The bytes are hashed as they are
    copied and must be the record's digest: a store whose tarball changed is not exported."""
    paths = ImagePaths(image)
    record = require_record(paths)
    name = file_name(record.digest)
    dest = out / name if out.is_dir() or not out.suffix else out
    if dest.name != name:
        raise ValidateError(f"--out: {out} must be a directory or a file named {name} (the image's digest)")
    if dest.is_file() and "sha256:" + file_sha256(dest) == record.digest:
        log(f"{dest}: present ({record.digest})")
        return dest
    partial = dest.with_name(f".{name}.{os.getpid()}.partial")
    try:
        with _os_errors("--out"):
            dest.parent.mkdir(parents=True, exist_ok=True)
            got = copy_hashed(paths.tarball, partial, progress)
        if got != record.digest:
            raise ValidateError(f"image export: {paths.tarball} has {got}, not its record's {record.digest}; "
                                f"rebuild it with `validate image build`")
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    log(f"exported {image} to {dest} ({record.digest}, {dest.stat().st_size:,} bytes)")
    return dest


def import_file(file: Path, image: str, digest: str | None = None, backends: list[str] | None = None,
                replace: bool = False, log=print, progress: Progress | None = None) -> ImageRecord:
    """Check `file` (see the module docstring), install it in the store as `image`, then let
    each backend prepare it (`Sandbox.prepare_image`): by default bwrap, and docker when a
    daemon answers at ``DOCKER_HOST``. Docker's import is checked there: its one layer's
    diff_id must be the digest."""
    expected = expected_digest(file, digest)
    # a wrong name: refused before the copy
    chosen = [backend_class(b) for b in backends] if backends else None
    paths = ImagePaths(image)
    with _os_errors("image import"):
        paths.base.mkdir(parents=True, exist_ok=True)
        # same filesystem: a rename installs
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=paths.base))
    try:
        staged = staging / "rootfs.tar"
        with _os_errors("image import"):
            got = copy_hashed(file, staged, progress)
        if got != expected:
            raise ImageFileRefused(f"{file}: its bytes have {got}, not the expected {expected} "
                                   f"(forged, truncated or damaged: export it again)")
        record = check_image_tarball(staged, file)
        classes = chosen or [backend_class(b) for b in default_backends()]
        _refuse_replacing(paths, record, replace, docker="docker" in [c.backend for c in classes])
        log(f"{file}: {got} as named; a complete tar archive, every member under its root; "
            f"python {record.python}, {len(record.packages)} packages")
        if not chosen and "docker" not in [c.backend for c in classes]:
            log("no docker daemon answers (DOCKER_HOST): importing for bwrap only; rerun with a "
                "daemon for docker")
        with _os_errors("image import"):
            _install(paths, staged, record, log)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for cls in classes:
        cls.prepare_image(paths, log)
    return record


@contextmanager
def _os_errors(what: str):
    """An unreadable, unwritable or full file system: one line naming the path, not a traceback."""
    try:
        yield
    except OSError as e:
        raise ValidateError(f"{what}: {e.filename or 'a file'}: {e.strerror or e}") from None


def expected_digest(file: Path, digest: str | None) -> str:
    """The digest `file` must have: the one its name gives, or ``--digest``; both must agree."""
    if not file.is_file():
        raise ValidateError(f"{file}: no such file (or not a regular file)")
    if digest is not None and not DIGEST_RE.fullmatch(digest):
        raise ValidateError(f"--digest: expected sha256:<64 hex digits>, got {digest!r}")
    named = NAME_RE.fullmatch(file.name)
    by_name = f"sha256:{named.group(1)}" if named else None
    if by_name and digest and by_name != digest:
        raise ImageFileRefused(f"{file}: its name says {by_name}, --digest says {digest}")
    if not (by_name or digest):
        raise ValidateError(f"{file}: the name is not sha256-<hex>.tar, so it names no digest; "
                            f"pass --digest sha256:<hex> (the contract's execution.image_digest)")
    named_digest = by_name or digest
    assert named_digest is not None  # one of them is set, or the line above raised
    return named_digest


def default_backends() -> list[str]:
    """bwrap (the store's unpacked tree), and docker if a daemon answers at ``DOCKER_HOST``."""
    return ["bwrap", "docker"] if _docker_answers() else ["bwrap"]


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=10).ping()
        return True
    except Exception:  # noqa: BLE001 - no SDK, no socket, a refused or broken daemon: none answers
        return False


# --- checking a file ---------------------------------------------------------------------------

def copy_hashed(src: Path, dst: Path, progress: Progress | None = None) -> str:
    """Copy `src` to `dst` (fsynced), returning ``sha256:<hex>`` of the bytes copied."""
    import hashlib

    sha, done = hashlib.sha256(), 0
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        total = os.fstat(fi.fileno()).st_size
        for block in iter(lambda: fi.read(CHUNK), b""):
            sha.update(block)
            fo.write(block)
            done += len(block)
            if progress is not None:
                progress(done, total)
        fo.flush()
        os.fsync(fo.fileno())
    return "sha256:" + sha.hexdigest()


def check_image_tarball(tarball: Path, label: Path) -> ImageRecord:
    """Refuse a tarball that is incomplete, unsafe to unpack or not a sandbox image (naming
    `label`, the file as the user gave it); return its record, recomputed from its bytes."""
    _check_complete(tarball, label)
    kinds = _check_members(tarball, label)
    for needed in ("usr/bin/python3", DPKG_STATUS):
        if needed not in kinds:
            raise ImageFileRefused(f"{label}: not a sandbox image: no /{needed}")
    try:
        return describe_tarball(tarball)
    except ValidateError as e:
        raise ImageFileRefused(f"{label}: not a sandbox image: {e}") from None


def _check_complete(tarball: Path, label: Path) -> None:
    size = tarball.stat().st_size
    with open(tarball, "rb") as fh:
        fh.seek(max(size - 2 * BLOCK, 0))
        tail = fh.read()
    if size < 2 * BLOCK or size % BLOCK or tail.strip(b"\0"):
        raise ImageFileRefused(f"{label}: truncated or not a tar archive: {size:,} bytes do not end in "
                               f"tar's end-of-archive blocks")


def _check_members(tarball: Path, label: Path) -> dict[str, str]:
    """One streaming pass over the members; returns path → kind ('d', 'f', 'l', 'c', 'p')."""
    kinds: dict[str, str] = {".": "d"}  # the root, whether or not the archive has a member for it
    try:
        with tarfile.open(tarball, mode="r|") as tar:
            root_member = False
            for m in tar:
                path = _inside(m.name, label)
                if path == "." and m.isdir() and not root_member:
                    root_member = True  # the root's own owner and mode; mmdebstrap writes it after ./dev
                    continue
                if path in kinds:
                    raise ImageFileRefused(f"{label}: {m.name!r} comes twice")
                parent = path.rpartition("/")[0] or "."
                if kinds.get(parent) != "d":
                    raise ImageFileRefused(f"{label}: {m.name!r} is not under a directory that came before "
                                           f"it ({parent!r} is {_kind_name(kinds.get(parent))})")
                kinds[path] = _member_kind(m, kinds, label)
    except tarfile.TarError as e:
        raise ImageFileRefused(f"{label}: truncated or not a tar archive ({e})") from None
    return kinds


def _inside(name: str, label: Path) -> str:
    path = member_path(name)
    parts = path.split("/")
    if name.startswith("/") or (path != "." and ({"", ".", ".."} & set(parts))):
        raise ImageFileRefused(f"{label}: member {name!r} escapes the image's root")
    return path


def _member_kind(m: tarfile.TarInfo, kinds: dict[str, str], label: Path) -> str:
    if m.isreg():
        return "f"
    if m.isdir():
        return "d"
    if m.issym():
        return "l"  # its target is read inside the sandbox's root; nothing is ever unpacked through it
    if m.islnk():
        target = _inside(m.linkname, label)
        if kinds.get(target) != "f":
            raise ImageFileRefused(f"{label}: hard link {m.name!r} points to {m.linkname!r}, "
                                   f"not to a regular file before it")
        return "f"
    if m.ischr() and (m.devmajor, m.devminor) in HARMLESS_DEVICES:
        return "c"
    if m.isfifo():
        return "p"
    what = f"device {m.devmajor},{m.devminor}" if m.ischr() or m.isblk() else f"member type {m.type!r}"
    raise ImageFileRefused(f"{label}: {m.name!r} is a {what}, which no sandbox image may hold")


def _kind_name(kind: str | None) -> str:
    if kind is None:
        return "absent"
    return {"f": "a file", "l": "a symlink", "c": "a device", "p": "a fifo"}.get(kind, kind)


# --- installing ----------------------------------------------------------------------------

def _refuse_replacing(paths: ImagePaths, record: ImageRecord, replace: bool, docker: bool) -> None:
    if replace:
        return
    present = read_record(paths)
    if present is not None and paths.tarball.is_file() and present.digest != record.digest:
        raise ValidateError(f"image import: the store already holds {paths.name} as {present.digest} "
                            f"({paths.root}); pass --replace to replace it with {record.digest}, "
                            f"or import it under another --image name")
    layers = _docker_layers(paths.name) if docker else None
    if layers is not None and layers != [record.digest]:
        raise ValidateError(f"image import: docker already has {paths.name} with layers {layers}; pass "
                            f"--replace to retag it to {record.digest}, or import it under "
                            "another --image name")


def _docker_layers(name: str) -> list[str] | None:
    import docker
    from docker.errors import DockerException, ImageNotFound

    try:
        return image_layers(docker.from_env(timeout=60).images.get(name))
    except ImageNotFound:
        return None
    except DockerException as e:
        raise ProfileUnavailable(
            f"image import: cannot read docker's {name} ({e}); is dockerd running?"
        ) from None


def _install(paths: ImagePaths, staged: Path, record: ImageRecord, log) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    os.replace(staged, paths.tarball)
    atomic_write(paths.record, (record.model_dump_json(indent=1) + "\n").encode())
    log(f"image store: {paths.name} ← {record.digest} (python {record.python}, {len(record.packages)} "
        f"packages) at {paths.root}")
