"""A disk budget for task images (``--image-budget-gb``): over it, images nothing at hand
needs are pruned, and each removal is logged.

Each task image is counted for the bytes its layers add to its base (its history down to the
first named image; `own_bytes`): what pruning it frees, its build's untagged steps with it. Only task images
(those labelled with a build key, `validate.taskdir.images.build.KEY_LABEL`) are ever counted or removed —
never a base, the sandbox image or anything else of the daemon's — and never one in `keep` (what the
freeze or run in progress still needs). The least recently created go first. An image pruned
is not lost evidence: its build is content-addressed (the same key rebuilds it) and, with a
fixed build clock, to the same content (`validate.taskdir.images.content`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from validate.core.errors import SandboxError
from validate.taskdir.images.build import KEY_LABEL


def task_image_usage(client) -> list[tuple[str, int, int]]:
    """Every task image of the daemon as (id, created, bytes only it holds), oldest first."""
    try:
        images = client.api.df().get("Images") or []
    except Exception as e:  # the SDK's errors: the daemon does not answer
        raise SandboxError(f"task images: cannot read the daemon's disk usage ({e})") from None
    out = []
    for image in images:
        if KEY_LABEL in (image.get("Labels") or {}):
            out.append((image["Id"], int(image.get("Created") or 0), own_bytes(client, image["Id"])))
    return sorted(out, key=lambda x: (x[1], x[0]))


def own_bytes(client, image_id: str) -> int:
    """The bytes an image's layers add to its base: its history's sizes down to the first
    named (tagged) image, the base it was built on (the build's intermediate steps, untagged,
    count as its own: pruning it removes them with it)."""
    total = 0
    for step in client.api.history(image_id):
        if step.get("Tags"):
            break
        total += int(step.get("Size") or 0)
    return total


def prune(client, budget_bytes: int, keep: Iterable[str], log: Callable[[str], None] = print,
          only: Iterable[str] | None = None) -> list[str]:
    """Remove the oldest task images not in `keep` while their total exceeds `budget_bytes`;
    return the ids removed (each logged with what it freed). `only`: the images that may be
    counted and removed (None: every task image of the daemon)."""
    usage = task_image_usage(client)
    if only is not None:
        allowed = set(only)
        usage = [u for u in usage if u[0] in allowed]
    total = sum(own for _, _, own in usage)
    kept, removed = set(keep), []
    for image_id, _, own in usage:
        if total <= budget_bytes:
            break
        if image_id in kept:
            continue
        try:
            client.api.remove_image(image_id, force=True, noprune=False)
        except Exception as e:  # in use by a container, or already gone: not this budget's to force
            log(f"task images: over the budget, but {image_id} could not be pruned ({e})")
            continue
        total -= own
        removed.append(image_id)
        log(f"task images: pruned {image_id} ({own / 2**20:.2f} MiB) to keep to the budget of "
            f"{budget_bytes / 2**20:.1f} MiB (now {total / 2**20:.1f} MiB)")
    if total > budget_bytes:
        log(f"task images: {total / 2**20:.1f} MiB, over the budget of {budget_bytes / 2**20:.1f} MiB: the "
            "rest is needed by what is in progress")
    return removed
