"""Images on every node, by digest: a Ray node about to play a contract has its sandbox image
at the frozen digest, or gets it from the driver's image store, or is an infrastructure fault
of that node.

Before a node rebuilds the runner's worker (`validate.run.executors.ray`), `ensure_image` asks
the node's own backend what image it would run (`Sandbox.facts().image_digest`: for bwrap the
digest computed from the store's tarball with the unpacked tree checked against it, for
docker the image's one layer's diff_id), under a lock of the node's store so its Ray workers
fetch it once. If that is not the contract's digest — no image, another one, a store whose
tarball or tree was damaged — the node fetches the tarball from the driver's store through
Ray's object store (`ImageSource`: the driver's node and the tarball's path there; chunks
read by a task pinned to the driver's node, so neither side holds the whole file), and
installs it with `validate.sandbox.imagefile.import_file`, which refuses bytes that are not the
digest, or not a safe sandbox image, before anything in the store changes, and lets the
backend prepare it (bwrap unpacks and checks the tree; docker imports and checks the layer).
The backend then checks again. A node where any of it fails raises `NodeImageUnavailable`
naming the node and why: the driver records the attempt as that node's infrastructure
fault, keeps the node out of the rest of the run, and plays the attempt elsewhere — a node's
image is never a reason for a reward.

A task-directory dataset's per-task images (`validate.taskdir.images.frozen`) are fetched by
image id when a trial needs one the node's daemon lacks (`TaskImageFetch`, the run context's
``fetch_image``): a task pinned to the driver's node saves the image from the driver's daemon
(``docker save``, once per image, into the driver's task-image store's ``saved/``), the node
reads it chunk by chunk as above and loads it (``docker load`` keeps the image's id: the
digest of its config), and the trial kind checks the id and its key label before a trial
runs in it. A node where that fails raises `TaskImageUnavailable`, a `SandboxError`: that
attempt's infrastructure error, naming the node, never a trial in another image.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from validate.core.errors import ClusterError, SandboxError, ValidateError
from validate.core.paths import ImagePaths, task_image_store
from validate.sandbox import open_sandbox
from validate.sandbox.image import read_record
from validate.sandbox.imagefile import file_name, import_file
from validate.taskdir.images.docker import DockerImages

#: Bytes per chunk of a tarball fetched from the driver's node.
CHUNK = 16 << 20


class TaskImageUnavailable(SandboxError):
    """A node that lacks a frozen task image and could not fetch it from the driver."""


class NodeImageUnavailable(ClusterError):
    """A node without the contract's image at its digest that could not get it (the error class
    of the attempt's row: an infrastructure fault of that node)."""


class ImageSource(BaseModel):
    """Where a node can fetch the contract's image: the driver's store, on the driver's node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = Field(description="the contract's execution.image")
    digest: str = Field(description="the contract's execution.image_digest")
    backend: str = Field(description="the contract's backend")
    node: str | None = Field(description="the driver's Ray node id; None: the driver's store "
                                         "holds no such image")
    path: str | None = Field(default=None, description="the tarball on the driver's node")
    size: int = Field(default=0, ge=0, description="its size in bytes")
    driver: str | None = Field(default=None,
                               description="the driver's Ray node id (where task images are saved)")


def driver_source(ray: Any, execution: dict) -> ImageSource:
    """The driver's offer: its store's tarball if that is the contract's digest (by its record,
    the nodes check the bytes), else nothing (each node must then have the image already)."""
    image, digest, backend = execution["image"], execution["image_digest"], execution["backend"]
    paths = ImagePaths(image)
    record = read_record(paths)
    driver = ray.get_runtime_context().get_node_id()
    if record is None or record.digest != digest or not paths.tarball.is_file():
        return ImageSource(image=image, digest=digest, backend=backend, node=None, driver=driver)
    return ImageSource(image=image, digest=digest, backend=backend, node=driver, path=str(paths.tarball),
                       size=paths.tarball.stat().st_size, driver=driver)


def _read_chunk(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)


def _digest_here(source: ImageSource) -> tuple[str | None, str]:
    """(the image digest this node's backend would run, or None; why not)."""
    try:
        sandbox = open_sandbox(source.backend, image=source.image, run_label=f"image-check.{os.getpid()}")
    except (ValidateError, OSError) as e:
        return None, str(e)
    try:
        return sandbox.facts().image_digest, ""
    except (ValidateError, OSError) as e:
        return None, str(e)
    finally:
        sandbox.close()


def _fetch(ray: Any, source: ImageSource, dest: Path) -> None:
    """The driver's tarball, chunk by chunk, into `dest` (checked by the import, not here)."""
    assert source.node is not None and source.path is not None  # an offer has both (`driver_source`)
    _fetch_file(ray, source.node, source.path, source.size, dest)


def _fetch_file(ray: Any, node: str, path: str, size: int, dest: Path) -> None:
    reader = ray.remote(num_cpus=0, max_retries=0, label_selector={"ray.io/node-id": node})(_read_chunk)
    with open(dest, "wb") as out:
        for offset in range(0, size, CHUNK):
            out.write(ray.get(reader.remote(path, offset, CHUNK)))


def _lock(name: str):
    """An exclusive lock of this node, shared by its Ray worker processes (a file in its tmp)."""
    lock = open(Path(tempfile.gettempdir()) / f"validate-{name}.lock", "a+b")
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def _saved_task_image(image_id: str) -> tuple[str, int]:
    """On the driver's node: the task image saved from its daemon into the task-image store's
    ``saved/<id hex>.tar`` (once: later requests read the same file); its path and size."""
    saved = task_image_store() / "saved"
    saved.mkdir(parents=True, exist_ok=True)
    target = saved / f"{image_id.removeprefix('sha256:')}.tar"
    with _lock(f"task-image-save-{hashlib.sha256(str(target).encode()).hexdigest()[:16]}"):
        if not target.is_file():
            staged = target.with_name(f".{target.name}.{os.getpid()}")
            try:
                DockerImages().save(image_id, staged)
                os.replace(staged, target)
            finally:
                staged.unlink(missing_ok=True)
    return str(target), target.stat().st_size


class TaskImageFetch:
    """The run context's ``fetch_image`` on a Ray node: a frozen task image this node's daemon
    lacks, by id, from the driver's daemon (see the module)."""

    def __init__(self, ray: Any, driver: str | None, where: str) -> None:
        self.ray, self.driver, self.where = ray, driver, where

    def __call__(self, image_id: str) -> None:
        if self.driver is None:
            raise TaskImageUnavailable(f"{self.where}: no task image {image_id} here, and no driver node to "
                                       "fetch it from")
        images = DockerImages()
        key = hashlib.sha256(f"{os.environ.get('DOCKER_HOST', '')} {image_id}".encode()).hexdigest()[:16]
        with _lock(f"task-image-fetch-{key}"):  # the node's other workers wait for one fetch
            if images.image_labels(image_id) is not None:
                return
            try:
                saver = self.ray.remote(num_cpus=0, max_retries=0,
                                        label_selector={"ray.io/node-id": self.driver})(_saved_task_image)
                path, size = self.ray.get(saver.remote(image_id))
                with tempfile.TemporaryDirectory(prefix="validate-task-image-") as tmp:
                    staged = Path(tmp) / "image.tar"
                    _fetch_file(self.ray, self.driver, path, size, staged)
                    images.load(staged)
            except Exception as e:  # noqa: BLE001 - a save, a transfer or a load that failed: the node's fault
                raise TaskImageUnavailable(
                    f"{self.where}: no task image {image_id} here, and fetching it "
                    f"from the driver failed: {type(e).__name__}: {str(e)[:500]}"
                ) from None
            if images.image_labels(image_id) is None:
                raise TaskImageUnavailable(f"{self.where}: the task image fetched from the driver does not "
                                           f"load as {image_id}")


def ensure_image(ray: Any, source: ImageSource, where: str) -> bool:
    """Make sure this node runs the contract's image at its digest (see the module); True when
    it had to fetch it. `where` names the node in the error."""
    paths = ImagePaths(source.image)
    # The lock lives beside the node's temporary files, not in its image store (nothing is
    # added to a store that holds the image already); one per store and image.
    key = hashlib.sha256(str(paths.root.resolve()).encode()).hexdigest()[:16]
    try:
        paths.base.mkdir(parents=True, exist_ok=True)
        lock = open(Path(tempfile.gettempdir()) / f"validate-image-fetch-{key}.lock", "a+b")
    except OSError as e:
        raise NodeImageUnavailable(
            f"{where}: its image store {paths.base} is unusable ({e.strerror or e})"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other Ray workers wait for one fetch
        have, why = _digest_here(source)
        if have == source.digest:
            return False
        said = (
            f"it has {have}" if have else f"it has none ({why.splitlines()[0][:300] if why else 'unknown'})"
        )
        if source.node is None:
            raise NodeImageUnavailable(f"{where}: not the contract's image {source.image} at "
                                       f"{source.digest}: {said}; the driver's store has none to send")
        try:
            with tempfile.TemporaryDirectory(prefix=".ray-fetch-", dir=paths.base) as tmp:
                staged = Path(tmp) / file_name(source.digest)
                _fetch(ray, source, staged)
                import_file(staged, source.image, digest=source.digest, backends=[source.backend],
                            replace=True, log=lambda _: None)
        except Exception as e:  # noqa: BLE001 - a transfer, a check or an install that failed: the node's fault
            raise NodeImageUnavailable(f"{where}: not the contract's image {source.image} at {source.digest} "
                                       f"({said}), and fetching it from the driver failed: "
                                       f"{type(e).__name__}: {str(e)[:500]}") from None
        have, why = _digest_here(source)
        if have != source.digest:
            raise NodeImageUnavailable(f"{where}: the image fetched from the driver still reads as {have} "
                                       f"({why[:300]}), not {source.digest}")
        return True
