"""The sandbox image: a reproducible build, its package list read from the image itself,
one digest for both backends, and a bwrap tree that must be what the tarball holds."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from validate.core.errors import ProfileUnavailable
from validate.core.paths import DEFAULT_IMAGE, ImagePaths
from validate.evidence.journal import atomic_write, file_sha256
from validate.sandbox import Limits, RunRequest
from validate.sandbox.bwrap import BwrapSandbox
from validate.sandbox.image import (
    RACY_NS,
    build_rootfs,
    describe_tarball,
    package_differences,
    parse_dpkg_status,
    python_version,
    read_record,
    unpack_rootfs,
)

STATUS = """\
Package: python3.11
Status: install ok installed
Priority: optional
Architecture: amd64
Version: 3.11.2-6+deb12u6
Description: Interactive high-level object-oriented language (version 3.11)
 Package: not-a-field (a continuation line)
 .
 More text.

Package: python3
Status: install ok installed
Architecture: amd64
Version: 3.11.2-1+b1

Package: removed-tool
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0-1
Conffiles:
 /etc/removed-tool.conf 0123456789abcdef0123456789abcdef

Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u10

Package: libc6
Status: install ok installed
Architecture: i386
Version: 2.36-9+deb12u10

Package: base-passwd
Status: install ok installed
Architecture: amd64
Version: 1:3.6.1
"""


def store_packages() -> dict[str, str]:
    record = read_record(ImagePaths(DEFAULT_IMAGE))
    assert record is not None, "no image record in the store: run `validate image build`"
    return dict(line.split("=", 1) for line in record.packages)


def test_dpkg_status_gives_installed_packages_only():
    assert parse_dpkg_status(STATUS) == {
        "base-passwd": "1:3.6.1", "libc6:amd64": "2.36-9+deb12u10", "libc6:i386": "2.36-9+deb12u10",
        "python3": "3.11.2-1+b1", "python3.11": "3.11.2-6+deb12u6"}
    assert list(parse_dpkg_status(STATUS)) == sorted(parse_dpkg_status(STATUS))


def test_python_version_is_the_interpreter_packages_upstream_version():
    assert python_version(parse_dpkg_status(STATUS)) == "3.11.2"
    assert python_version({"python3": "1:3.12.6-1", "python3.12": "2:3.12.6-1+b2"}) == "3.12.6"
    for packages in ({}, {"python3": "3.11.2-1+b1"}, {"python3.11": "3.11.2-6"}):
        with pytest.raises(ProfileUnavailable, match="no python3 interpreter"):
            python_version(packages)


def test_package_differences_name_each_package_both_ways():
    contract = {"libc6": "2.36-9+deb12u10", "python3.11": "3.11.2-6+deb12u1", "gone": "1.0"}
    here = {"libc6": "2.36-9+deb12u10", "python3.11": "3.11.2-6", "extra": "2.0"}
    assert package_differences(contract, here) == [
        "extra: 2.0 here, not in the contract",
        "gone: not installed here, 1.0 in the contract",
        "python3.11: 3.11.2-6 here, 3.11.2-6+deb12u1 in the contract",
    ]
    assert package_differences(here, here) == []


def test_the_store_records_what_its_tarball_holds():
    paths = ImagePaths(DEFAULT_IMAGE)
    record = read_record(paths)
    assert record is not None
    assert describe_tarball(paths.tarball) == record  # recomputed from the bytes, not trusted
    assert record.digest == "sha256:" + file_sha256(paths.tarball)
    packages = store_packages()
    assert {"python3", "dash", "libc6"} <= packages.keys() and record.python.startswith("3.")


@pytest.mark.docker
@pytest.mark.bwrap
def test_both_backends_report_the_same_image(sandboxes):
    docker_facts, bwrap_facts = sandboxes("docker").facts(), sandboxes("bwrap").facts()
    record = read_record(ImagePaths(DEFAULT_IMAGE))
    # docker's layer diff_id of a plain tar import is the tarball's own sha256
    assert docker_facts.image_digest == bwrap_facts.image_digest == record.digest
    assert docker_facts.packages == bwrap_facts.packages == store_packages()
    assert (bwrap_facts.tree_digest, docker_facts.tree_digest) == (record.tree_digest, None)
    probe = ("python3", "-S", "-c", "import platform; print(platform.python_version())")
    for backend, facts in (("docker", docker_facts), ("bwrap", bwrap_facts)):
        res = sandboxes(backend).run(RunRequest(argv=probe, name=f"pyver-{backend}",
                                                limits=Limits(timeout_s=30)))
        assert (res.exit_code, res.stdout.decode().strip()) == (0, facts.python), res.stderr


def tiny_store(base) -> ImagePaths:
    """A store holding a few-file image, built with tarfile, recorded and unpacked."""
    paths = ImagePaths("tiny:test", base)
    paths.root.mkdir(parents=True)
    files = {"usr/bin/python3": (b"#!fake\n", 0o755), "var/lib/dpkg/status": (STATUS.encode(), 0o644),
             "etc/motd": (b"hello\n", 0o644)}
    with tarfile.open(paths.tarball, "w") as tar:
        for d in (".", "usr", "usr/bin", "var", "var/lib", "var/lib/dpkg", "etc", "workspace"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("usr/bin/python3.11")
        link.type, link.linkname = tarfile.LNKTYPE, "usr/bin/python3"
        tar.addfile(link)
        sym = tarfile.TarInfo("usr/bin/py")
        sym.type, sym.linkname = tarfile.SYMTYPE, "python3"
        tar.addfile(sym)
    atomic_write(paths.record, describe_tarball(paths.tarball).model_dump_json().encode())
    unpack_rootfs(paths, log=lambda _msg: None)
    return paths


@pytest.mark.bwrap
def test_bwrap_refuses_a_tree_that_is_not_what_the_tarball_holds(tmp_path):
    paths = tiny_store(tmp_path)
    record = read_record(paths)
    sandbox = BwrapSandbox(image="tiny:test", image_dir=tmp_path)
    facts = sandbox.facts()
    assert (facts.image_digest, facts.tree_digest, facts.python) == (record.digest, record.tree_digest,
                                                                     "3.11.2")
    assert facts.packages["libc6:i386"] == "2.36-9+deb12u10"
    motd = paths.rootfs / "etc/motd"
    tampering = [lambda: motd.write_bytes(b"hello!\n"), lambda: motd.chmod(0o4755),
                 lambda: os.chown(motd, 1000, 1000), lambda: (paths.rootfs / "etc/new").write_bytes(b""),
                 lambda: motd.unlink()]
    for tamper in tampering:
        tamper()
        with pytest.raises(ProfileUnavailable, match="is not what .* holds.*validate image build"):
            sandbox.facts()
        unpack_rootfs(paths, log=lambda _msg: None)  # unpacks the tarball anew: accepted again
        assert sandbox.facts().tree_digest == record.tree_digest


FACTS_IN_A_NEW_PROCESS = """
import sys
from pathlib import Path
from validate.sandbox import image
from validate.core.errors import ProfileUnavailable
from validate.sandbox.bwrap import BwrapSandbox
read = []  # what this process hashed itself: each file of the tree, the tarball
for name in ("_hash_stream", "_scan_tarball"):
    def counted(*a, _f=getattr(image, name), **k):
        read.append(1)
        return _f(*a, **k)
    setattr(image, name, counted)
try:
    print(BwrapSandbox(image="tiny:test", image_dir=Path(sys.argv[1])).facts().tree_digest, len(read))
except ProfileUnavailable as e:
    print(f"refused: {e}")
"""


@pytest.mark.bwrap
def test_the_image_hashes_kept_across_processes_still_see_every_change(tmp_path):
    # Each process that opens a bwrap sandbox checks the tree against the tarball; the file
    # hashes are kept in the store (digests.json) under each file's inode, size, mtime and ctime,
    # so the next process rehashes only what changed — and a change that keeps the size and
    # puts the mtime back still has a new ctime.
    paths = tiny_store(tmp_path)
    record = read_record(paths)
    time.sleep(RACY_NS / 1e9 + 0.1)  # hashes of files changed in the last seconds are not stored

    def facts() -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", FACTS_IN_A_NEW_PROCESS, str(tmp_path)],
                             capture_output=True, text=True, check=True)
        if out.stdout.startswith("refused: "):
            return out.stdout.strip(), -1
        digest, read = out.stdout.split()
        return digest, int(read)

    assert facts() == (record.tree_digest, 7)  # the tarball, its three files, the tree's three
    stored = json.loads(paths.digest_cache.read_bytes())
    assert len(stored["files"]) == 3 and stored["tarball"][1:] == [record.digest, record.tree_digest]
    assert facts() == (record.tree_digest, 0)  # from the stored hashes: nothing read again
    motd = paths.rootfs / "etc/motd"
    before = motd.stat()
    motd.write_bytes(b"hellO\n")  # the same size
    os.utime(motd, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert motd.stat().st_size == before.st_size and motd.stat().st_mtime_ns == before.st_mtime_ns
    assert facts()[0].startswith("refused: execution.image: the unpacked tree")
    motd.write_bytes(b"hello\n")  # what the tarball holds: accepted again, whatever the cache held
    assert facts()[0] == record.tree_digest
    paths.digest_cache.write_bytes(b"{not json")  # a damaged cache is ignored, and written anew
    assert facts()[0] == record.tree_digest
    assert json.loads(paths.digest_cache.read_bytes())["tarball"][1] == record.digest


@pytest.mark.bwrap
def test_a_stored_hash_vouches_for_nothing_it_should_not(tmp_path):
    paths = tiny_store(tmp_path)
    record = read_record(paths)
    time.sleep(RACY_NS / 1e9 + 0.1)
    run = lambda: subprocess.run([sys.executable, "-c", FACTS_IN_A_NEW_PROCESS, str(tmp_path)],  # noqa: E731
                                 capture_output=True, text=True).stdout
    assert run().split() == [record.tree_digest, "7"]
    good = json.loads(paths.digest_cache.read_bytes())
    motd = paths.rootfs / "etc/motd"
    motd.write_bytes(b"hellO\n")  # changed; a forged cache then claims it is what the tarball holds
    key = [motd.stat().st_dev, motd.stat().st_ino, motd.stat().st_size, motd.stat().st_mtime_ns,
           motd.stat().st_ctime_ns]
    hello = hashlib.sha256(b"hello\n").hexdigest()
    forged = {"files": [[key, hello]] + [f for f in good["files"] if f[1] != hello],
              "tarball": good["tarball"]}
    paths.digest_cache.write_bytes(json.dumps(forged).encode())
    paths.digest_cache.chmod(0o666)  # anyone could have written it: not believed
    assert run().startswith("refused: execution.image: the unpacked tree")
    paths.digest_cache.chmod(0o644)
    motd.write_bytes(b"hello\n")
    stale = {"files": [[f[0], "0" * 64] for f in good["files"]], "tarball": good["tarball"]}
    paths.digest_cache.write_bytes(json.dumps(stale).encode())  # a stale hash does not refuse a good tree
    assert run().split()[0] == record.tree_digest
    for damaged in (b'{"files": [[[1e999, 1, 1, 1, 1], "x"]], "tarball": null}',
                    b"[" * 100_000 + b"]" * 100_000, b'{"files": [[[1, 2], "' + b"0" * 64
                    + b'"]], "tarball": null}'):
        paths.digest_cache.write_bytes(damaged)  # ignored, never a crash
        assert run().split()[0] == record.tree_digest


@pytest.mark.slow
def test_two_builds_give_the_same_tarball(tmp_path):
    """One more build, from the same apt sources as the store's, gives the same bytes."""
    store = read_record(ImagePaths(DEFAULT_IMAGE))
    assert store is not None, "no image record in the store: run `validate image build`"
    again = build_rootfs(ImagePaths(DEFAULT_IMAGE, tmp_path), log=lambda _msg: None)
    differences = package_differences(store_packages(), dict(p.split("=", 1) for p in again.packages))
    assert again.digest == store.digest, differences or "the same packages gave other bytes"
    assert again == store
    assert file_sha256(ImagePaths(DEFAULT_IMAGE, tmp_path).tarball) == store.digest.removeprefix("sha256:")
