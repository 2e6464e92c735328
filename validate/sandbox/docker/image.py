"""The docker backend's side of the sandbox image: importing the built rootfs tarball into the
daemon as one layer (whose diff_id is the tarball's sha256, the contract's image digest), and
reading the image's Debian packages back out of the daemon."""

from __future__ import annotations

import io
import tarfile

from validate.core.errors import ProfileUnavailable
from validate.core.paths import ImagePaths
from validate.sandbox.image import DPKG_STATUS, parse_dpkg_status, require_record

_PACKAGES: dict[str, dict[str, str]] = {}


def image_layers(image) -> list[str]:
    return list(image.attrs.get("RootFS", {}).get("Layers") or [])


def import_docker(paths: ImagePaths, log=print) -> str:
    """Import the tarball into the Docker daemon of ``DOCKER_HOST`` under the image's name
    (unless the image there already is that one layer); returns the image id."""
    import docker
    from docker.errors import DockerException, ImageNotFound

    record = require_record(paths)
    try:
        client = docker.from_env(timeout=600)
        try:
            image = client.images.get(paths.name)
            if image_layers(image) == [record.digest]:
                log(f"docker image {paths.name}: {image.id} (present)")
                return image.id
        except ImageNotFound:
            pass
        repo, _, tag = paths.name.partition(":")
        client.api.import_image_from_file(str(paths.tarball), repository=repo, tag=tag or "latest")
        image = client.images.get(paths.name)
    except DockerException as e:
        raise ProfileUnavailable(
            f"image build: cannot import into Docker ({e}); is dockerd running?"
        ) from None
    if image_layers(image) != [record.digest]:
        raise ProfileUnavailable(f"image build: docker imported {paths.tarball} as layers "
                                 f"{image_layers(image)}, not the one layer {record.digest}")
    log(f"docker image {paths.name}: {image.id} (layer {record.digest[:19]}…)")
    return image.id


def image_packages(client, image_id: str, labels: dict[str, str]) -> dict[str, str]:
    """The packages of a Docker image, read from its dpkg status through a created (never
    started) container; once per image id and process."""
    if image_id not in _PACKAGES:
        from docker.errors import NotFound

        api = client.api
        cid = api.create_container(image_id, command=["/bin/true"], network_disabled=True,
                                   labels=labels)["Id"]
        try:
            chunks, _ = api.get_archive(cid, "/" + DPKG_STATUS)
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                member = tar.next()
                text = tar.extractfile(member).read().decode()
        except NotFound:
            raise ProfileUnavailable(f"execution.image: {image_id} has no /{DPKG_STATUS}; build the image "
                                     f"with `validate image build`") from None
        finally:
            api.remove_container(cid, force=True)
        _PACKAGES[image_id] = parse_dpkg_status(text)
    return _PACKAGES[image_id]
