"""One task's image: built from its ``environment/`` context against a base-image map, cached
by content, every outcome returned as data.

`build_task_image` reads ``environment/Dockerfile``, resolves every external image it names
(`validate.taskdir.images.dockerfile`) through the `BaseImageMap`, rewrites the Dockerfile to
the local image ids (the recorded patch), and has the backend build a copy of the context
with the profile's `BuildPolicy`. The rewrite goes into the copy beside the task's own
``Dockerfile``, as `BUILD_DOCKERFILE`, which the context's ``.dockerignore`` excludes (as
docker's own client does with a Dockerfile from outside the context): a ``COPY .`` copies
the task's file as the task wrote it, never this machine's base image ids, so the image's
content is the same on every machine. A task whose ``[environment].docker_image`` names
its image (no Dockerfile) is served the same way: its image is the base the map serves for
that reference (`image_task`: the same substitution and recorded differences as a ``FROM`` of
it), labelled with its key by a build of an empty context whose Dockerfile is only
``FROM <base id>`` (no layer is added); the recorded patch is that setting's rewrite
(`image_patch`). Outcomes:

- a `TaskImage`: the image id, its layers, the bases and their recorded differences, the
  Dockerfile patch, the policy, and the build log kept in the store;
- a `TaskImageRefusal` with reason ``unsupported_execution_contract`` (a base the profile
  does not serve: "ubuntu:24.04 is not available on this profile", a ``docker_image`` it
  does not serve likewise; an ``ARG``-made base;
  an environment that is not a Dockerfile) or ``invalid_task_or_verifier`` (the build failed
  for the Dockerfile's own reasons: an error, a ``COPY`` outside the context, the task's
  build timeout), with the log's tail; or, when the build failed for the machine's reasons
  and the harness's own probe of the host the log names confirms it (a TLS-intercepting
  proxy the build does not trust, an index this machine does not reach:
  `validate.taskdir.images.netfault`), ``infrastructure_failure`` or
  ``unsupported_execution_contract``, never the task's fault.

A policy with a trust store (`validate.taskdir.images.trust`) gives every build the host's CA
bundle: the Dockerfile's change is part of the recorded patch.

A failure of the backend itself (the daemon does not answer) is no verdict on the task: it
raises `validate.core.errors.SandboxError`, retryable.

The cache key is the sha256 of the context's content (`context_digest`: every file's
relative path, bytes and executable bit, every symlink's target; no mtime), the resolved
bases (image id, layer digest, recipe and substitution versions), the rewrite's version, the
policy and the backend. The store keeps ``<store>/<key hex>/build.log`` and ``image.json``;
a second build of the same task finds ``image.json``, checks the backend still holds that
image carrying that key's label, and returns it without building (``cached=True``).
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from environment.protocol import canonical_json, sha256_tag
from validate.core.errors import SandboxError
from validate.core.records import INVALID_TASK_OR_VERIFIER, UNSUPPORTED_CONTRACT
from validate.evidence.journal import atomic_write
from validate.taskdir.images.backend import ImageBackend
from validate.taskdir.images.basemap import BaseImageMap, ResolvedBase
from validate.taskdir.images.dockerfile import (
    REWRITE_VERSION,
    DockerfileError,
    Unresolvable,
    external_images,
    ignore_also,
    rewrite,
)
from validate.taskdir.images.netfault import classify
from validate.taskdir.images.registry import PulledBase, PullRefused, pull
from validate.taskdir.images.trust import (
    add_to_context,
    after_every_from,
    clock_lines,
    held_bundle,
    is_host_bundle,
    trust_lines,
)

#: Bumped whenever what a key covers, or how a build is made, changes (2: the rewritten
#: Dockerfile beside the task's, excluded from ``COPY``).
BUILD_VERSION = 2
#: The harness's rewritten Dockerfile in the build's copy of the context.
BUILD_DOCKERFILE = ".validate-build.Dockerfile"
KEY_LABEL = "deshuffle-validate.task-image.key"
LOG_TAIL_CHARS = 2000


class BuildPolicy(BaseModel):
    """What the profile allows a task's build: recorded with every image."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: "host": the build's RUN steps share the host's network, so apt reaches the Debian
    #: archive (nothing else does: a bridge resolves no name on these machines); "none": no
    #: network at all, for profiles that build only what needs no download.
    network: Literal["host", "none"] = "host"
    #: A task's ``build_timeout_sec`` is capped at this.
    max_timeout_s: float = Field(default=1800.0, gt=0)
    #: The sha256 of the CA bundle every build is given (`validate.taskdir.images.trust`: the
    #: host's, for a machine behind a TLS-intercepting proxy); None: builds trust only what
    #: their images do.
    trust_store: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    #: The fixed clock (a Unix time) builds are given as ``SOURCE_DATE_EPOCH`` and git's
    #: dates (`validate.taskdir.images.trust.clock_lines`), so what a build writes is the same on
    #: any machine; None: the build's own clock.
    clock: int | None = Field(default=None, ge=0)
    #: A registry or mirror (``host[:port]``) the build host may pull bases and prebuilt images
    #: from by reference, each then frozen by digest (`validate.taskdir.images.registry`); None:
    #: the offline base-image map serves them.
    registry: str | None = Field(default=None, pattern=r"^[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._/-]+)?$")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict:
        # Written (and keyed) only when set: every image key and contract made before these
        # options keeps its bytes.
        data = handler(self)
        for name in ("trust_store", "clock", "registry"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class TaskImage(BaseModel):
    """A task's built image (``image.json`` in the store; ``cached`` is the caller's news)."""

    key: str = Field(description="'sha256:<hex>' the image is cached by")
    context_digest: str
    backend: str
    image_id: str
    layers: list[str] = Field(description="the image's layer digests, the base's first")
    bases: list[ResolvedBase | PulledBase] = Field(
        description="each external image of the Dockerfile and what "
        "served it (the map's base, or the registry's image)"
    )
    patch: str = Field(description="unified diff of environment/Dockerfile: the FROM rewrite")
    patch_version: int = REWRITE_VERSION
    policy: BuildPolicy
    timeout_s: float
    log: str = Field(description="the build log's path")
    log_sha256: str
    cached: bool = Field(default=False, exclude=True)


class TaskImageRefusal(BaseModel):
    """Why a task has no image: the verdict reason, one line of detail, the log's tail."""

    reason: Literal["unsupported_execution_contract", "invalid_task_or_verifier", "infrastructure_failure"]
    detail: str
    log_tail: str | None = None
    log: str | None = None


def context_digest(context: Path) -> str:
    """sha256 over every entry under `context` (sorted by path): kind, relative path, and a
    file's bytes and executable bit, or a symlink's target. Symlinks are never followed."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(context):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            rel = path.relative_to(context).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries.append([rel, "l", os.readlink(path)])
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
                entries.append([rel, "x" if st.st_mode & 0o111 else "f", digest])
            elif stat.S_ISDIR(st.st_mode):
                entries.append([rel, "d", ""])
            else:
                entries.append([rel, "?", ""])  # a FIFO or socket: docker refuses it; the key still names it
    return sha256_tag(canonical_json(sorted(entries)))


def build_key(
    ctx_digest: str,
    bases: list[ResolvedBase | PulledBase],
    policy: BuildPolicy,
    backend: str,
    timeout_s: float,
) -> str:
    return sha256_tag(
        canonical_json(
            {
                "version": BUILD_VERSION,
                "rewrite": REWRITE_VERSION,
                "context": ctx_digest,
                "backend": backend,
                "bases": [b.key() for b in bases],
                "policy": policy.model_dump(mode="json"),
                "timeout_s": timeout_s,
            }
        )
    )


def build_task_image(
    task_dir: Path,
    base_map: BaseImageMap,
    backend: ImageBackend,
    store: Path,
    policy: BuildPolicy = BuildPolicy(),
    build_timeout_s: float = 600.0,
    context: str = "environment",
    docker_image: str | None = None,
    pins: Mapping[str, str] | None = None,
) -> TaskImage | TaskImageRefusal:
    """The image of the task at `task_dir` (see the module's docstring); `build_timeout_s` is
    the task's ``[environment].build_timeout_sec``; `context` ``tests``: a separate verifier's
    image, from ``tests/Dockerfile`` (the same map, policy and cache); `docker_image`: the
    task's ``[environment].docker_image``, whose image is the base the map serves for it
    (`image_task`), no Dockerfile read. With the policy's registry, every external image is
    pulled through it instead (`validate.taskdir.images.registry`), each by the digest `pins`
    gives it (upstream → ``<registry>/<path>@<digest>``, what a contract froze) if any."""
    planned = plan(task_dir, base_map, context, docker_image, policy, backend, pins)
    if isinstance(planned, TaskImageRefusal):
        return planned
    new_text, patch, bases = planned
    bundle = held_bundle(policy.trust_store)
    env = None if docker_image is not None else task_dir / context
    ctx_digest = (
        sha256_tag(canonical_json({"docker_image": docker_image})) if env is None else context_digest(env)
    )
    timeout_s = min(build_timeout_s, policy.max_timeout_s)
    key = build_key(ctx_digest, bases, policy, backend.name, timeout_s)
    slot = store / key.removeprefix("sha256:")
    slot.mkdir(parents=True, exist_ok=True)
    with open(slot / ".lock", "w") as lock:
        # Two builds of one key (two runs, or two tasks with the same content) wait for each
        # other: the second finds the first's image instead of clobbering its log.
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _cached(slot, key, backend)
        if cached is not None:
            return cached
        record = TaskImage(
            key=key,
            context_digest=ctx_digest,
            backend=backend.name,
            image_id="",
            layers=[],
            bases=bases,
            patch=patch,
            policy=policy,
            timeout_s=timeout_s,
            log=str(slot / "build.log"),
            log_sha256="",
        )
        return _build_and_record(env, new_text, backend, record, bundle)


def plan(
    task_dir: Path,
    base_map: BaseImageMap,
    context: str = "environment",
    docker_image: str | None = None,
    policy: BuildPolicy = BuildPolicy(),
    backend: ImageBackend | None = None,
    pins: Mapping[str, str] | None = None,
) -> tuple[str, str, list[ResolvedBase]] | TaskImageRefusal:
    """What a build of the task runs, decided from its files, the map and the policy: (the
    Dockerfile with its bases rewritten to the local images and the policy's trust store and
    clock added after every ``FROM``, that change as a unified diff: the recorded patch, what
    serves each base), or why it cannot be built here. With the policy's registry the bases are
    pulled through `backend`. The audit derives a frozen image's patch and bases again with it
    (a registry's pulls aside: those are sealed only)."""
    env = None if docker_image is not None else task_dir / context
    if policy.registry is not None:
        if backend is None:
            raise ValueError("plan: a registry's bases are pulled through a backend; none given")
        resolved = pulled_bases(env, docker_image, policy.registry, backend, pins or {})
    elif docker_image is not None:
        resolved = image_task(docker_image, base_map)
    else:
        resolved = resolve_bases(env, base_map)
    if isinstance(resolved, TaskImageRefusal):
        return resolved
    text, bases = resolved
    if docker_image is not None:  # no build step: nothing to give the trust store to
        return f"FROM {bases[0].image_id}\n", image_patch(docker_image, bases[0].image_id), bases
    new_text, patch = rewrite(text, {b.upstream: b.image_id for b in bases})
    added = [
        *(trust_lines() if policy.trust_store is not None else []),
        *(clock_lines(policy.clock) if policy.clock is not None else []),
    ]
    if added:
        new_text = after_every_from(new_text, added)
        patch = "".join(
            difflib.unified_diff(
                text.splitlines(keepends=True),
                new_text.splitlines(keepends=True),
                f"a/{context}/Dockerfile",
                f"b/{context}/Dockerfile",
            )
        )
    return new_text, patch, bases


def _build_and_record(
    env: Path | None, dockerfile: str, backend: ImageBackend, record: TaskImage, bundle: bytes | None = None
) -> TaskImage | TaskImageRefusal:
    """Build, then fill in `record` (all but the image) and store it, or say why not: the
    task's failure, or the machine's when the harness's own probes confirm it
    (`validate.taskdir.images.netfault`)."""
    log_path = Path(record.log)
    run = _build(
        env,
        dockerfile,
        backend,
        {KEY_LABEL: record.key},
        record.policy.network,
        record.timeout_s,
        log_path,
        bundle,
    )
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    if run.error is not None:
        if run.infrastructure:
            raise SandboxError(f"task image build: {run.error}")
        tail = log_text[-LOG_TAIL_CHARS:]
        machine = classify(log_text, record.policy.network, trusted=is_host_bundle(bundle))
        if machine is not None:
            return TaskImageRefusal(
                reason=machine[0],
                detail=f"the build failed for this machine's reasons: {machine[1]}",
                log_tail=tail,
                log=str(log_path),
            )
        return TaskImageRefusal(
            reason=INVALID_TASK_OR_VERIFIER,
            detail=f"the build failed: {run.error}",
            log_tail=tail,
            log=str(log_path),
        )
    result = record.model_copy(
        update={
            "image_id": run.image_id,
            "layers": backend.image_layers(run.image_id),
            "log_sha256": sha256_tag(log_path.read_bytes()),
        }
    )
    atomic_write(log_path.with_name("image.json"), (result.model_dump_json(indent=1) + "\n").encode())
    return result


def image_task(
    docker_image: str, base_map: BaseImageMap
) -> tuple[str, list[ResolvedBase]] | TaskImageRefusal:
    """A ``[environment].docker_image`` task's one base, as `resolve_bases` answers for a
    Dockerfile that is only ``FROM <docker_image>``: the same substitution, the same recorded
    differences; a reference the map does not serve is unsupported, naming it."""
    served = base_map.resolve(docker_image)
    if served is None:
        return TaskImageRefusal(
            reason=UNSUPPORTED_CONTRACT,
            detail=f"[environment].docker_image {docker_image} is not available on this profile",
        )
    return f"FROM {docker_image}\n", [served]


def image_patch(docker_image: str, image_id: str) -> str:
    """The recorded patch of a ``docker_image`` task: its task.toml's image replaced by the
    local one that serves it (a unified diff of that one setting, as `rewrite`'s of a ``FROM``)."""
    return "".join(
        difflib.unified_diff(
            [f"docker_image = {json.dumps(docker_image)}\n"],
            [f"docker_image = {json.dumps(image_id)}\n"],
            "a/task.toml [environment]",
            "b/task.toml [environment]",
        )
    )


def _dockerfile_refs(env: Path) -> tuple[str, list[str]] | TaskImageRefusal:
    """(the Dockerfile's text, the external images it names, in order), or why not."""
    dockerfile = env / "Dockerfile"
    name = f"{env.name}/Dockerfile"
    if not dockerfile.is_file() or dockerfile.is_symlink():
        return TaskImageRefusal(
            reason=UNSUPPORTED_CONTRACT,
            detail=f"{name}: missing; this profile builds only Dockerfile environments",
        )
    try:
        text = dockerfile.read_text(encoding="utf-8")
        _, refs = external_images(text)
    except (UnicodeDecodeError, DockerfileError) as e:
        return TaskImageRefusal(reason=INVALID_TASK_OR_VERIFIER, detail=f"{name}: {e}")
    except Unresolvable as e:
        return TaskImageRefusal(reason=UNSUPPORTED_CONTRACT, detail=f"{name}: {e}")
    return text, list(dict.fromkeys(r.image for r in refs))


def pulled_bases(
    env: Path | None,
    docker_image: str | None,
    registry: str,
    backend,
    pins: Mapping[str, str],
) -> tuple[str, list[PulledBase]] | TaskImageRefusal:
    """(the Dockerfile's text, the image pulled through `registry` for each external image),
    or why not (a reference the registry does not have, a frozen digest it no longer has)."""
    found = (f"FROM {docker_image}\n", [docker_image]) if docker_image is not None else _dockerfile_refs(env)
    if isinstance(found, TaskImageRefusal):
        return found
    text, refs = found
    try:
        return text, [pull(ref, registry, backend, pins.get(ref)) for ref in refs]
    except PullRefused as e:
        return TaskImageRefusal(reason=e.reason, detail=e.detail)


def resolve_bases(env: Path, base_map: BaseImageMap) -> tuple[str, list[ResolvedBase]] | TaskImageRefusal:
    """(the Dockerfile's text, what serves each external image it names), or why not."""
    found = _dockerfile_refs(env)
    if isinstance(found, TaskImageRefusal):
        return found
    text, refs = found
    bases: list[ResolvedBase] = []
    for image in refs:
        served = base_map.resolve(image)
        if served is None:
            return TaskImageRefusal(
                reason=UNSUPPORTED_CONTRACT, detail=f"{image} is not available on this profile"
            )
        bases.append(served)
    return text, bases


def _build(
    env: Path | None,
    dockerfile: str,
    backend: ImageBackend,
    labels: dict[str, str],
    network: str,
    timeout_s: float,
    log_path: Path,
    bundle: bytes | None = None,
):
    """Build a copy of `env` (None: an empty context) with `dockerfile` as its Dockerfile,
    logging to `log_path`; `bundle`: the trust store the Dockerfile copies in."""
    with tempfile.TemporaryDirectory(prefix="task-context-") as tmp:
        context = Path(tmp) / "context"
        if env is None:
            context.mkdir()
        else:
            shutil.copytree(env, context, symlinks=True)
        put_dockerfile(context, dockerfile)
        if bundle is not None and env is not None:
            add_to_context(context, bundle)
        with open(log_path, "w", encoding="utf-8", errors="replace") as log:
            started = time.monotonic()
            run = backend.build(context, labels, network, timeout_s, log, BUILD_DOCKERFILE)
            log.write(
                f"\n# build {'failed' if run.error else 'done'} in {time.monotonic() - started:.1f} s\n"
            )
    return run


def put_dockerfile(context: Path, dockerfile: str) -> None:
    """`dockerfile` into `context` as `BUILD_DOCKERFILE`, and that name appended to the
    context's ``.dockerignore`` (made, excluding itself too, when the task has none), as
    docker's client does for a Dockerfile from elsewhere: the daemon reads it, then drops it
    from what ``COPY`` sees. A ``.dockerignore`` that is not a regular file (a link out of the
    task) is replaced, never followed."""
    (context / BUILD_DOCKERFILE).write_text(dockerfile, encoding="utf-8")
    ignore = context / ".dockerignore"
    if ignore.is_dir() and not ignore.is_symlink():
        shutil.rmtree(ignore)
    elif ignore.is_symlink() or (ignore.exists() and not ignore.is_file()):
        ignore.unlink()
    if ignore.is_file():
        ignore_also(context, BUILD_DOCKERFILE)
    else:
        ignore.write_text(f".dockerignore\n{BUILD_DOCKERFILE}\n", encoding="utf-8")


def _cached(slot: Path, key: str, backend: ImageBackend) -> TaskImage | None:
    """The stored image of `key`, if the backend still holds it with that key's label."""
    try:
        stored = TaskImage.model_validate_json((slot / "image.json").read_bytes())
    except (OSError, ValueError):
        return None
    if stored.key != key or (backend.image_labels(stored.image_id) or {}).get(KEY_LABEL) != key:
        return None
    return stored.model_copy(update={"cached": True})
