"""The docker backend for task images (`validate.taskdir.images.backend.ImageBackend`): the only
module of the package that speaks docker.

- A base tarball is imported as one layer (its diff id is the tarball's sha256, as for the
  sandbox image: `validate.sandbox.docker.image`), configured with the recipe's ``ENV`` and
  ``CMD``, and tagged under this harness's own repository (`BASE_REPOSITORY`), never under
  an upstream name: a task's Dockerfile reaches it only through the rewritten ``FROM <id>``.
- A task is built with the daemon's legacy builder (the SDK's ``/build``; docker 20.10),
  never pulling (``pull=False``: nothing can be pulled here, and a base is local anyway),
  with the policy's build network, intermediate containers removed even on failure, the
  cache key as a label. The build's output is the log, written as it streams.

`PodmanImages` is the same over the rootless podman service (the podman profile's own),
whose Docker API serves the build; a base goes in through libpod's import.

A daemon that does not answer raises `SandboxError`; an error the build reports (the
Dockerfile's own) is a `BuildRun` with ``error`` set.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import IO

import docker
import requests
import urllib3
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from validate.core.errors import ProfileUnavailable, SandboxError
from validate.sandbox import capabilities_of
from validate.sandbox.docker.image import image_layers
from validate.sandbox.podman.service import HOST_ENV, LIBPOD, default_host
from validate.taskdir.images.backend import BuildRun
from validate.taskdir.images.basemap import BaseRecipe

BASE_REPOSITORY = "deshuffle-validate-base"
_BUILT = re.compile(r"Successfully built ([0-9a-f]{12,64})")


def _changes(recipe: BaseRecipe) -> list[str]:
    """The image config a recipe asks for, as ``docker import --change`` lines."""
    for key, value in recipe.env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or re.search(r"\s", value):
            raise ValueError(f"recipe {recipe.name}: env {key}={value!r} cannot be an ENV change")
    lines = [f"ENV {key}={value}" for key, value in sorted(recipe.env.items())]
    return lines + ([f"CMD {json.dumps(list(recipe.cmd))}"] if recipe.cmd else [])


def _not_found(text: str) -> bool:
    """Whether a registry's answer, as the daemon relays it, says it has no such manifest."""
    return "not found" in text.lower() or "manifest unknown" in text.lower()


def context_tar(context: Path, dockerfile: str) -> IO[bytes]:
    """`context` as one tar, as docker's client sends it: what its ``.dockerignore`` excludes
    left out (read as bytes: a task's file in any encoding is its patterns, never a crash),
    but the ``.dockerignore`` and `dockerfile` always in, for the daemon to read and then
    drop from what ``COPY`` sees when the ``.dockerignore`` excludes them."""
    ignore = context / ".dockerignore"
    patterns: list[str] = []
    if ignore.is_file() and not ignore.is_symlink():
        lines = (line.strip() for line in ignore.read_bytes().decode("utf-8", "surrogateescape").splitlines())
        patterns = [line for line in lines if line and not line.startswith("#")]
    patterns.append("!.dockerignore")  # docker.utils.tar keeps the Dockerfile itself
    return docker.utils.tar(str(context), exclude=patterns, dockerfile=(dockerfile, None))


class DockerImages:
    """Task images and their bases in the daemon of ``DOCKER_HOST`` (or the client given)."""

    name = "docker"

    def __init__(self, base_url: str | None = None) -> None:
        self.base_url = base_url
        self.client = self._connect(600)

    def _connect(self, timeout_s: float) -> docker.DockerClient:
        try:
            if self.base_url is not None:
                return docker.DockerClient(base_url=self.base_url, timeout=timeout_s)
            return docker.from_env(timeout=timeout_s)
        except DockerException as e:
            raise SandboxError(f"task images: cannot reach Docker ({e}); is dockerd running?") from None

    def import_base(self, tarball: Path, recipe: BaseRecipe, layer: str) -> str:
        tag = f"{recipe.name}-v{recipe.version}"
        reference = f"{BASE_REPOSITORY}:{tag}"
        changes = _changes(recipe)
        try:
            try:
                image = self.client.images.get(reference)
                if image_layers(image) == [layer] and self._configured(image.attrs, recipe):
                    return image.id
            except ImageNotFound:
                pass
            self._import(tarball, tag, changes)
            image = self.client.images.get(reference)
        except DockerException as e:
            raise SandboxError(f"task images: cannot import base {recipe.name} into Docker ({e})") from None
        if image_layers(image) != [layer] or not self._configured(image.attrs, recipe):
            raise SandboxError(
                f"task images: docker imported {tarball} as layers {image_layers(image)} "
                f"configured {image.attrs.get('Config')}, not the one layer {layer} of {recipe.name}"
            )
        return image.id

    def _import(self, tarball: Path, tag: str, changes: list[str]) -> None:
        self.client.api.import_image_from_file(
            str(tarball), repository=BASE_REPOSITORY, tag=tag, changes=changes
        )

    @staticmethod
    def _configured(attrs: dict, recipe: BaseRecipe) -> bool:
        config = attrs.get("Config") or {}
        env = dict(line.split("=", 1) for line in config.get("Env") or [])
        return env == recipe.env and list(config.get("Cmd") or []) == list(recipe.cmd)

    def build(
        self,
        context: Path,
        labels: dict[str, str],
        network: str,
        timeout_s: float,
        log: IO[str],
        dockerfile: str = "Dockerfile",
    ) -> BuildRun:
        # A client of its own, closed when the build ends however it ends: closing the
        # connection is what cancels a legacy build in the daemon (a timeout, an interrupt),
        # which then removes the build's container (forcerm).
        client = self._connect(timeout_s)
        try:
            try:
                tar = context_tar(context, dockerfile)
            except OSError as e:  # the task's context unreadable, or this machine's disk
                log.write(f"\nERROR: the build context could not be packed: {e}\n")
                return BuildRun(
                    error=f"the build context could not be packed: {e}",
                    infrastructure=e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO),
                )
            with tar:
                return self._stream(client, tar, dockerfile, labels, network, timeout_s, log)
        finally:
            client.close()

    def _stream(
        self,
        client: docker.DockerClient,
        tar: IO[bytes],
        dockerfile: str,
        labels: dict[str, str],
        network: str,
        timeout_s: float,
        log: IO[str],
    ) -> BuildRun:
        deadline = time.monotonic() + timeout_s
        image_id = None
        try:
            stream = client.api.build(
                fileobj=tar,
                custom_context=True,
                dockerfile=dockerfile,
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                network_mode=network,
                labels=labels,
                timeout=timeout_s,
            )
            for chunk in stream:
                if "stream" in chunk:
                    log.write(chunk["stream"])
                    built = _BUILT.search(chunk["stream"])
                    image_id = image_id or (built.group(1) if built else None)
                if "aux" in chunk and isinstance(chunk["aux"], dict) and chunk["aux"].get("ID"):
                    image_id = chunk["aux"]["ID"]
                if "error" in chunk:
                    log.write(f"\nERROR: {chunk['error']}\n")
                    return BuildRun(error=str(chunk["error"]).strip())
                if time.monotonic() > deadline:
                    return self._timed_out(log, timeout_s)
        except (requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError, socket.timeout):
            # No output for the whole timeout (the SDK reads the stream from the raw socket).
            return self._timed_out(log, timeout_s)
        except APIError as e:
            log.write(f"\nERROR: {e.explanation or e}\n")
            # A 4xx is the request's fault, i.e. the context's (an unparsable Dockerfile);
            # anything else is the daemon's.
            return BuildRun(error=str(e.explanation or e), infrastructure=not e.is_client_error())
        except (
            DockerException,
            requests.exceptions.RequestException,
            urllib3.exceptions.HTTPError,
            OSError,
        ) as e:
            return BuildRun(error=f"docker did not answer the build ({e})", infrastructure=True)
        if image_id is None:
            return BuildRun(error="the build ended without naming an image", infrastructure=True)
        return BuildRun(image_id=self._full_id(image_id))

    @staticmethod
    def _timed_out(log: IO[str], timeout_s: float) -> BuildRun:
        log.write(f"\nERROR: the build exceeded its timeout of {timeout_s:g} s\n")
        return BuildRun(error=f"the build exceeded its timeout of {timeout_s:g} s (build_timeout_sec)")

    def _full_id(self, image_id: str) -> str:
        try:
            return self.client.api.inspect_image(image_id)["Id"]
        except DockerException as e:
            raise SandboxError(f"task images: the built image {image_id} cannot be inspected ({e})") from None

    def image_labels(self, image_id: str) -> dict[str, str] | None:
        try:
            return dict(self.client.api.inspect_image(image_id)["Config"].get("Labels") or {})
        except (ImageNotFound, NotFound):
            return None
        except DockerException as e:
            raise SandboxError(f"task images: cannot inspect {image_id} ({e})") from None

    def image_layers(self, image_id: str) -> list[str]:
        try:
            return list(self.client.api.inspect_image(image_id)["RootFS"].get("Layers") or [])
        except DockerException as e:
            raise SandboxError(f"task images: cannot inspect {image_id} ({e})") from None

    def pull(self, repository: str, tag_or_digest: str) -> str:
        """Pull `repository` at a tag or digest; its local image id. `LookupError` when the
        registry does not have it, `SandboxError` when the daemon or the registry fails."""
        try:
            for line in self.client.api.pull(repository, tag=tag_or_digest, stream=True, decode=True):
                if isinstance(line, dict) and line.get("error"):
                    raise APIError(str(line["error"]))
            sep = "@" if tag_or_digest.startswith("sha256:") else ":"
            return self.client.api.inspect_image(f"{repository}{sep}{tag_or_digest}")["Id"]
        except (NotFound, ImageNotFound) as e:
            raise LookupError(str(e.explanation or e)) from None
        except APIError as e:
            text = str(e.explanation or e)
            if _not_found(text):
                raise LookupError(text) from None
            raise SandboxError(f"task images: cannot pull {repository}:{tag_or_digest} ({text})") from None
        except DockerException as e:
            raise SandboxError(f"task images: cannot pull {repository}:{tag_or_digest} ({e})") from None

    def repo_digest(self, image_id: str, repository: str) -> str | None:
        """The manifest digest `repository` gave `image_id` when it was pulled."""
        digests = self.client.api.inspect_image(image_id).get("RepoDigests") or []
        return next((d.rpartition("@")[2] for d in digests if d.rpartition("@")[0] == repository), None)

    def remote_digest(self, reference: str) -> str | None:
        """The digest a registry's tag (or digest) resolves to now (None: the registry says it
        has no such manifest); `SandboxError` when the registry or the daemon fails, which is
        this machine's fault, never the contract's."""
        try:
            return self.client.api.inspect_distribution(reference)["Descriptor"]["digest"]
        except NotFound:
            return None
        except APIError as e:
            if _not_found(str(e.explanation or e)):
                return None
            why = e.explanation or e
            raise SandboxError(f"task images: cannot ask the registry for {reference} ({why})") from None
        except DockerException as e:
            raise SandboxError(f"task images: cannot ask the registry for {reference} ({e})") from None

    def save(self, image_id: str, dest: Path) -> None:
        """`docker save` of `image_id` into `dest`, written as the daemon streams it."""
        try:
            with open(dest, "wb") as out:
                for chunk in self.client.api.get_image(image_id, chunk_size=1 << 20):
                    out.write(chunk)
        except DockerException as e:
            raise SandboxError(f"task images: cannot save {image_id} ({e})") from None

    def load(self, tarball: Path) -> None:
        """`docker load` of a tarball `save` wrote (the image keeps its id: its config's digest)."""
        try:
            with open(tarball, "rb") as fh:
                said = [
                    line.get("error") for line in self.client.api.load_image(fh) if isinstance(line, dict)
                ]
        except DockerException as e:
            raise SandboxError(f"task images: cannot load {tarball.name} ({e})") from None
        if any(said):
            raise SandboxError(f"task images: cannot load {tarball.name} ({next(e for e in said if e)})")


class PodmanImages(DockerImages):
    """Task images and their bases in the rootless podman service (the podman profile's,
    `validate.sandbox.podman`; ``VALIDATE_PODMAN_HOST``), built there as its unprivileged
    user, through the same Docker API calls: podman answers the import and the legacy build
    endpoint (with its own builder). Its image ids mean something only to that service:
    `name` keeps its cache keys and records apart from docker's."""

    name = "podman"

    def __init__(self, base_url: str | None = None) -> None:
        super().__init__(base_url or os.environ.get(HOST_ENV) or default_host())

    def _import(self, tarball: Path, tag: str, changes: list[str]) -> None:
        # podman's own import: its Docker API's drops the tag and names the image
        # docker.io/library/<repository>:latest, which the reference then does not find.
        api = self.client.api
        with tarball.open("rb") as data:
            res = api.post(
                f"{api.base_url}/{LIBPOD}/libpod/images/import",
                params={"reference": f"{BASE_REPOSITORY}:{tag}", "changes": changes},
                data=data,
                headers={"Content-Type": "application/x-tar"},
                timeout=600,
            )
        api._raise_for_status(res)

    def _connect(self, timeout_s: float) -> docker.DockerClient:
        try:
            return docker.DockerClient(base_url=self.base_url, timeout=timeout_s, version="1.41")
        except DockerException as e:
            raise SandboxError(
                f"task images: cannot reach the rootless podman service at {self.base_url} ({e})"
            ) from None


#: The image engines by the name a backend declares (`Capabilities.images`).
ENGINES: dict[str, type[DockerImages]] = {"docker": DockerImages, "podman": PodmanImages}


def images_for(backend: str) -> DockerImages:
    """The engine that builds and holds task images for a profile's backend, as it declares
    (`Capabilities.images`); `ProfileUnavailable` for one that needs none."""
    engine = capabilities_of(backend).images
    if engine not in ENGINES:
        raise ProfileUnavailable(
            f"the {backend} backend declares no task-image engine ({engine!r}; "
            f"engines: {', '.join(sorted(ENGINES))})"
        )
    return ENGINES[engine]()
