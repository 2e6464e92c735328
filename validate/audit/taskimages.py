"""Audit, the per-task images of a task-directory dataset (`validate.taskdir.images.frozen`): each
attempt names the image its contract routes its task to (the frozen image id; the sandbox
image for a task the contract froze no image for), and so does the verifier record it kept as
its reply (`check_reply_images`); the run's ``build-logs/`` holds, each named by its own
sha256, the build log of every frozen image a trial ran in, and, named by the content digest
the contract froze, its content listing; nothing else.

What the contract froze of the images is held to what re-derives it: each base of the
base-image map to the base this machine's image store holds of the same layer (the tarball's
sha256: its packages, apt sources, Python, tree; `check_base_maps`; a base the store does not
hold is named sealed-only), and each frozen image's patch and bases to the task's own
Dockerfile rewritten against that map (`check_patches`). An image's id, layers, key and build
log are the build's: bound by the seal (and held to the daemon by ``validate verify``).
"""

from __future__ import annotations

from typing import cast

import pandas as pd
from pydantic import ValidationError

from environment.harbor.reward import VerifierRecord
from environment.protocol import sha256_tag
from validate.contract.manifest import Manifest
from validate.core.paths import MANIFEST, RunPaths, task_image_store
from validate.evidence.journal import reply_path
from validate.taskdir.images.bases import BaseTarball
from validate.taskdir.images.build import TaskImageRefusal, plan
from validate.taskdir.images.content import ContentDelta
from validate.taskdir.images.dockerfile import REWRITE_VERSION
from validate.taskdir.images.frozen import BUILD_LOGS

#: The fields of a base the store's record of its layer re-derives.
BASE_FIELDS = ("recipe_digest", "tree_digest", "python", "packages", "apt_sources")
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
    for f in listings.values():
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
        r.problems.append(f"{kept}: no build log of the frozen image of {', '.join(missing[:5])}, "
                          "which trials ran in")
    r.checked.append(f"{len(frozen.tasks)} frozen task images: attempts' image digests routed, {len(files)} "
                     f"build logs by hash, {len(listings)} content listings by their frozen content digest")


def check_reply_images(paths: RunPaths, by_phase: dict[str, Manifest], attempts: pd.DataFrame, r) -> None:
    """A trial's reply is its verifier record (`environment.harbor.reward.VerifierRecord`),
    which names the image the trial ran in: under a contract that froze the task's image, it
    must be that image (a record moved from another task's trial names that task's)."""
    wrong = checked = 0
    for row in attempts.itertuples():
        # pandas' stubs type a row's fields as any cell; these columns hold strings
        phase, task_id = cast(str, row.phase), cast(str, row.task_id)
        m = by_phase.get(phase)
        frozen = None if m is None else m.execution.task_images
        want = None if frozen is None else frozen.digest_of(task_id)
        tag = row.reply_sha256
        if want is None or not isinstance(tag, str) or not tag.startswith("sha256:"):
            continue
        path = reply_path(paths, tag)
        try:  # a reply missing or not a record is the re-scoring's problem (`validate.audit.env`)
            record = VerifierRecord.model_validate_json(path.read_bytes())
        except (OSError, ValidationError, ValueError):
            continue
        checked += 1
        if record.image != want:
            wrong += 1
            if wrong <= 5:
                r.problems.append(f"{paths.attempts}: attempt {row.task_id}/{row.agent} try {row.attempt}: "
                                  f"its reply {path.name} names image {record.image}, not the image the "
                                  f"contract froze for the task ({want})")
    if wrong > 5:
        r.problems.append(f"{paths.attempts}: and {wrong - 5} more replies naming another image")
    if checked:
        r.checked.append(f"{checked} verifier records name their task's frozen image")


def check_base_maps(paths: RunPaths, found: dict[str, Manifest], r) -> None:
    """Each contract's base-image map held to the bases this machine's image store holds of the
    same layers; a base of a layer the store does not hold is named sealed-only."""
    store = task_image_store() / "bases"
    held = 0
    for name, m in sorted(found.items()):
        frozen = m.execution.task_images
        if frozen is not None:
            r.sealed_only.append(f"{name}: execution.task_images.tasks: each image's id, layers and key, "
                                 "what its build made (`validate verify` holds them to a daemon)")
        for recipe, base in sorted(frozen.base_map.bases.items()) if frozen is not None else ():
            at = f"execution.task_images.base_map.bases.{recipe}"
            record_path = store / recipe / "base.json"
            try:
                record = BaseTarball.model_validate_json(record_path.read_bytes())
            except (OSError, ValidationError, ValueError):
                record = None
            if record is None or record.layer != base.layer:
                r.sealed_only.append(f"{name}: {at.rsplit('.', 2)[0]} ({recipe}, layer {base.layer}): no "
                                     f"stored base of that layer here ({record_path}), so its packages, apt "
                                     "sources and Python are bound by the seal only")
                continue
            held += 1
            off = [f for f in BASE_FIELDS if getattr(record, f) != getattr(base, f)]
            if off:
                r.problems.append(f"{paths.root / name}: {at}: {', '.join(off)} are not those of the stored "
                                  f"base of its layer {base.layer} ({record_path})")
    if held:
        r.checked.append(f"{held} bases of the contracts' base-image maps held to the stored "
                         "bases of their layers")


def check_patches(paths: RunPaths, found: dict[str, Manifest], taskset_of, r) -> None:
    """Each frozen image's recorded patch (``patch_sha256``) and bases derived again from the
    task's own Dockerfile (or ``docker_image``) rewritten against the contract's map, as the
    build rewrote it (`validate.taskdir.images.build.plan`)."""
    checked = 0
    for name, m in sorted(found.items()):
        frozen = m.execution.task_images
        if frozen is None:
            continue
        if frozen.build_policy.registry is not None:
            r.sealed_only.append(f"{name}: execution.task_images.tasks: patch_sha256 and bases (pulled "
                                 f"through the registry {frozen.build_policy.registry}: re-deriving "
                                 "them would pull)")
            continue
        if frozen.rewrite_version != REWRITE_VERSION:
            r.sealed_only.append(f"{name}: execution.task_images.tasks: patch_sha256 and bases (rewrite "
                                 f"version {frozen.rewrite_version}, this code's is {REWRITE_VERSION})")
            continue
        taskset = taskset_of(m)
        for entry in m.tasks:
            image = frozen.tasks.get(entry.id)
            task = taskset.task(entry.idx)
            if image is None or image.image is None or task.parsed is None:
                continue
            docker_image = task.parsed.docker_image if task.parsed.environment == "image" else None
            planned = plan(taskset.task_dir(task), frozen.base_map, docker_image=docker_image,
                           policy=frozen.build_policy)
            got = (None, {}) if isinstance(planned, TaskImageRefusal) else \
                (sha256_tag(planned[1].encode()), {b.upstream: b.recipe for b in planned[2]})
            checked += 1
            off = [f for f, w in zip(("patch_sha256", "bases"), got, strict=True) if getattr(image, f) != w]
            if off:
                r.problems.append(f"{paths.root / name}: execution.task_images.tasks[{entry.id!r}]: "
                                  f"{', '.join(off)} not what the task's Dockerfile rewritten against the "
                                  f"contract's base-image map gives ({got[0]})")
    if checked:
        r.checked.append(f"{checked} frozen images' patches and bases derived again from their tasks")


def check_listing(f, contents: set[str], r) -> None:
    """A content listing in the run: named by a content digest the contract froze, and saying
    that digest (what another machine holds a rebuild to; `validate.taskdir.images.content`)."""
    digest = "sha256:" + f.name.removesuffix(LISTING)
    try:
        said = ContentDelta.model_validate_json(f.read_bytes()).digest
    except ValueError:
        said = None
    if digest not in contents:
        r.problems.append(f"{f}: a content listing the contract's task images do not name")
    elif said != digest:
        r.problems.append(f"{f}: is not the listing of the content it is named by")
