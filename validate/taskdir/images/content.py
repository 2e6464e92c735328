"""A task image's content as evidence: a canonical digest of its filesystem that does not
depend on when it was built, and the listing that names what differs.

A docker image id is the digest of its configuration, which holds the build's timestamps,
so two builds of one task on two machines never share an id. What a reviewer can compare is
the content: the merged filesystem, read through the daemon (a created, never started
container, exported as a tar stream), every entry as ``[path, kind, mode, uid, gid, payload]``
(a file's sha256, a link's target, a device's numbers); mtimes are never read. Left out:
what the engine adds to any container (``/.dockerenv``, ``/etc/hostname``, ``/etc/hosts``,
``/etc/resolv.conf``, anything under ``/dev``, ``/proc``, ``/sys``). Bytes a build writes
only because of when it ran are normalised before hashing (`VOLATILE`: the apt and dpkg
logs, ldconfig's cache stamp, a timestamp-based ``.pyc``'s recorded source mtime, the
password-change day of ``/etc/shadow``); anything else that differs is a difference.

`image_content` gives the digest, the image's Debian packages and the entries;
`delta` keeps only what a task image adds to, changes in or removes from its base (the base
itself is reproducible, by layer digest), which is what freeze keeps as evidence beside the
manifest; `differences` names the files and packages two listings disagree on.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import tarfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from environment.protocol import canonical_json, sha256_tag
from validate.core.errors import SandboxError
from validate.evidence.journal import atomic_write
from validate.sandbox.image import DPKG_STATUS, package_differences, parse_dpkg_status

#: Bumped whenever what an entry holds or how it is normalised changes.
CONTENT_VERSION = 1
SKIPPED = frozenset({".dockerenv", "etc/hostname", "etc/hosts", "etc/resolv.conf"})
MOUNTS = ("dev/", "proc/", "sys/")
#: path glob → how its bytes are normalised (each a build's clock, never its content).
VOLATILE = {
    "var/log/apt/*.log": "dropped: apt's logs time-stamp every run",
    "var/log/dpkg.log": "dropped: dpkg's log time-stamps every action",
    "var/log/alternatives.log": "dropped: time-stamped",
    "var/cache/ldconfig/aux-cache": "dropped: ldconfig's cache of file times",
    "var/cache/debconf/*-old": "dropped: debconf's backups of the previous run",
    "var/lib/dpkg/*-old": "dropped: dpkg's backups of the previous run",
    "var/cache/apt/*.bin": "dropped: apt's binary caches of its lists, stamped with their times",
    "*.git/index": "git's stat cache: each entry's times, device, inode, owner and size zeroed (v2/v3)",
    "*.pyc": "a timestamp-based .pyc's recorded source mtime (bytes 8-12) zeroed",
    "etc/shadow": "each line's last-password-change day (field 3) blanked",
    "etc/shadow-": "each line's last-password-change day (field 3) blanked",
}
_DROPPED = tuple(g for g, how in VOLATILE.items() if how.startswith("dropped"))
_MAX_NORMALISED_BYTES = 16 << 20


class ImageContent(BaseModel):
    """What an image holds: its content digest, Debian packages and entries (path → entry)."""

    model_config = ConfigDict(frozen=True)

    version: int = CONTENT_VERSION
    digest: str = Field(description="'sha256:<hex>' over the canonical JSON of the sorted entries")
    packages: dict[str, str] = Field(default_factory=dict, description="dpkg status: name → version")
    entries: dict[str, list] = Field(description="path → [kind, mode, uid, gid, payload]")


class ContentDelta(BaseModel):
    """A task image's content as its base leaves it: the evidence freeze keeps beside the manifest."""

    model_config = ConfigDict(frozen=True)

    version: int = CONTENT_VERSION
    digest: str = Field(description="the task image's whole content digest")
    base: str = Field(description="the base image's content digest")
    changed: dict[str, list] = Field(description="entries added or changed relative to the base")
    removed: list[str] = Field(description="paths of the base the task image no longer holds")
    packages: dict[str, str] = Field(description="the task image's Debian packages")

    def apply(self, base: ImageContent) -> dict[str, list]:
        entries = {p: e for p, e in base.entries.items() if p not in set(self.removed)}
        entries.update(self.changed)
        return entries


def _git_index(data: bytes) -> bytes:
    """A git index (v2 or v3) with every entry's stat data zeroed and the trailing checksum
    dropped: what stays is each entry's mode, object id, flags and path."""
    if len(data) < 12 or data[:4] != b"DIRC" or int.from_bytes(data[4:8], "big") not in (2, 3):
        return data
    version, count, at = int.from_bytes(data[4:8], "big"), int.from_bytes(data[8:12], "big"), 12
    out = bytearray(data[:12])
    for _ in range(count):
        if at + 62 > len(data):
            return data
        flags = int.from_bytes(data[at + 60:at + 62], "big")
        extended = version == 3 and flags & 0x4000
        start = at + 62 + (2 if extended else 0)
        end = data.find(b"\0", start)
        if end < 0:
            return data
        size = ((end + 1 - at) + 7) // 8 * 8  # entries are NUL-padded to a multiple of 8 bytes
        mode = data[at + 24:at + 28]
        out += bytes(24) + mode + bytes(12) + data[at + 40:at + size]
        at += size
    return bytes(out + data[at:-20])


def _normalised(path: str, data: bytes) -> bytes:
    if path.endswith(".git/index"):
        return _git_index(data)
    if path.endswith(".pyc") and len(data) >= 16 and int.from_bytes(data[4:8], "little") == 0:
        return data[:8] + b"\0\0\0\0" + data[12:]  # PEP 552 flags 0: bytes 8-12 are the source mtime
    if path in ("etc/shadow", "etc/shadow-"):
        lines = [line.split(b":") for line in data.split(b"\n")]
        return b"\n".join(b":".join([*f[:2], b"", *f[3:]]) if len(f) > 3 else b":".join(f) for f in lines)
    return data


def _entries(stream, status: list[bytes]) -> Iterator[tuple[str, list]]:
    """Every entry of an exported filesystem; the dpkg status file's bytes are appended to `status`."""
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            path = m.name[2:] if m.name.startswith("./") else m.name
            path = path.rstrip("/")
            if not path or path in SKIPPED or path.startswith(MOUNTS) or \
                    any(fnmatch.fnmatchcase(path, g) for g in _DROPPED):
                continue
            kind, payload = "?", ""
            if m.isreg():
                f = tar.extractfile(m)
                assert f is not None  # a regular member always has its data
                if (path.endswith((".pyc", ".git/index")) or path.startswith("etc/shadow")
                    or path == DPKG_STATUS) \
                        and m.size <= _MAX_NORMALISED_BYTES:
                    data = f.read()
                    if path == DPKG_STATUS:
                        status.append(data)
                    payload = "sha256:" + hashlib.sha256(_normalised(path, data)).hexdigest()
                else:
                    h = hashlib.sha256()
                    for block in iter(partial(f.read, 1 << 20), b""):
                        h.update(block)
                    payload = "sha256:" + h.hexdigest()
                kind = "f"
            elif m.isdir():
                kind = "d"
            elif m.issym():
                kind, payload = "l", m.linkname
            elif m.islnk():
                kind, payload = "h", m.linkname.lstrip("./")
            elif m.ischr() or m.isblk():
                kind, payload = "c" if m.ischr() else "b", f"{m.devmajor},{m.devminor}"
            elif m.isfifo():
                kind = "p"
            yield path, [kind, m.mode & 0o7777, m.uid, m.gid, payload]


class _Chunks:
    """The daemon's export stream as a file tarfile reads front to back."""

    def __init__(self, chunks) -> None:
        self.chunks, self.buf = iter(chunks), b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buf) < n:
            nxt = next(self.chunks, None)
            if nxt is None:
                break
            self.buf += nxt
        out, self.buf = (self.buf, b"") if n < 0 else (self.buf[:n], self.buf[n:])
        return out


def digest_of(entries: dict[str, list]) -> str:
    return sha256_tag(canonical_json([CONTENT_VERSION, sorted([p, *e] for p, e in entries.items())]))


def image_content(client, image_id: str, store: Path | None = None) -> ImageContent:
    """The content of `image_id` in the daemon of `client` (a docker SDK client); kept in
    ``<store>/content/<id hex>.json`` (an image id names immutable content) when `store` is given."""
    cached = None if store is None else store / "content" / f"{image_id.removeprefix('sha256:')}.json"
    if cached is not None and cached.is_file():
        try:
            found = ImageContent.model_validate_json(cached.read_bytes())
            if found.version == CONTENT_VERSION:
                return found
        except ValueError:
            pass
    api = client.api
    try:
        cid = api.create_container(image_id, command=["/nonexistent"], network_disabled=True)["Id"]
    except Exception as e:  # the docker SDK's errors: the image is not there, the daemon does not answer
        raise SandboxError(f"task image content: cannot open {image_id} ({e})") from None
    status: list[bytes] = []
    try:
        entries = dict(_entries(_Chunks(api.export(cid, chunk_size=1 << 20)), status))
    except (tarfile.TarError, OSError) as e:
        raise SandboxError(f"task image content: cannot read {image_id}'s filesystem ({e})") from None
    finally:
        api.remove_container(cid, force=True)
    packages = parse_dpkg_status(status[0].decode("utf-8", "replace")) if status else {}
    content = ImageContent(digest=digest_of(entries), packages=dict(sorted(packages.items())),
                           entries=entries)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cached, content.model_dump_json().encode())
    return content


def delta(task: ImageContent, base: ImageContent) -> ContentDelta:
    changed = {p: e for p, e in sorted(task.entries.items()) if base.entries.get(p) != e}
    removed = sorted(p for p in base.entries if p not in task.entries)
    return ContentDelta(digest=task.digest, base=base.digest, changed=changed, removed=removed,
                        packages=task.packages)


def delta_json(d: ContentDelta) -> bytes:
    return json.dumps(d.model_dump(mode="json"), sort_keys=True, indent=0,
                      separators=(",", ":")).encode() + b"\n"


_SHOWN = 12


def differences(frozen: dict[str, list], here: dict[str, list], frozen_packages: dict[str, str],
                packages: dict[str, str]) -> list[str]:
    """The files and packages two listings disagree on, one line each (a few of each kind)."""
    lines = []
    for what, paths in (("changed", sorted(p for p in frozen if p in here and frozen[p] != here[p])),
                        ("only in the frozen image", sorted(p for p in frozen if p not in here)),
                        ("only in this machine's", sorted(p for p in here if p not in frozen))):
        if paths:
            shown = ", ".join("/" + p for p in paths[:_SHOWN])
            lines.append(f"{len(paths)} file(s) {what}: {shown}{' …' if len(paths) > _SHOWN else ''}")
    pkgs = package_differences(frozen_packages, packages)
    if pkgs:
        lines.append(f"packages: {'; '.join(pkgs[:_SHOWN])}{' …' if len(pkgs) > _SHOWN else ''}")
    return lines



# --- as evidence: frozen beside the manifest, compared on another machine ---------------------

EMPTY = ImageContent(digest=digest_of({}), entries={})


def content_file(directory: Path, digest: str) -> Path:
    """Where a task image's listing is kept beside its manifest: named by its content digest."""
    return directory / f"{digest.removeprefix('sha256:')}.content.json"


def record_content(client, image_id: str, base_id: str | None, directory: Path, store: Path | None,
                   copies: tuple[Path, ...] = ()) -> str:
    """The content digest of `image_id`, its listing relative to its base (`base_id`: the
    image of its first layer; None: from nothing) written beside the manifest (and into each
    of `copies`: the store's, which a run copies its listings from)."""
    task = image_content(client, image_id, store)
    base = image_content(client, base_id, store) if base_id else EMPTY
    data = None
    for where in (directory, *copies):
        path = content_file(where, task.digest)
        if not path.is_file():
            data = data or delta_json(delta(task, base))
            where.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
    return task.digest


def base_content(client, image_id: str, layers, want: str, store: Path | None) -> ImageContent | None:
    """This daemon's image the frozen listing was kept relative to: one whose layers begin the
    task image's (`layers`) and whose content is the listing's base digest `want` (a base of
    the map, or one pulled from a registry); None when no image here is."""
    if want == EMPTY.digest:
        return EMPTY
    layers = list(layers or ())
    candidates = []
    for image in client.images.list():
        own = list(image.attrs.get("RootFS", {}).get("Layers") or [])
        if image.id != image_id and own and own == layers[:len(own)]:
            candidates.append((len(own), image.id))
    for _, candidate in sorted(candidates, reverse=True):
        found = image_content(client, candidate, store)
        if found.digest == want:
            return found
    return None


def here_layers(client, image_id: str) -> list[str]:
    return list(client.api.inspect_image(image_id).get("RootFS", {}).get("Layers") or [])


def compare_content(client, image_id: str, frozen: str, layers, directory: Path | None,
                    store: Path | None) -> list[str]:
    """[] when `image_id` holds the content the contract froze (`frozen`); else what differs:
    the files and packages, named from the frozen listing beside the manifest (in
    `directory`) laid on this machine's image it was kept relative to (found by its layers
    and content), or the digests alone without it. `layers`: the frozen image's."""
    here = image_content(client, image_id, store)
    if here.digest == frozen:
        return []
    said = [f"its content is {here.digest}, the contract froze {frozen}"]
    path = None if directory is None else content_file(directory, frozen)
    if path is None or not path.is_file():
        return [*said, f"(no listing {frozen.removeprefix('sha256:')}.content.json beside the manifest "
                       "names the files)"]
    try:
        listing = ContentDelta.model_validate_json(path.read_bytes())
    except ValueError as e:
        return [*said, f"{path}: not a content listing ({e})"]
    base = base_content(client, image_id, here_layers(client, image_id), listing.base, store)
    if base is None:
        said.append(f"no image here is the listing's base ({listing.base}): the files are named against none")
        base = EMPTY
    entries = listing.apply(base)
    if listing.digest != frozen or digest_of(entries) != frozen:
        said.append(f"the listing {path.name} on this machine's base does not make the frozen content; the "
                    "listing was altered")
    return [*said, *differences(entries, here.entries, listing.packages, here.packages)]
