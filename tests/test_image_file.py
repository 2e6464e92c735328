"""The image as one file: `validate image export` writes the store's rootfs tarball named by its
own sha256 (the contract's image_digest); `validate image import` restores it into a fresh
store and the suite's dockerd, after which a contract frozen with the image verifies there
(that is how a reviewer re-verifies committed evidence once Debian's archive has moved on).
An imported file is hostile: forged, truncated, non-tar and escaping files are refused with
exit 2 and one line, and nothing is written.

The real image is ~180 MB: it is exported once per module and reused."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
import tarfile

import pytest

from tests.conftest import VALIDATE, make_manifest, subprocess_env
from tests.test_image import STATUS
from validate.core.paths import DEFAULT_IMAGE, ImagePaths
from validate.evidence.journal import file_sha256
from validate.sandbox import open_sandbox
from validate.sandbox.bwrap import BwrapSandbox
from validate.sandbox.image import read_record
from validate.sandbox.imagefile import file_name


def cli(*args, store=None, cwd=None) -> subprocess.CompletedProcess:
    env = subprocess_env(**({"VALIDATE_IMAGE_DIR": str(store)} if store is not None else {}))
    return subprocess.run([*VALIDATE, *map(str, args)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=cwd)


def refused(r: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2 with exactly one line on stderr holding every needle, and nothing on stdout."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert all(n in lines[0] for n in needles), (needles, r.stderr)
    assert r.stdout == ""


@pytest.fixture(scope="module")
def record():
    found = read_record(ImagePaths(DEFAULT_IMAGE))
    assert found is not None, "no image record in the store: run `validate image build`"
    return found


@pytest.fixture(scope="module")
def exported(tmp_path_factory, record):
    out = tmp_path_factory.mktemp("exported") / "images"  # not there yet: export creates it
    r = cli("image", "export", "--out", out)
    assert r.returncode == 0, r.stderr
    yield out / file_name(record.digest)
    shutil.rmtree(out)  # ~180 MB: not left for pytest's kept temporary directories


@pytest.fixture(scope="module")
def imported(tmp_path_factory, exported):
    """A fresh image store holding the exported file, imported as a reviewer would (default
    backends: bwrap, and the suite's dockerd, which answers)."""
    store = tmp_path_factory.mktemp("store")
    r = cli("image", "import", exported, store=store)
    assert r.returncode == 0, r.stderr
    yield store
    shutil.rmtree(store)


def test_the_export_is_the_stores_tarball_named_by_its_digest(exported, record, tmp_path):
    assert exported.name == f"sha256-{record.digest.removeprefix('sha256:')}.tar"
    assert "sha256:" + file_sha256(exported) == record.digest  # the name is the content's own digest
    again = cli("image", "export", "--out", exported)  # a file path with the right name: kept as it is
    assert again.returncode == 0 and "present" in again.stderr, again.stderr
    refused(cli("image", "export", "--out", tmp_path / "image.tar"), "--out", "image.tar", exported.name)


@pytest.mark.bwrap
def test_a_contract_verifies_against_the_imported_store_and_not_without_it(imported, record, sandboxes,
                                                                           tmp_path):
    manifest = make_manifest(sandboxes("bwrap"), idx=[0, 1], env_name="twohop-env")
    path = tmp_path / "contract.json"
    path.write_bytes(manifest.to_json())
    refused(cli("verify", "--manifest", path, store=tmp_path / "empty"), "no unpacked rootfs",
            "validate image import")
    ok = cli("verify", "--manifest", path, store=imported)
    assert ok.returncode == 0 and "OK" in ok.stdout, ok.stderr
    # a contract of another machine's image: refused, and the refusal names the file that fixes it
    packages = {**manifest.execution.packages, "zlib1g": "1:1.2.13.dfsg-1"}
    other = manifest.model_copy(
        update={"execution": manifest.execution.model_copy(update={"packages": packages})}
    )
    path.write_bytes(other.sealed().to_json())
    refused(cli("verify", "--manifest", path, store=imported), "execution.packages", "zlib1g",
            f"validate image import {file_name(record.digest)}")
    paths = ImagePaths(DEFAULT_IMAGE, imported)
    assert read_record(paths) == record  # recomputed from the bytes: the same record the build wrote
    # packages read from the imported tree
    facts = BwrapSandbox(image=DEFAULT_IMAGE, image_dir=imported).facts()
    assert (facts.image_digest, facts.tree_digest, facts.packages) == (
        record.digest, record.tree_digest, dict(p.split("=", 1) for p in record.packages))


@pytest.mark.docker
def test_docker_imports_the_same_bytes_and_a_docker_contract_verifies_again(exported, record, tmp_path):
    import docker

    name = f"validate-imagefile-test:{os.getpid()}"  # ours alone: the suite's default image stays untouched
    client = docker.from_env()
    try:
        imported = cli("image", "import", exported, "--image", name, "--backends", "docker",
                       store=tmp_path / "s")
        assert imported.returncode == 0, imported.stderr
        assert client.images.get(name).attrs["RootFS"]["Layers"] == [record.digest]  # diff_id = the digest
        sandbox = open_sandbox("docker", image=name, run_label=f"pytest-{os.getpid()}")
        try:
            manifest = make_manifest(sandbox, idx=[0], env_name="twohop-env")
        finally:
            sandbox.close()
        assert manifest.execution.image_digest == record.digest
        path = tmp_path / "contract.json"
        path.write_bytes(manifest.to_json())
        client.images.remove(name)  # the reviewer's daemon, before the import
        refused(cli("verify", "--manifest", path), "execution.image", name)
        assert cli("image", "import", exported, "--image", name, store=tmp_path / "s").returncode == 0
        ok = cli("verify", "--manifest", path)
        assert ok.returncode == 0 and "backend docker" in ok.stdout, ok.stderr
    finally:
        shutil.rmtree(tmp_path / "s", ignore_errors=True)
        try:
            client.images.remove(name, force=True)
        except docker.errors.ImageNotFound:
            pass


# --- small images, built here ------------------------------------------------------------------

def member(name: str, kind=tarfile.REGTYPE, data: bytes = b"", mode=0o644, link="", dev=(0, 0)):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, (info.devmajor, info.devminor) = kind, mode, link, dev
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def image_tar(*extra, status: str = STATUS) -> bytes:
    """A few-file sandbox image (a python3 interpreter package, usr/bin/python3), then `extra`."""
    members = [member(d, tarfile.DIRTYPE, mode=0o755) for d in (".", "usr", "usr/bin", "var", "var/lib",
                                                                 "var/lib/dpkg", "etc", "tmp")]
    members += [member("usr/bin/python3", data=b"#!fake\n", mode=0o755),
                member("var/lib/dpkg/status", data=status.encode()), *extra]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def named(directory, data: bytes, digest: str | None = None):
    """`data` written as sha256-<hex>.tar: its own digest unless another is given (a forgery)."""
    path = directory / file_name(digest or "sha256:" + hashlib.sha256(data).hexdigest())
    path.write_bytes(data)
    return path


def test_a_small_image_goes_round_trip_and_replaces_only_when_told(tmp_path):
    first, second = image_tar(), image_tar(member("etc/motd", data=b"hello\n"))
    store = tmp_path / "store"
    a, b = named(tmp_path, first), named(tmp_path, second)
    assert cli("image", "import", a, "--image", "tiny:test", "--backends", "bwrap",
               store=store).returncode == 0
    facts = BwrapSandbox(image="tiny:test", image_dir=store).facts()
    assert (facts.image_digest, facts.python) == ("sha256:" + hashlib.sha256(first).hexdigest(), "3.11.2")
    b_digest = "sha256:" + hashlib.sha256(second).hexdigest()
    refused(cli("image", "import", b, "--image", "tiny:test", "--backends", "bwrap", store=store),
            "already holds tiny:test as " + facts.image_digest, "--replace", b_digest)
    assert cli("image", "import", b, "--image", "tiny:test", "--backends", "bwrap", "--replace",
               store=store).returncode == 0
    assert BwrapSandbox(image="tiny:test", image_dir=store).facts().image_digest == b_digest
    out = cli("image", "export", "--image", "tiny:test", "--out", tmp_path / "again", store=store)
    assert out.returncode == 0 and (tmp_path / "again" / b.name).read_bytes() == second, out.stderr
    tarball = ImagePaths("tiny:test", store).tarball
    tarball.write_bytes(first)  # the store's tarball is no longer what its record says
    refused(cli("image", "export", "--image", "tiny:test", "--out", tmp_path / "third", store=store),
            str(tarball), "not its record's " + b_digest)
    assert not (tmp_path / "third" / b.name).exists()


def test_a_forged_or_truncated_file_is_refused_naming_both_digests(exported, record, tmp_path):
    tiny = image_tar()
    forged = named(tmp_path, tiny, digest=record.digest)  # a small image under the real image's name
    refused(cli("image", "import", forged, store=tmp_path / "s"), str(forged),
            "sha256:" + hashlib.sha256(tiny).hexdigest(), "expected " + record.digest)
    cut = tmp_path / "cut" / exported.name  # the real file, its first MiB only
    cut.parent.mkdir()
    with open(exported, "rb") as fh:
        cut.write_bytes(fh.read(1 << 20))
    refused(cli("image", "import", cut, store=tmp_path / "s"), str(cut), "expected " + record.digest)
    other = "sha256:" + "0" * 64
    refused(cli("image", "import", named(tmp_path, tiny), "--digest", other, store=tmp_path / "s"),
            "its name says", other)
    assert list((tmp_path / "s").iterdir()) == []  # nothing installed, no staging left


TINY = image_tar()
HOSTILE = {
    # name → (bytes named by their own digest, what the refusal says)
    "cut inside a member": (TINY[:1500], "truncated or not a tar archive"),
    "cut at a member boundary": (TINY[:TINY.rindex(b"usr/bin/python3") + 1024],
                                 "truncated or not a tar archive"),
    "gzip": (gzip.compress(TINY, mtime=0), "truncated or not a tar archive"),
    "not a tar": (b"just text\n" * 100 + b"\0" * 1024, "truncated or not a tar archive"),
    "parent dir": (image_tar(member("../escaped", data=b"x")), "escapes the image's root"),
    "absolute": (image_tar(member("/tmp/escaped", data=b"x")), "escapes the image's root"),
    "through a symlink": (image_tar(member("etc/host", tarfile.SYMTYPE, link="/etc"),
                                    member("etc/host/escaped", data=b"x")), "not under a directory"),
    "symlink replaced": (image_tar(member("etc/host", tarfile.SYMTYPE, link="/etc"),
                                   member("etc/host", tarfile.DIRTYPE, mode=0o755)), "comes twice"),
    "hard link out": (image_tar(member("etc/shadow", tarfile.LNKTYPE, link="../../etc/shadow")),
                      "escapes the image's root"),
    "hard link to a symlink": (image_tar(member("etc/l", tarfile.SYMTYPE, link="/etc/shadow"),
                                         member("etc/h", tarfile.LNKTYPE, link="etc/l")),
                               "not to a regular file"),
    "block device": (image_tar(member("tmp/disk", tarfile.BLKTYPE, dev=(8, 0))), "device 8,0"),
    "memory device": (image_tar(member("tmp/mem", tarfile.CHRTYPE, dev=(1, 1))), "device 1,1"),
    "no python": (image_tar(status="Package: dash\nStatus: install ok installed\nVersion: 1\n"),
                  "not a sandbox image"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_is_refused_and_nothing_is_written(case, tmp_path):
    data, says = HOSTILE[case]
    path = named(tmp_path, data)
    store = tmp_path / "store"
    refused(cli("image", "import", path, "--backends", "bwrap", store=store, cwd=tmp_path), str(path), says)
    assert list(store.iterdir()) == []
    assert not (tmp_path / "escaped").exists() and not os.path.exists("/tmp/escaped")
