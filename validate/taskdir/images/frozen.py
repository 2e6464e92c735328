"""Per-task images frozen in the contract: the protocol's "image hashes and task-to-image
routing" for a task-directory dataset.

At freeze (``validate freeze --env harbor`` on the docker backend) every selected task's
image is built (or taken from the content-addressed cache, `validate.taskdir.images.build`)
against the profile's base-image map, and the contract's execution profile records, as
`TaskImages`: the built map (each upstream base → local image by id and layer digest, with
each substitution's recorded differences), the build policy (the build-time network), the
build and rewrite versions, and per task id a `FrozenImage` — the image id the trial must
run in, or the refusal the build gave (a base or docker_image the map does not serve, a GPU, several steps:
``unsupported_execution_contract``; a Dockerfile that fails: ``invalid_task_or_verifier``
with the log's tail). Every build log is kept as evidence beside the manifest
(``<manifest stem>.build-logs/<sha256 hex>.log``, named by its own hash, which the entry
records), and so is each image's content listing (``<content digest hex>.content.json``,
`validate.taskdir.images.content`); a run copies the logs and listings of the images it used into
``build-logs/`` of its run directory, where the checksums seal them and the audit checks
them against the contract.

At run time (`routed`) a task runs in its frozen image id: the daemon's own image of that id
and key label, else (on a cluster's node) the image fetched from the run's driver by that id,
else the cache's build held to the frozen id — a different id (the cache was
cleared and the build is not reproducible, another daemon) is a `TaskImageMismatch`, an
infrastructure fault naming both ids, never a trial in another image. A frozen refusal is
returned as it was frozen, without building. The logs are also kept, content-addressed, in
the image store's ``logs/``, which is where the run's driver copies them from (`keep_run_log`).

``validate verify`` holds every frozen image the same way before anything runs
(`verify_images`): held by the daemon under its key with its frozen layers, or rebuilt by the
cache as that very id, else a `validate.core.errors.ContractError` naming the task (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from environment.protocol import sha256_tag
from validate.core.errors import ContractError, SandboxError
from validate.evidence.journal import atomic_write
from validate.sandbox import capabilities_of
from validate.taskdir.images.basemap import CORE, BaseImageMap
from validate.taskdir.images.bases import build_base_map, needed_recipes, task_refs
from validate.taskdir.images.budget import prune
from validate.taskdir.images.build import (
    BUILD_VERSION,
    KEY_LABEL,
    BuildPolicy,
    TaskImage,
    TaskImageRefusal,
    build_task_image,
)
from validate.taskdir.images.content import compare_content, content_file, record_content
from validate.taskdir.images.docker import DockerImages, images_for
from validate.taskdir.images.dockerfile import REWRITE_VERSION
from validate.taskdir.images.registry import PulledBase, moved_tags
from validate.taskdir.trial.support import unsupported

#: Where a run keeps the build logs of the images it ran (relative to the run directory).
BUILD_LOGS = "build-logs"
#: The store's content-addressed copy of every frozen build log (never overwritten: a log's
#: name is its hash), which a run copies its logs from.
LOGS = "logs"


class FrozenImage(BaseModel):
    """One task's routing: the image it runs in, or why it has none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str | None = Field(
        default=None, description="the image id ('sha256:<config digest>') the trial runs in"
    )
    key: str | None = Field(default=None, description="the content key the image is cached by")
    layers: tuple[str, ...] = Field(default=(), description="the image's layer digests, the base's first")
    bases: dict[str, str] = Field(
        default_factory=dict,
        description="each FROM of the Dockerfile → the recipe serving "
        "it, or what a registry gave: <registry>/<path>@<digest>",
    )
    patch_sha256: str | None = Field(
        default=None, description="sha256 of the Dockerfile's FROM rewrite (the patch)"
    )
    log_sha256: str | None = Field(
        default=None, description="sha256 of the build log (the file build-logs/<hex>.log)"
    )
    refusal: (
        Literal["unsupported_execution_contract", "invalid_task_or_verifier", "infrastructure_failure"] | None
    ) = None
    detail: str | None = None
    log_tail: str | None = None
    content: str | None = Field(
        default=None,
        description=(
            "the canonical digest of the image's filesystem (validate.taskdir.images.content: no build time "
            "in it), its listing beside the manifest as build-logs/<hex>.content.json; what another "
            "machine's rebuild is held to"
        ),
    )

    @model_serializer(mode="wrap")
    def _omit_no_content(self, handler: SerializerFunctionWrapHandler) -> dict:
        # Written only when recorded: every contract frozen before the field keeps its bytes.
        data = handler(self)
        if data.get("content") is None:
            data.pop("content", None)
        return data

    def refused(self) -> TaskImageRefusal | None:
        if self.refusal is None:
            return None
        return TaskImageRefusal(reason=self.refusal, detail=self.detail or "", log_tail=self.log_tail)


class TaskImages(BaseModel):
    """The execution profile's per-task images (``execution.task_images``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    build_version: int = BUILD_VERSION
    rewrite_version: int = REWRITE_VERSION
    build_policy: BuildPolicy = Field(description="the build-time policy: its network and timeout cap")
    base_map: BaseImageMap
    tasks: dict[str, FrozenImage] = Field(
        description="task id → its image or its refusal (tasks that loaded)"
    )

    def digest_of(self, task_id: str) -> str | None:
        entry = self.tasks.get(task_id)
        return None if entry is None else entry.image


class TaskImageMismatch(SandboxError):
    """The image this machine has for a task is not the one its contract froze."""


def log_dir_of(manifest_path: Path) -> Path:
    """Where a manifest's build logs are kept: ``<stem>.build-logs/`` beside it."""
    return manifest_path.with_name(f"{manifest_path.stem}.{BUILD_LOGS}")


def keep_log(source: str | Path | None, directory: Path) -> str | None:
    """Copy a build log into `directory` as ``<sha256 hex>.log``; return its sha256 tag."""
    if source is None or not Path(source).is_file():
        return None
    data = Path(source).read_bytes()
    tag = sha256_tag(data)
    target = directory / f"{tag.removeprefix('sha256:')}.log"
    if not target.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write(target, data)
    return tag


def _entry(
    built: TaskImage | TaskImageRefusal, log_dir: Path, store: Path, content: str | None = None
) -> FrozenImage:
    keep_log(built.log, store / LOGS)
    if isinstance(built, TaskImageRefusal):
        return FrozenImage(refusal=built.reason, detail=built.detail, log_tail=built.log_tail,
                           log_sha256=keep_log(built.log, log_dir))
    # The store's log is the one the image was built with (a cached image keeps its first log).
    log = keep_log(built.log, log_dir)
    return FrozenImage(
        image=built.image_id,
        key=built.key,
        layers=tuple(built.layers),
        bases={b.upstream: b.pulled if isinstance(b, PulledBase) else b.recipe for b in built.bases},
        patch_sha256=sha256_tag(built.patch.encode()),
        log_sha256=log or built.log_sha256,
        content=content,
    )


def base_of(base_map: BaseImageMap, layers) -> str | None:
    """The base image an image's first layer is (None: none of the map's)."""
    return next((b.image_id for b in base_map.bases.values() if layers and b.layer == layers[0]), None)


def _build(
    taskset,
    task,
    base_map: BaseImageMap,
    builder,
    store: Path,
    policy: BuildPolicy = BuildPolicy(),
    entry: FrozenImage | None = None,
) -> TaskImage | TaskImageRefusal:
    """One loaded task's image (from the cache when it holds it), as freeze builds it; a
    frozen `entry`'s registry digests are pulled, never its tags."""
    parsed = task.parsed
    return build_task_image(taskset.task_dir(task), base_map, builder, store, policy=policy,
                            build_timeout_s=parsed.config.environment.build_timeout_sec,
                            docker_image=parsed.docker_image if parsed.environment == "image" else None,
                            pins=pins_of(entry))


def pins_of(entry: FrozenImage | None) -> dict[str, str]:
    """A frozen entry's registry pins: upstream reference → ``<registry>/<path>@<digest>``."""
    return {} if entry is None else {up: by for up, by in entry.bases.items() if "@sha256:" in by}


def _first_base(built: TaskImage, base_map: BaseImageMap) -> str | None:
    """The image a task image's listing is kept relative to: the map's base of its first
    layer, or the first image pulled for it from a registry."""
    return base_of(base_map, built.layers) or next(
        (b.image_id for b in built.bases if isinstance(b, PulledBase)), None
    )


APPTAINER = ("the task also names an Apptainer image (sif_image {0}); running it needs an Apptainer backend, "
             "which this harness does not have (docs/apptainer.md)")


def apptainer_only(task) -> str | None:
    """Why a task with neither a Dockerfile nor an image reference, only an Apptainer image,
    cannot run here (None for any other task)."""
    if task.environment != "none":
        return None
    return (
        f"no environment/Dockerfile and no [environment].docker_image: only an Apptainer image "
        f"(sif_image {task.sif_image}); running it needs an Apptainer backend, which this harness does not "
        f"have (docs/apptainer.md)"
    )


def freeze_images(taskset, idx: Sequence[int], backend: str, log_dir: Path, store: Path,
                  builder=None, log: Callable[[str], None] = print,
                  policy: BuildPolicy = BuildPolicy(), budget_bytes: int | None = None) -> TaskImages | None:
    """Build (or take from the cache) the image of every selected task that loaded, with the
    profile's build `policy`, each distinct image once (tasks of one content share one key);
    None when the dataset is not one of task directories or the backend cannot run them (the
    trial kind then says why per task, as before). `budget_bytes`: after each build, task
    images this freeze does not route to are pruned while over it (`validate.taskdir.images.budget`)."""
    if capabilities_of(backend).trials is None or not hasattr(taskset, "task_dir"):
        return None

    builder = builder or images_for(backend)
    loaded = [t for t in (taskset.task(i) for i in idx) if t.parsed is not None]
    needed = needed_recipes(task_refs(loaded))
    # With a registry the bases are pulled by reference: no base is built (the map is empty).
    base_map = BaseImageMap(bases={}, substitutions=()) if policy.registry is not None else \
        build_base_map(builder, store / "bases", log=lambda m: None, needed=needed)
    if needed - {r.name for r in CORE}:
        log(f"task images: bases {', '.join(sorted(base_map.bases))} (those beyond the core for these tasks)")
    tasks: dict[str, FrozenImage] = {}
    for n, task in enumerate(loaded, 1):
        why = unsupported(task.parsed, backend) or apptainer_only(task.parsed)
        if why is not None:
            tasks[task.id] = FrozenImage(refusal="unsupported_execution_contract", detail=why)
            continue
        built = _build(taskset, task, base_map, builder, store, policy)
        if (
            isinstance(built, TaskImageRefusal)
            and task.parsed.sif_image
            and task.parsed.environment == "image"
        ):
            built = built.model_copy(
                update={"detail": f"{built.detail}; {APPTAINER.format(task.parsed.sif_image)}"}
            )
        content = None if isinstance(built, TaskImageRefusal) else \
            record_content(builder.client, built.image_id, _first_base(built, base_map), log_dir, store,
                           copies=(store / LOGS,))
        tasks[task.id] = _entry(built, log_dir, store, content)
        if budget_bytes is not None and isinstance(built, TaskImage) and not built.cached:
            prune(builder.client, budget_bytes, {e.image for e in tasks.values() if e.image}, log)
        state = f"refused, {built.reason}: {built.detail[:300]}" if isinstance(built, TaskImageRefusal) else \
            "cached" if built.cached else "built"
        log(f"task images: {n}/{len(loaded)} {task.id}: {state}")
    return TaskImages(build_policy=policy, base_map=base_map, tasks=dict(sorted(tasks.items())))


def routed(
    frozen: TaskImages,
    task_id: str,
    build: Callable[[], TaskImage | TaskImageRefusal],
    backend,
    fetch: Callable[[str], None] | None = None,
    evidence: Path | None = None,
) -> TaskImage | TaskImageRefusal | None:
    """The task's image as its contract routes it: a frozen refusal as frozen (nothing is
    built); the frozen image when `backend` holds it under its key's label, else what `fetch`
    (a cluster's driver) hands over, else the cache's (`build`) held to the frozen id. None:
    the contract routes no image for this task."""
    entry = frozen.tasks.get(task_id)
    if entry is None:
        return None
    if entry.refusal is not None:
        return entry.refused()
    # The daemon's own answer first: the store is shared by every daemon on the machine, so
    # its record may name another daemon's build of the same key.
    if _held(backend, entry):
        return _frozen_image(frozen, entry, backend)
    if fetch is not None:
        fetch(entry.image)
        if not _held(backend, entry):
            raise TaskImageMismatch(
                f"task image of {task_id}: the image fetched from the run's driver is not "
                f"{entry.image} under its key {entry.key}"
            )
        return _frozen_image(frozen, entry, backend)
    image = build()
    if isinstance(image, TaskImage) and image.image_id != entry.image and entry.content is not None:
        # Another machine's build of the same task: another id, and held to the frozen content.
        differ = compare_content(backend.client, image.image_id, entry.content, entry.layers, evidence, None)
        if not differ:
            return image
        raise TaskImageMismatch(
            f"task image of {task_id}: the contract froze {entry.image}; this machine's build "
            f"{image.image_id} is not its content: {'; '.join(differ)}"
        )
    if isinstance(image, TaskImageRefusal) or image.image_id != entry.image:
        have = image.detail if isinstance(image, TaskImageRefusal) else image.image_id
        raise TaskImageMismatch(f"task image of {task_id}: this machine has {have}, the contract froze "
                                f"{entry.image}; the trial runs in the frozen image only (freeze the dataset "
                                f"again on this machine, or import its images: validate image import)")
    return image


def _held(backend, entry: FrozenImage) -> bool:
    return (backend.image_labels(entry.image) or {}).get(KEY_LABEL) == entry.key


def _frozen_image(frozen: TaskImages, entry: FrozenImage, backend) -> TaskImage:
    return TaskImage(key=entry.key or "", context_digest="", backend=backend.name, image_id=entry.image,
                     layers=list(entry.layers), bases=[], patch="", policy=frozen.build_policy, timeout_s=0.0,
                     log="", log_sha256=entry.log_sha256 or "", cached=True)


def keep_run_log(frozen: TaskImages, task_id: str, store: Path, run_root: Path) -> None:
    """Copy the build log of the task's frozen image (from the store's ``logs/``) into the
    run's ``build-logs/``: on the driver, the one writer of the run directory, whichever
    machine ran the trial."""
    entry = frozen.tasks.get(task_id)
    if entry is None or not entry.image or not entry.log_sha256:
        return
    name = f"{entry.log_sha256.removeprefix('sha256:')}.log"
    if not (run_root / BUILD_LOGS / name).is_file():  # once per run and image, not per attempt
        keep_log(store / LOGS / name, run_root / BUILD_LOGS)
    listing = None if entry.content is None else content_file(store / LOGS, entry.content)
    if (
        listing is not None
        and listing.is_file()
        and not content_file(run_root / BUILD_LOGS, entry.content).is_file()
    ):
        atomic_write(content_file(run_root / BUILD_LOGS, entry.content), listing.read_bytes())


def verify_images(frozen: TaskImages, taskset, store: Path, builder=None, evidence: Path | None = None,
                  notes: list[str] | None = None) -> int:
    """``validate verify`` of a contract's task images: every frozen image is held by this
    daemon under its key's label with its frozen layers, or the cache rebuilds it (`store`)
    as that very image id, or (another machine) as an image whose content is the frozen
    content digest; else a `ContractError` naming the task, and the files and packages that
    differ (from the listing in `evidence`, beside the manifest). Returns how many images
    were checked."""
    images = {t: e for t, e in sorted(frozen.tasks.items()) if e.image is not None}
    if not images:
        return 0
    builder = builder or DockerImages()
    registry = frozen.build_policy.registry
    if registry is not None and notes is not None:  # a moved tag is named, never followed
        notes += moved_tags({u: p for e in images.values() for u, p in pins_of(e).items()}, registry, builder)
    tasks = {t.id: t for t in (taskset.task(i) for i in range(taskset.size)) if t.id in images}
    base_map = None
    for task_id, entry in images.items():
        field = f"execution.task_images.tasks[{task_id!r}].image"
        if (builder.image_labels(entry.image) or {}).get(KEY_LABEL) == entry.key:
            layers = tuple(builder.image_layers(entry.image))
            if layers != entry.layers:
                raise ContractError(
                    f"{field}: this daemon's {entry.image} has layers {list(layers)}, the manifest "
                    f"froze {list(entry.layers)}"
                )
            continue
        task = tasks.get(task_id)
        if task is None or task.parsed is None:
            raise ContractError(f"{field}: the task does not load here, so its image cannot be rebuilt")
        base_map = base_map or (frozen.base_map if registry is not None else build_base_map(
            builder, store / "bases", log=lambda m: None, needed=frozen.base_map.bases))
        built = _build(taskset, task, base_map, builder, store, frozen.build_policy, entry)
        have = built.detail if isinstance(built, TaskImageRefusal) else built.image_id
        if have != entry.image and entry.content is not None and isinstance(built, TaskImage):
            differ = compare_content(
                builder.client, built.image_id, entry.content, entry.layers, evidence, store
            )
            if differ:
                older = (
                    ""
                    if frozen.build_version == BUILD_VERSION
                    else (
                        f" (the contract was frozen by build version {frozen.build_version}, this code "
                        f"builds version {BUILD_VERSION}: before version 2 a `COPY .` copied this machine's "
                        f"rewritten Dockerfile; "
                        f"freeze the dataset again)"
                    )
                )
                raise ContractError(
                    f"{field}: the manifest says {entry.image}, not in this daemon; rebuilt here "
                    f"as {built.image_id}, whose content is not the frozen image's: "
                    f"{'; '.join(differ)}{older}"
                )
            continue
        if have != entry.image:
            why = (
                ""
                if entry.content is not None
                else (
                    "; the contract was frozen without a content digest, so a rebuild cannot be held to it: "
                    "import its "
                    "images (`validate image export --manifest` where it was frozen) or"
                )
            )
            raise ContractError(
                f"{field}: the manifest says {entry.image} but this machine has {have} (not in "
                f"the daemon; the cache's build differs){why or ';'} freeze the dataset again on "
                f"this machine"
            )
    return len(images)
