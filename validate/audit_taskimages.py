"""Audit, the per-task images of a task-directory dataset (`validate.taskimage.frozen`): each
attempt names the image its contract routes its task to (the frozen image id; the sandbox
image for a task the contract froze no image for), and the run's ``build-logs/`` holds, each
named by its own sha256, the build log of every frozen image a trial ran in, and, named by
the content digest the contract froze, its content listing; nothing else.
"""

from __future__ import annotations

import pandas as pd

from environment.protocol import sha256_tag
from validate.contract import Manifest
from validate.paths import MANIFEST, RunPaths
from validate.taskimage.content import ContentDelta
from validate.taskimage.frozen import BUILD_LOGS

LISTING = ".content.json"


def routed_digests(m: Manifest, task_ids: pd.Series) -> pd.Series:
    """The image digest each row must name: its task's frozen image, else the sandbox image."""
    frozen = m.execution.task_images
    if frozen is None:
        return pd.Series(m.execution.image_digest, index=task_ids.index)
    return task_ids.map(lambda t: frozen.digest_of(t) or m.execution.image_digest)


def check_build_logs(paths: RunPaths, found: dict[str, Manifest], attempts: pd.DataFrame, r) -> None:
    root = found.get(MANIFEST)
    frozen = None if root is None else root.execution.task_images
    kept = paths.root / BUILD_LOGS
    if frozen is None:
        if kept.exists():
            r.problems.append(f"{kept}: build logs in a run whose contract froze no task images")
        return
    expected = {e.log_sha256.removeprefix("sha256:") for e in frozen.tasks.values() if e.log_sha256}
    contents = {e.content for e in frozen.tasks.values() if e.content}
    files = {f.name: f for f in sorted(kept.glob("*"))} if kept.is_dir() else {}
    listings = {n: files.pop(n) for n in [n for n in files if n.endswith(LISTING)]}
    for name, f in listings.items():
        check_listing(f, contents, r)
    for name, f in files.items():
        stem = name.removesuffix(".log")
        if not name.endswith(".log") or sha256_tag(f.read_bytes()).removeprefix("sha256:") != stem:
            r.problems.append(f"{f}: is not named by its own sha256")
        elif stem not in expected:
            r.problems.append(f"{f}: a build log the contract's task images do not name")
    ran = set(attempts.loc[attempts["reply_sha256"].notna(), "task_id"]) if len(attempts) else set()
    missing = sorted(t for t in ran if (e := frozen.tasks.get(t)) is not None and e.image and e.log_sha256
                     and f"{e.log_sha256.removeprefix('sha256:')}.log" not in files)
    if missing:
        r.problems.append(f"{kept}: no build log of the frozen image of {', '.join(missing[:5])}, which trials ran in")
    r.checked.append(f"{len(frozen.tasks)} frozen task images: attempts' image digests routed, {len(files)} build "
                     f"logs by hash, {len(listings)} content listings by their frozen content digest")


def check_listing(f, contents: set[str], r) -> None:
    """A content listing in the run: named by a content digest the contract froze, and saying
    that digest (what another machine holds a rebuild to; `validate.taskimage.content`)."""
    digest = "sha256:" + f.name.removesuffix(LISTING)
    try:
        said = ContentDelta.model_validate_json(f.read_bytes()).digest
    except ValueError:
        said = None
    if digest not in contents:
        r.problems.append(f"{f}: a content listing the contract's task images do not name")
    elif said != digest:
        r.problems.append(f"{f}: is not the listing of the content it is named by")
