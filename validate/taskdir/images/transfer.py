"""A contract's task images as one archive: ``validate image export --manifest M`` and
``validate image import FILE --manifest M``.

Export writes every image the contract froze (``execution.task_images``), held by this
daemon under its frozen key, as one ``docker save`` archive (layers shared between images
stored once), named ``task-images-<first 12 hex of the contract's sha256>.tar``; its sha256
is printed. A reviewer who imports it on another machine runs the trials in exactly those
images: the daemon keeps an image's id (its configuration's digest) through a save and a
load, so `validate verify` then finds every frozen id held.

Import is of hostile input: before the daemon reads it, the archive's own index
(``manifest.json``) must name only images the contract froze and no name (tag) at all, so
loading it can neither add nor shadow any other image (the sandbox image, a base). After the
load every frozen image must be there under its key with its frozen layers and, when the
contract froze one, its content digest (`validate.taskdir.images.content`); a difference is named
(the files and packages) and the command fails.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from validate.core.errors import ValidateError
from validate.core.paths import IMAGE_ARCHIVE_INDEX
from validate.taskdir.images.build import KEY_LABEL
from validate.taskdir.images.content import compare_content
from validate.taskdir.images.docker import images_for
from validate.taskdir.images.frozen import TaskImages, log_dir_of

_CONFIG = re.compile(r"^(?:blobs/sha256/)?([0-9a-f]{64})(?:\.json)?$")
_MAX_INDEX_BYTES = 16 << 20


def _frozen(m, manifest: Path) -> TaskImages:
    """The task images of the contract `m` (read from `manifest`), or a `ValidateError`."""
    frozen = m.execution.task_images
    if frozen is None or not any(e.image for e in frozen.tasks.values()):
        raise ValidateError(f"--manifest: {manifest} froze no task images (only a task-directory contract on "
                            f"docker or podman does)")
    return frozen


def export_task_images(m, manifest: Path, out: Path, log: Callable[[str], None] = print) -> Path:
    """Write the task images of the contract `m` (read from `manifest`) into `out` (a
    directory, or the archive's path)."""
    frozen = _frozen(m, manifest)
    images = images_for(m.execution.backend)
    ids = sorted({e.image for e in frozen.tasks.values() if e.image})
    for task_id, entry in sorted(frozen.tasks.items()):
        if entry.image and (images.image_labels(entry.image) or {}).get(KEY_LABEL) != entry.key:
            raise ValidateError(f"--manifest: this daemon does not hold task {task_id}'s frozen image "
                                f"{entry.image}; run `validate verify --manifest {manifest}` (it rebuilds "
                                "what it can) or export on the machine that froze it")
    path = (
        out / f"task-images-{m.sha256.removeprefix('sha256:')[:12]}.tar"
        if out.is_dir() or not out.suffix
        else out
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    api: Any = images.client.api  # its private _get/_url: docker's stubs type only the public API
    h = hashlib.sha256()
    partial = path.with_name(path.name + ".partial")
    res = api._get(api._url("/images/get"), params={"names": ids}, stream=True)
    api._raise_for_status(res)
    with open(partial, "wb") as fh:
        for chunk in res.iter_content(1 << 20):
            fh.write(chunk)
            h.update(chunk)
    partial.replace(path)
    log(f"exported {len(ids)} task images of {m.name} → {path} (sha256:{h.hexdigest()}, "
        f"{path.stat().st_size} bytes)")
    return path


def archive_images(archive: Path) -> set[str]:
    """The image ids an archive's index names; a `ValidateError` if it names any image by a
    name (tag), or is not a docker save archive."""
    try:
        with tarfile.open(archive, mode="r:") as tar:
            member = next((x for x in tar if x.name in (IMAGE_ARCHIVE_INDEX, f"./{IMAGE_ARCHIVE_INDEX}")),
                          None)
            if member is None or not member.isreg() or member.size > _MAX_INDEX_BYTES:
                raise ValidateError(f"{archive}: no manifest.json index: not an archive `validate image "
                                    "export --manifest` wrote")
            data = tar.extractfile(member)
            assert data is not None  # a regular member always has its data
            index = json.loads(data.read())
    except (tarfile.TarError, OSError, ValueError) as e:
        raise ValidateError(f"{archive}: not a readable image archive ({e})") from None
    ids: set[str] = set()
    for item in index if isinstance(index, list) else [None]:
        entry = item if isinstance(item, dict) else {}  # the archive's index is the user's file: any JSON
        config = _CONFIG.match(str(entry.get("Config", "")))
        if config is None:
            raise ValidateError(f"{archive}: its index names an image without a config digest")
        tags = entry.get("RepoTags")
        if tags:
            raise ValidateError(f"{archive}: names images {tags}; a task-image archive names "
                                "none (loading it must not add or replace a named image)")
        ids.add("sha256:" + config.group(1))
    return ids


def import_task_images(archive: Path, m, manifest: Path, log: Callable[[str], None] = print) -> int:
    """Load `archive` into the daemon after checking it holds only the images of the contract
    `m` (read from `manifest`, beside which its content listings lie); then hold every
    frozen image to its key, layers and content. Returns how many."""
    frozen = _frozen(m, manifest)
    wanted = {e.image for e in frozen.tasks.values() if e.image}
    named = archive_images(archive)
    if named - wanted:
        raise ValidateError(f"{archive}: holds images the contract did not freeze "
                            f"({sorted(named - wanted)[:3]}); refused before loading")
    images = images_for(m.execution.backend)
    images.load(archive)
    problems = []
    for task_id, entry in sorted(frozen.tasks.items()):
        if not entry.image:
            continue
        if (images.image_labels(entry.image) or {}).get(KEY_LABEL) != entry.key:
            problems.append(f"{task_id}: {entry.image} is not in the archive")
        elif tuple(images.image_layers(entry.image)) != entry.layers:
            problems.append(f"{task_id}: {entry.image} has other layers than the contract froze")
        elif entry.content is not None:
            differ = compare_content(images.client, entry.image, entry.content, entry.layers,
                                     log_dir_of(manifest), None)
            problems += [f"{task_id}: {'; '.join(differ)}"] if differ else []
    if problems:
        raise ValidateError(f"{archive}: {len(problems)} task image(s) not as frozen: "
                            f"{'; '.join(problems[:5])}")
    log(f"imported {len(wanted)} task images of {m.name}; each held to its frozen key, layers and content")
    return len(wanted)
