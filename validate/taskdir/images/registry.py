"""Task images' bases from a registry (a profile option, ``--registry HOST[:PORT]``).

Where the build host may use a registry or mirror, a task's ``FROM`` and its
``[environment].docker_image`` are not substituted from the offline base-image map: they
are pulled by reference through the registry, and the digest each resolved to is frozen
(`PulledBase`; in the contract, each upstream reference → ``<registry>/<path>@<digest>``).
Every later build (a run, ``validate verify``) pulls by that digest, never by the tag: a
tag that has moved since is named (`moved_tags`), never followed; a digest the registry no
longer has is ``unsupported_execution_contract``, naming it.

A reference is found in the registry under a mirror's path (`mirror_path`): a Docker Hub
official image ``python:3.11-slim`` as ``<registry>/library/python:3.11-slim``, a Docker Hub
user's ``org/img`` as ``<registry>/org/img``, and an image of another registry
``ghcr.io/org/img:tag`` as ``<registry>/ghcr.io/org/img:tag`` (the host kept as the path's
first segment, as pull-through mirrors of several registries lay them out). A reference
through a Docker Hub mirror is normalised first (`validate.taskdir.images.basemap.split_reference`).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from validate.core.errors import ServiceError
from validate.core.records import UNSUPPORTED_CONTRACT
from validate.taskdir.images.basemap import split_reference


class PulledBase(BaseModel):
    """One external reference of a task and the image pulled for it through the registry."""

    model_config = ConfigDict(frozen=True)

    upstream: str = Field(description="the reference as the task writes it")
    reference: str = Field(description="normalised: 'name:tag'")
    pulled: str = Field(description="what was pulled: '<registry>/<path>@<digest>'")
    digest: str = Field(description="the manifest digest the reference resolved to (frozen)")
    image_id: str
    recipe: str = Field(default="", description="none: pulled, not built from a recipe")
    differences: tuple[str, ...] = ()

    def key(self) -> dict[str, object]:
        return {"upstream": self.upstream, "pulled": self.pulled, "image_id": self.image_id}


class PullRefused(ServiceError):
    """A reference the registry cannot give: the reason and one line naming it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def mirror_path(ref: str, registry: str) -> tuple[str, str, str | None]:
    """(the repository in the registry, the tag, the digest the reference pins or None)."""
    name, digest, _ = split_reference(ref)
    repo, _, tag = name.rpartition(":")
    first = repo.split("/")[0]
    if "/" in repo and ("." in first or ":" in first or first == "localhost"):
        path = repo  # another registry's image: its host kept as the first segment
    elif "/" not in repo:
        path = f"library/{repo}"
    else:
        path = repo
    return f"{registry.rstrip('/')}/{path}", tag, digest


def pull(ref: str, registry: str, backend, pinned: str | None = None) -> PulledBase:
    """The image for `ref` through `registry`: by `pinned` (the frozen
    ``<registry>/<path>@<digest>``) when given, else by the digest the reference pins, else by
    its tag (whose digest is then recorded); `PullRefused` when the registry cannot give it."""
    repo, tag, digest = mirror_path(ref, registry)
    if pinned is not None:
        repo, _, digest = pinned.rpartition("@")
    want = digest or tag
    # A digest is asked of the registry itself first: the daemon may answer a pull by digest
    # from manifests it cached, so a digest the registry no longer serves would still "pull".
    if digest is not None and backend.remote_digest(f"{repo}@{digest}") is None:
        raise PullRefused(UNSUPPORTED_CONTRACT, f"{ref}: the digest {digest} no longer resolves in "
                                                f"{registry} (it does not serve {repo}@{digest})")
    try:
        image_id = backend.pull(repo, want)
    except LookupError as e:
        if digest is not None:
            raise PullRefused(UNSUPPORTED_CONTRACT, f"{ref}: the digest {digest} no longer resolves in "
                                                    f"{registry} ({repo}@{digest}: {e})") from None
        raise PullRefused(UNSUPPORTED_CONTRACT,
                          f"{ref} is not in the registry {registry} (as {repo}:{tag}: {e})") \
            from None
    resolved = digest or backend.repo_digest(image_id, repo)
    if resolved is None:
        raise PullRefused(UNSUPPORTED_CONTRACT, f"{ref}: {registry} gave {repo}:{tag} without a digest")
    said = (f"pulled from {registry} as {repo}@{resolved}; the tag {tag} is never followed again",)
    return PulledBase(upstream=ref, reference=split_reference(ref)[0], pulled=f"{repo}@{resolved}",
                      digest=resolved, image_id=image_id, differences=said)


def moved_tags(pins: Mapping[str, str], registry: str, backend) -> list[str]:
    """For each frozen pin (upstream → pulled@digest) whose tag now resolves to another
    digest: one line naming it (the frozen digest is what is pulled)."""
    out = []
    for upstream, pinned in sorted(pins.items()):
        repo, tag, digest = mirror_path(upstream, registry)
        if digest is not None:
            continue  # the task itself pins a digest: there is no tag to move
        now = backend.remote_digest(f"{repo}:{tag}")
        frozen = pinned.rpartition("@")[2]
        if now is not None and now != frozen:
            out.append(f"{upstream}: the tag {repo}:{tag} has moved to {now}; the contract's {frozen} is "
                       "pulled, never the moved tag")
        elif now is None:
            out.append(f"{upstream}: the tag {repo}:{tag} no longer resolves in {registry}; the contract's "
                       f"{frozen} is pulled by its digest")
    return out
