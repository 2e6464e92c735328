"""The sandbox image: built offline from Debian packages, reproducibly, and described.

No image can be pulled here, so the image is made from the distribution's own packages:
``mmdebstrap --variant=essential --include=python3 bookworm`` writes a root filesystem
tarball using the machine's configured apt sources. The build is reproducible: with
``SOURCE_DATE_EPOCH`` set, mmdebstrap clamps every mtime and writes a name-sorted tar with
numeric owners, and the hooks below overwrite the few files it copies from the host
(hostname, resolv.conf, apt sources) and add the sandbox's mount points. Two builds from
the same package versions (with bookworm's mmdebstrap) give the same bytes, and nothing in
them comes from the build host.

The image's identity (`image_digest`) is the sha256 of that tarball. Each backend makes
the built tarball runnable for itself (`Sandbox.prepare_image`, called by `build`, which
knows no backend by name): docker imports it as one layer whose diff_id is exactly that
digest (`validate.sandbox.docker.image`); bwrap runs the same tree unpacked (`unpack_rootfs`)
and, once per process, checks that the tree on disk is still what the tarball holds
(`rootfs_facts`; `tree_digest` caches file hashes by inode and ctime). Backends read the
image's Debian packages from the image itself, so a contract made elsewhere can name the
packages that differ (`package_differences`). See `validate.core.paths`
for the store's layout; `validate.sandbox.imagefile` carries the tarball to another machine as one
file named by that digest (`validate image export` / `import`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from environment.protocol import canonical_json
from validate.core.errors import EvidenceError, ProfileUnavailable
from validate.core.paths import ImagePaths
from validate.evidence.journal import atomic_write
from validate.sandbox import backend_class

SUITE = "bookworm"
#: mmdebstrap clamps every mtime to this instant. Bookworm's release day: any fixed instant
#: makes the build reproducible; the build's own time would not.
SOURCE_DATE_EPOCH = 1686355200
MOUNT_POINTS = ("workspace", "agent", "answer_key")
#: Run in the finished tree: nothing of the build host may end up in the image.
CUSTOMIZE_HOOKS = (
    "printf 'sandbox\\n' > \"$1/etc/hostname\" && chmod 0644 \"$1/etc/hostname\"",
    "rm -f \"$1/etc/resolv.conf\" \"$1/etc/apt/sources.list\"",  # no network, nothing to install
    "mkdir -m 0755 " + " ".join(f'"$1/{m}"' for m in MOUNT_POINTS),
)
DPKG_STATUS = "var/lib/dpkg/status"


class ImageRecord(BaseModel):
    """What `validate image build` recorded of the tarball it made (``image.json``)."""

    schema_version: Literal[1] = Field(default=1, description="version of this record's layout")
    recipe: str = Field(description="sha256 of the build's inputs (suite, epoch, hooks): "
                                    "another recipe rebuilds")
    digest: str = Field(description="'sha256:<hex>' of rootfs.tar; docker's layer diff_id; the image_digest")
    tree_digest: str = Field(description="digest of the tree rootfs.tar unpacks to (see `tree_digest`)")
    python: str = Field(description="the image's Python version, e.g. '3.11.2'")
    packages: list[str] = Field(description="the image's Debian packages as sorted 'name=version' lines")


def recipe_digest() -> str:
    text = "\n".join([SUITE, str(SOURCE_DATE_EPOCH), "essential", "python3", *CUSTOMIZE_HOOKS])
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def read_record(paths: ImagePaths) -> ImageRecord | None:
    try:
        return ImageRecord.model_validate_json(paths.record.read_bytes())
    except (OSError, ValueError):
        return None


def build_rootfs(paths: ImagePaths, log=print) -> ImageRecord:
    """Create ``rootfs.tar`` and its record with mmdebstrap (skipped when both exist and the
    record's recipe is this one)."""
    record = read_record(paths)
    if paths.tarball.is_file() and record is not None and record.recipe == recipe_digest():
        log(f"rootfs tarball present: {paths.tarball} ({record.digest[:19]}…)")
        return record
    if shutil.which("mmdebstrap") is None:
        raise ProfileUnavailable("image build: mmdebstrap is not installed (apt-get install mmdebstrap)")
    paths.root.mkdir(parents=True, exist_ok=True)
    tmp = paths.root / "rootfs.partial.tar"  # mmdebstrap picks the format from the name: keep .tar last
    log(f"building a Debian {SUITE} rootfs with python3 (mmdebstrap, about 20-40 s) ...")
    argv = ["mmdebstrap", "--variant=essential", "--include=python3", "--quiet",
            *(f"--customize-hook={hook}" for hook in CUSTOMIZE_HOOKS), SUITE, str(tmp)]
    proc = subprocess.run(argv, capture_output=True, text=True,
                          env={**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)})
    if proc.returncode != 0 or not tmp.is_file():
        _remove(tmp)
        raise ProfileUnavailable(f"image build: mmdebstrap failed (exit {proc.returncode}): "
                                 f"{proc.stderr.strip()[-800:]}")
    record = describe_tarball(tmp)
    os.replace(tmp, paths.tarball)
    atomic_write(paths.record, (record.model_dump_json(indent=1) + "\n").encode())
    log(f"rootfs tarball built: {paths.tarball} ({record.digest[:19]}…, python {record.python}, "
        f"{len(record.packages)} packages)")
    return record


def describe_tarball(tarball: Path) -> ImageRecord:
    digest, tree, status = _scan_tarball(tarball)
    packages = parse_dpkg_status(status.decode())
    return ImageRecord(recipe=recipe_digest(), digest=digest, tree_digest=tree,
                       python=python_version(packages),
                       packages=[f"{name}={version}" for name, version in packages.items()])


def unpack_rootfs(paths: ImagePaths, log=print) -> None:
    """Unpack the tarball for bwrap (unless the tree already is what it holds)."""
    record = require_record(paths)
    if paths.rootfs.is_dir() and tree_digest(paths.rootfs) == record.tree_digest:
        log(f"rootfs unpacked: {paths.rootfs} ({record.digest[:19]}…)")
        return
    partial = paths.rootfs.with_name("rootfs.partial")
    _remove(partial)
    partial.mkdir(parents=True)
    # Extraction filters (PEP 706) came with Python 3.11.4; Debian 12's python3 is 3.11.2,
    # whose extractall has no `filter` and always does what "fully_trusted" names.
    trusted: dict[str, Any] = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    with tarfile.open(paths.tarball) as tar:  # our own tarball: owners, modes and devices kept as they are
        tar.extractall(partial, numeric_owner=True, **trusted)
    got = tree_digest(partial)
    if got != record.tree_digest:
        raise ProfileUnavailable(f"image build: {paths.rootfs} unpacked to tree {got[:19]}…, "
                                 f"not the tarball's {record.tree_digest[:19]}…")
    _remove(paths.rootfs)
    os.replace(partial, paths.rootfs)
    for parent in [paths.root, *paths.root.parents]:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)  # traversable (not listable) by the sandbox uid
    log(f"rootfs unpacked for bwrap: {paths.rootfs} ({record.digest[:19]}…)")


def build(name: str, backends: list[str], log=print) -> None:
    """Build the image's rootfs tarball, then let each backend named prepare it for itself
    (`Sandbox.prepare_image`); an unknown name is refused, naming the installed backends,
    before anything is built."""
    classes = [backend_class(b) for b in backends]
    paths = ImagePaths(name)
    build_rootfs(paths, log)
    for cls in classes:
        cls.prepare_image(paths, log)


# --- what an image holds --------------------------------------------------------------------

def parse_dpkg_status(text: str) -> dict[str, str]:
    """Installed packages of a dpkg status file, name → version, sorted by name. A package
    installed for two architectures is keyed ``name:arch`` for each."""
    found: list[tuple[str, str, str]] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^([A-Za-z][\w-]*):[ \t]*(.*)$", stanza, flags=re.MULTILINE))
        if "Package" in fields and "Version" in fields and fields.get("Status", "").endswith(" installed"):
            found.append((fields["Package"], fields.get("Architecture", ""), fields["Version"]))
    names = [name for name, _, _ in found]
    keyed = {(name if names.count(name) == 1 else f"{name}:{arch}"): version for name, arch, version in found}
    return dict(sorted(keyed.items()))


def python_version(packages: dict[str, str]) -> str:
    """The interpreter's upstream version: ``python3`` names the minor version, whose
    ``python3.N`` package is the interpreter (``3.11.2-6+deb12u1`` → ``3.11.2``)."""
    default = packages.get("python3")
    minor = re.match(r"(?:\d+:)?(3\.\d+)", default or "")
    interpreter = packages.get(f"python{minor.group(1)}") if minor else None
    if interpreter is None:
        raise ProfileUnavailable("execution.image: the image has no python3 interpreter package; "
                                 "rebuild it with `validate image build`")
    return _upstream(interpreter)


def _upstream(version: str) -> str:
    """A Debian version's upstream part: no epoch, no revision (``1:3.11.2-6+b1`` → ``3.11.2``)."""
    version = version.split(":", 1)[1] if re.match(r"\d+:", version) else version
    return version.rsplit("-", 1)[0]


def package_differences(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """One line per package whose version differs between a contract (`expected`) and this
    machine's image (`actual`), sorted by name; empty when they agree."""
    lines = []
    for name in sorted(expected.keys() | actual.keys()):
        want, have = expected.get(name), actual.get(name)
        if want == have:
            continue
        if want is None:
            lines.append(f"{name}: {have} here, not in the contract")
        elif have is None:
            lines.append(f"{name}: not installed here, {want} in the contract")
        else:
            lines.append(f"{name}: {have} here, {want} in the contract")
    return lines


class RootfsFacts(BaseModel):
    """What bwrap reports of the image: all of it computed from the files, none of it read from a record."""

    digest: str = Field(description="'sha256:<hex>' of rootfs.tar (computed)")
    tree_digest: str = Field(description="digest of the unpacked tree (computed), equal to the tarball's")
    packages: dict[str, str] = Field(description="the tree's Debian packages, name → version")
    python: str = Field(description="the tree's Python version")


def rootfs_facts(paths: ImagePaths) -> RootfsFacts:
    """Describe the unpacked tree bwrap runs, refusing one that is not what the tarball holds."""
    if not (paths.tarball.is_file() and (paths.rootfs / "usr/bin/python3").exists()):
        raise ProfileUnavailable(f"execution.image: no unpacked rootfs for {paths.name} at {paths.root}; "
                                 f"build it with `validate image build`, or restore an exported one with "
                                 f"`validate image import`")
    stored = _load_digest_cache(paths.digest_cache)
    hashed = len(_FILE_HASHES) + len(_TARBALLS)
    digest, expected = tarball_digests(paths.tarball)
    used: list[tuple[int, ...]] = []
    actual = tree_digest(paths.rootfs, used)
    if actual != expected and stored:
        # Refuse only on hashes this process computed: a stored one may be stale.
        _FILE_HASHES.clear()
        _TARBALLS.clear()
        _LOADED.clear()
        digest, expected = tarball_digests(paths.tarball)
        used = []
        actual = tree_digest(paths.rootfs, used)
        stored = False
    if actual == expected and (not stored or len(_FILE_HASHES) + len(_TARBALLS) > hashed):
        _save_digest_cache(paths, used)  # something was hashed that the store did not know
    if actual != expected:
        raise ProfileUnavailable(f"execution.image: the unpacked tree {paths.rootfs} is not what "
                                 f"{paths.tarball} holds (tree {actual[:19]}…, tarball's {expected[:19]}…); "
                                 f"rebuild it with `validate image build`")
    packages = parse_dpkg_status((paths.rootfs / DPKG_STATUS).read_text())
    return RootfsFacts(digest=digest, tree_digest=actual, packages=packages, python=python_version(packages))


# --- digests ------------------------------------------------------------------------------------
# A tree's digest: sha256 over its entries sorted by path, each entry six NUL-terminated
# fields (path, kind, permission bits, uid, gid, payload: a file's sha256, a link's target,
# a device's numbers). Names, contents, owners and modes count; mtimes do not. A tarball's
# tree is computed the same way from its members, so the two compare.

_FILE_HASHES: dict[tuple[int, ...], str] = {}
_TARBALLS: dict[tuple[object, ...], tuple[str, str]] = {}
_LOADED: dict[Path, tuple[int, ...]] = {}  # digest caches merged, by their file's state
#: How long a file must have been left alone for its hash to be stored (filesystems' clocks are coarse).
RACY_NS = 2_000_000_000


def tree_digest(root: Path, used: list[tuple[int, ...]] | None = None) -> str:
    """The digest of the tree under `root`. File hashes are kept for the process, keyed by
    inode, size, mtime and ctime, so a second look rereads only what changed; `used` gets the
    keys of the tree's files."""
    entries = [_disk_entry(".", os.lstat(root), root, used)]
    top = os.fspath(root)
    for dirpath, dirnames, filenames in os.walk(top):
        # `os.walk` joins each name onto `top`, so a path's part under it is a slice (what
        # `os.path.relpath` gives, without its ~40 % of the walk's time on a 7,800-file tree).
        rel = dirpath[len(top):].lstrip("/")
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            entries.append(_disk_entry(os.path.join(rel, name), os.lstat(path), path, used))
    return _digest_entries(entries)


# The bwrap image's hashes outlive the process, in the store beside the image (`ImagePaths.
# digest_cache`): every process that opens a bwrap sandbox — each CLI command, each Ray worker
# process of a node — checks the unpacked tree against the tarball, and hashing 185 MB twice
# took ~3 s of CPU each time. The cache holds what the in-process one does, under the same
# keys (a file's device, inode, size, mtime and ctime; the tarball's path with them): a file
# written or replaced since has another ctime or inode and is hashed again, so the check is
# the same check. Only the store's owner writes the cache (the sandbox never sees the
# store); a cache that cannot be read is ignored, one that cannot be written is not kept.

def _load_digest_cache(path: Path) -> bool:
    """Merge the stored hashes into the process's (unless this state of the file was merged
    already); whether the store holds any. Only a cache that none but this process's user
    could have written counts (the file and its directory owned by that user or root, neither
    writable by group or others): hashes from anyone else would vouch for a tree unread."""
    try:
        st = path.stat()
        if not (_owned_here(st) and _owned_here(path.parent.stat())):
            return False
        state = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if _LOADED.get(path) == state:
            return True
        doc = json.loads(path.read_bytes())
        files = [(_stat_key(k), _sha256_hex(h)) for k, h in doc["files"]]
        tarball = doc["tarball"]
        if tarball is not None:
            key, digest, tree = tarball
            _TARBALLS[(str(key[0]), *_stat_key(key[1:]))] = (_tag(digest), _tag(tree))
    except (OSError, ValueError, KeyError, TypeError, IndexError, ArithmeticError, RecursionError):
        return False  # unreadable or not of this shape: every hash is computed again
    _FILE_HASHES.update(files)
    _LOADED[path] = state
    return True


def _owned_here(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _stat_key(k) -> tuple[int, ...]:
    key = tuple(int(x) for x in k)
    if len(key) != 5 or not all(0 <= x < 1 << 64 for x in key):
        raise ValueError("not a stat key")
    return key


def _sha256_hex(h) -> str:
    if not (isinstance(h, str) and re.fullmatch(r"[0-9a-f]{64}", h)):
        raise ValueError("not a sha256")
    return h


def _tag(h) -> str:
    return "sha256:" + _sha256_hex(h.removeprefix("sha256:") if isinstance(h, str) else h)


def _save_digest_cache(paths: ImagePaths, used: list[tuple[int, ...]]) -> None:
    """Store this image's hashes (its tree's files and its tarball, nothing of another image).
    A file changed within the last seconds is left out: a same-size rewrite within one tick of
    the filesystem's clock would keep its key, and a stale hash must not outlive the process."""
    settled = time.time_ns() - RACY_NS
    key = _tarball_key(paths.tarball)
    doc = {"files": [[list(k), _FILE_HASHES[k]] for k in sorted(set(used))
                     if k in _FILE_HASHES and max(k[3], k[4]) < settled],
           "tarball": [list(key), *_TARBALLS[key]] if key in _TARBALLS and max(key[4], key[5]) < settled
           else None}
    try:
        atomic_write(paths.digest_cache, canonical_json(doc))
    except (OSError, EvidenceError):  # full or read-only store: the cache is not kept
        pass


def _tarball_key(tarball: Path) -> tuple:
    st = tarball.stat()
    return (str(tarball.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def tarball_digests(tarball: Path) -> tuple[str, str]:
    """(sha256 of the tarball, digest of the tree it holds), once per tarball file state."""
    key = _tarball_key(tarball)
    if key not in _TARBALLS:
        digest, tree, _ = _scan_tarball(tarball)
        _TARBALLS[key] = (digest, tree)
    return _TARBALLS[key]


class _HashingReader(io.RawIOBase):
    """A file read front to back, hashed as it goes."""

    def __init__(self, fh) -> None:
        self.fh, self.sha = fh, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = self.fh.readinto(buf)
        self.sha.update(memoryview(buf)[:n])
        return n


def _scan_tarball(tarball: Path) -> tuple[str, str, bytes]:
    """One pass: (sha256 of the bytes, digest of the tree, the dpkg status file's bytes)."""
    entries: list[tuple] = []
    inodes: dict[str, list] = {}
    files: list[str] = []
    status = b""
    with open(tarball, "rb") as fh:
        reader = _HashingReader(fh)
        with tarfile.open(fileobj=io.BufferedReader(reader, 1 << 20), mode="r|") as tar:
            for m in tar:
                path = member_path(m.name)
                if m.isreg():
                    h, data = _hash_stream(tar.extractfile(m), keep=path == DPKG_STATUS)
                    status = data if path == DPKG_STATUS else status
                    inodes[path] = [m.mode, m.uid, m.gid, h]
                elif m.islnk():
                    # A hard link shares its target's inode, and extracting it (tarfile, docker)
                    # applies its own header's mode and owner to that inode.
                    inodes[path] = inodes[member_path(m.linkname)]
                    inodes[path][:3] = [m.mode, m.uid, m.gid]
                else:
                    entries.append((path, _member_kind(m), m.mode, m.uid, m.gid, _member_payload(m)))
                    continue
                files.append(path)
        while reader.read(1 << 20):  # the end-of-archive padding counts in the file's digest
            pass
    entries += [(path, "f", *inodes[path]) for path in files]
    return "sha256:" + reader.sha.hexdigest(), _digest_entries(entries), status


def member_path(name: str) -> str:
    name = name.rstrip("/")
    name = name[2:] if name.startswith("./") else name
    return name if name not in ("", ".") else "."


def _member_kind(m: tarfile.TarInfo) -> str:
    kinds = {tarfile.DIRTYPE: "d", tarfile.SYMTYPE: "l", tarfile.CHRTYPE: "c", tarfile.BLKTYPE: "b",
             tarfile.FIFOTYPE: "p"}
    if m.type not in kinds:
        raise ProfileUnavailable(f"image: unsupported tar member type {m.type!r} for {m.name}")
    return kinds[m.type]


def _member_payload(m: tarfile.TarInfo) -> str:
    if m.issym():
        return m.linkname
    if m.ischr() or m.isblk():
        return f"{m.devmajor},{m.devminor}"
    return ""


def _disk_entry(rel: str, st: os.stat_result, path: str | Path, used: list | None = None) -> tuple:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if used is not None:
            used.append(key)
        if key not in _FILE_HASHES:
            with open(path, "rb") as fh:
                _FILE_HASHES[key] = _hash_stream(fh, keep=False)[0]
        return (rel, "f", mode, st.st_uid, st.st_gid, _FILE_HASHES[key])
    if stat.S_ISDIR(st.st_mode):
        return (rel, "d", mode, st.st_uid, st.st_gid, "")
    if stat.S_ISLNK(st.st_mode):
        return (rel, "l", mode, st.st_uid, st.st_gid, os.readlink(path))
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
        return (rel, kind, mode, st.st_uid, st.st_gid, f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}")
    if stat.S_ISFIFO(st.st_mode):
        return (rel, "p", mode, st.st_uid, st.st_gid, "")
    return (rel, "s", mode, st.st_uid, st.st_gid, "")  # a socket: never in our tarball, so a mismatch


def _digest_entries(entries: list[tuple]) -> str:
    sha = hashlib.sha256()
    for path, kind, mode, uid, gid, payload in sorted(entries, key=lambda e: os.fsencode(e[0])):
        if kind == "l":
            mode = 0o777  # a symlink's own mode means nothing on Linux; tar stores 0777
        # Each field and a NUL after it, as one update per entry (the same bytes).
        sha.update(b"".join(os.fsencode(field) + b"\0"
                            for field in (path, kind, f"{mode & 0o7777:o}", str(uid), str(gid), payload)))
    return "sha256:" + sha.hexdigest()


def _hash_stream(fh, keep: bool) -> tuple[str, bytes]:
    sha, kept = hashlib.sha256(), bytearray()
    for block in iter(lambda: fh.read(1 << 20), b""):
        sha.update(block)
        if keep:
            kept += block
    return sha.hexdigest(), bytes(kept)


def require_record(paths: ImagePaths) -> ImageRecord:
    record = read_record(paths)
    if record is None or not paths.tarball.is_file():
        raise ProfileUnavailable(f"image: no built rootfs for {paths.name} at {paths.root}; "
                                 f"build it with `validate image build`")
    return record


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
