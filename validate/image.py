"""Build the sandbox image offline from Debian packages (`validate image build`).

No image can be pulled here, so the image is made from the distribution's own packages:
``mmdebstrap --variant=essential --include=python3 bookworm`` writes a root filesystem
tarball using the machine's configured apt sources. Docker imports that tarball; bwrap uses
the same tree unpacked, so both backends run the same Python. See `validate.paths` for the
store's layout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from validate.errors import ProfileUnavailable
from validate.evidence import atomic_write, file_sha256
from validate.paths import ImagePaths

SUITE = "bookworm"
MOUNT_POINTS = ("workspace", "agent", "answer_key")
ROOTFS_LABEL = "deshuffle-validate.rootfs"


def build_rootfs(paths: ImagePaths, log=print) -> None:
    """Create ``rootfs.tar`` with mmdebstrap (skipped when it exists)."""
    if paths.tarball.is_file():
        log(f"rootfs tarball present: {paths.tarball}")
        return
    if shutil.which("mmdebstrap") is None:
        raise ProfileUnavailable("image build: mmdebstrap is not installed (apt-get install mmdebstrap)")
    paths.root.mkdir(parents=True, exist_ok=True)
    tmp = paths.tarball.with_suffix(".tar.partial")
    log(f"building a Debian {SUITE} rootfs with python3 (mmdebstrap, about 20-40 s) ...")
    proc = subprocess.run(["mmdebstrap", "--variant=essential", "--include=python3", "--quiet",
                           SUITE, str(tmp)], capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ProfileUnavailable(f"image build: mmdebstrap failed (exit {proc.returncode}): "
                                 f"{proc.stderr.strip()[-800:]}")
    os.replace(tmp, paths.tarball)


def unpack_rootfs(paths: ImagePaths, log=print) -> None:
    """Unpack the tarball for bwrap, add the sandbox's mount points, record the digest."""
    digest = "sha256:" + file_sha256(paths.tarball)
    if paths.digest.is_file() and paths.digest.read_text().strip() == digest and paths.rootfs.is_dir():
        log(f"rootfs unpacked: {paths.rootfs} ({digest[:19]}…)")
        return
    shutil.rmtree(paths.rootfs, ignore_errors=True)
    partial = paths.rootfs.with_name("rootfs.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(paths.tarball) as tar:
        tar.extractall(partial, filter="fully_trusted")  # our own tarball, made just above
    for name in MOUNT_POINTS:
        (partial / name).mkdir(mode=0o755, exist_ok=True)
    os.replace(partial, paths.rootfs)
    for parent in [paths.root, *paths.root.parents]:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o055)  # traversable by the sandbox uid
    atomic_write(paths.digest, (digest + "\n").encode())
    log(f"rootfs unpacked for bwrap: {paths.rootfs} ({digest[:19]}…)")


def import_docker(paths: ImagePaths, log=print) -> str:
    """Import the tarball into Docker under the image's name (once per tarball digest)."""
    import docker
    from docker.errors import DockerException, ImageNotFound

    digest = "sha256:" + file_sha256(paths.tarball)
    try:
        client = docker.from_env(timeout=600)
        try:
            image = client.images.get(paths.name)
            if (image.labels or {}).get(ROOTFS_LABEL) == digest:
                log(f"docker image {paths.name}: {image.id} (present)")
                return image.id
        except ImageNotFound:
            pass
        repo, _, tag = paths.name.partition(":")
        client.api.import_image_from_file(str(paths.tarball), repository=repo, tag=tag or "latest",
                                          changes=[f"LABEL {ROOTFS_LABEL}={digest}"])
        image = client.images.get(paths.name)
    except DockerException as e:
        raise ProfileUnavailable(f"image build: cannot import into Docker ({e}); is dockerd running?") from None
    log(f"docker image {paths.name}: {image.id}")
    return image.id


def build(name: str, backends: list[str], log=print) -> None:
    paths = ImagePaths(name)
    build_rootfs(paths, log)
    if "bwrap" in backends:
        unpack_rootfs(paths, log)
    if "docker" in backends:
        import_docker(paths, log)
