"""What a container backend provides for task images: importing a base tarball, building a
context, and looking images up. `validate.taskdir.images.docker` is the docker implementation;
the rest of the package knows only this interface.

A backend raises `validate.core.errors.SandboxError` (or `ProfileUnavailable`) when it cannot do
the work at all (the daemon does not answer); a build that the task's own Dockerfile makes
fail is not an error but a `BuildRun` with ``error`` set.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Protocol

from pydantic import BaseModel

from validate.taskdir.images.basemap import BaseRecipe


class BuildRun(BaseModel):
    """One build as the backend saw it: the image made, or the error the build ended with."""

    image_id: str | None = None
    error: str | None = None
    #: True when the error is the backend's or the machine's (the daemon, a timeout of the
    #: connection), not the task's Dockerfile: the caller may retry, never blame the task.
    infrastructure: bool = False


class ImageBackend(Protocol):
    #: Recorded with every image: an image id means something only to its backend.
    name: str

    def import_base(self, tarball: Path, recipe: BaseRecipe, layer: str) -> str:
        """Make `tarball` (one layer whose digest is `layer`) an image configured as `recipe`
        says, under a local name (never an upstream one); return its id. Reuses an image
        already there that has exactly that layer and configuration."""
        ...

    def build(self, context: Path, labels: dict[str, str], network: str, timeout_s: float,
              log: IO[str], dockerfile: str = "Dockerfile") -> BuildRun:
        """Build `context` from its file named `dockerfile`, writing the build's output to
        `log`. The context is sent as docker's client sends it: what its ``.dockerignore``
        excludes left out, but that file and the Dockerfile always sent (the daemon drops
        each from what ``COPY`` sees when the ``.dockerignore`` excludes it)."""
        ...

    def image_labels(self, image_id: str) -> dict[str, str] | None:
        """The labels of an image present here, or None when it is not."""
        ...

    def image_layers(self, image_id: str) -> list[str]:
        """The layer digests (diff ids) of an image present here."""
        ...
