"""The base-image map: which upstream bases a profile serves, with what, and what differs.

Three records, all pydantic and all hashed canonically:

- `BaseRecipe`: how one local base is made from Debian packages (mmdebstrap variant, package
  list, dpkg path excludes, image config, the Python it serves) and what differs from the
  upstream image it stands in for. Its ``version`` is bumped whenever the recipe changes.
- `Substitution`: an upstream reference (exact, or a glob such as ``python:3.12-slim*``)
  served by a recipe, with its own versioned differences (``Python 3.11 served for 3.12``).
  A substitution is a patch to the task: it is recorded, never silent.
- `BaseImageMap`: the built map — per recipe the local image (the backend's image id and the
  layer digest, i.e. the sha256 of the reproducible tarball), and the substitutions. Its
  `resolve` answers "which local image serves ``FROM <ref>``, and with which recorded patch";
  a reference it cannot serve resolves to None (the task is then not runnable on this
  profile, never built from something else silently).

The default recipes and substitutions are `RECIPES` and `SUBSTITUTIONS`; a profile may pass
its own. `CORE` recipes are in every map; the others (Debian trixie's Python 3.13, the full
non-slim images with buildpack-deps' packages) are built only for a map whose tasks need one.
A reference is normalised before it is matched (`split_reference`): Docker Hub's hosts and
``library/`` dropped, a Docker Hub mirror's host dropped and recorded, a pinned digest
recorded as the one the served image is not.
"""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from environment.protocol import canonical_json, sha256_tag

#: dpkg path excludes of Debian's own slim images: no documentation, manuals or translations.
SLIM_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                 "/usr/share/groff/*", "/usr/share/lintian/*")
SLIM_INCLUDES = ("/usr/share/doc/*/copyright", "/usr/share/locale/locale.alias")
#: Debian's PEP 668 marker: excluded by dpkg (not deleted once), so an upgrade of
#: libpython3.11-stdlib inside a task's build cannot bring it back.
PEP668_MARKER = "/usr/lib/python3*/EXTERNALLY-MANAGED"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_DEBIAN_BUILD = ("the root filesystem is built here from Debian bookworm packages with mmdebstrap "
                 "(--variant=minbase), not pulled: package versions are the archive's when the base was "
                 "built (recorded in the map), not those of the upstream tag")
_APT_SOURCES = ("apt sources are one-line entries in /etc/apt/sources.list (bookworm, bookworm-updates, "
                "bookworm-security), not /etc/apt/sources.list.d/debian.sources")


class BaseRecipe(BaseModel):
    """How one local base image is made, and how it differs from what it replaces."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="the recipe's name, e.g. 'python-3.11-slim-bookworm'")
    version: int = Field(ge=1, description="bumped whenever anything below changes")
    suite: Literal["bookworm", "trixie"] = "bookworm"
    variant: Literal["minbase", "apt", "essential"] = "minbase"
    packages: tuple[str, ...] = Field(default=(), description="Debian packages added to the variant's")
    path_excludes: tuple[str, ...] = Field(default=(),
                                           description="dpkg path-exclude globs (kept in the image)")
    path_includes: tuple[str, ...] = Field(default=(),
                                           description="dpkg path-include globs (kept in the image)")
    env: dict[str, str] = Field(default_factory=dict, description="the image config's environment")
    cmd: tuple[str, ...] = Field(default=(), description="the image config's default command")
    python: str | None = Field(default=None, description="the Python minor version served, e.g. '3.11'")
    differences: tuple[str, ...] = Field(description="what differs from the upstream image, one line each")

    def digest(self) -> str:
        return sha256_tag(canonical_json(self.model_dump(mode="json")))


class Substitution(BaseModel):
    """An upstream reference (or glob of them) served by a recipe: a versioned, recorded patch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream: str = Field(
        description="a normalised reference ('python:3.11-slim') or an fnmatch glob of them"
    )
    recipe: str
    version: int = Field(ge=1, description="the substitution's own version (bumped with its differences)")
    differences: tuple[str, ...] = Field(default=(), description="what differs beyond the recipe's own lines")

    def matches(self, reference: str) -> bool:
        return fnmatch.fnmatchcase(reference, self.upstream)


DEBIAN_BOOKWORM_SLIM = BaseRecipe(
    name="debian-bookworm-slim", version=1, path_excludes=SLIM_EXCLUDES, path_includes=SLIM_INCLUDES,
    env={"PATH": DEFAULT_PATH}, cmd=("bash",),
    differences=(_DEBIAN_BUILD, _APT_SOURCES))

PYTHON_311_SLIM_BOOKWORM = BaseRecipe(
    name="python-3.11-slim-bookworm", version=1,
    packages=("ca-certificates", "netbase", "python3", "python3-pip", "python3-venv", "python-is-python3"),
    path_excludes=(*SLIM_EXCLUDES, PEP668_MARKER), path_includes=SLIM_INCLUDES,
    env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}, cmd=("python3",), python="3.11",
    differences=(
        _DEBIAN_BUILD, _APT_SOURCES,
        "Python is Debian's python3.11 in /usr/bin (3.11.2 with Debian's patches), not a CPython built "
        "from source in /usr/local; `python` comes from python-is-python3",
        "pip, setuptools and wheel are Debian's packages (python3-pip), not the versions upstream bundles",
        "Debian's PEP 668 EXTERNALLY-MANAGED marker is never installed (dpkg path-exclude), so pip installs "
        "into the system Python as in the upstream image",
        "the standard library is Debian's split: venv/ensurepip and distutils are installed (python3-venv); "
        "tkinter and the C headers (python3-dev) are not",
        "no PYTHON_VERSION, PYTHON_SHA256 or GPG_KEY in the environment",
    ))

_TRIXIE_BUILD = _DEBIAN_BUILD.replace("bookworm", "trixie (Debian 13)")
_TRIXIE_SOURCES = _APT_SOURCES.replace("bookworm", "trixie")
_PY_DEBIAN = ("Python is Debian's python{0} in /usr/bin (with Debian's patches), not a CPython built from "
              "source in /usr/local; `python` comes from python-is-python3")
_PY_COMMON = (
    "pip, setuptools and wheel are Debian's packages (python3-pip), not the versions upstream bundles",
    "Debian's PEP 668 EXTERNALLY-MANAGED marker is never installed (dpkg path-exclude), so pip installs "
    "into the system Python as in the upstream image",
    "no PYTHON_VERSION, PYTHON_SHA256 or GPG_KEY in the environment")
_PY_SLIM = ("the standard library is Debian's split: venv/ensurepip and distutils are installed "
            "(python3-venv); tkinter and the C headers (python3-dev) are not")
_PY_FULL = ("the standard library is Debian's split: venv/ensurepip (python3-venv) and the C headers "
            "(python3-dev) are installed; tkinter is not")
#: buildpack-deps' packages (what the full python:3.X-<suite> images are built on), Debian's
#: names; ImageMagick and its headers are left out (hundreds of MB of X11 for a few tasks).
BUILDPACK_DEPS = (
    "ca-certificates", "curl", "gnupg", "dirmngr", "netbase", "wget", "git", "mercurial", "openssh-client",
    "subversion", "procps", "autoconf", "automake", "bzip2", "default-libmysqlclient-dev", "dpkg-dev", "file",
    "g++", "gcc", "libbz2-dev", "libc6-dev", "libcurl4-openssl-dev", "libdb-dev", "libevent-dev",
    "libffi-dev", "libgdbm-dev", "libglib2.0-dev", "libgmp-dev", "libjpeg-dev", "libkrb5-dev", "liblzma-dev",
    "libmaxminddb-dev", "libncurses-dev", "libpng-dev", "libpq-dev", "libreadline-dev", "libsqlite3-dev",
    "libssl-dev", "libtool", "libwebp-dev", "libxml2-dev", "libxslt1-dev", "libyaml-dev", "make", "patch",
    "unzip", "xz-utils", "zlib1g-dev")
_FULL = ("buildpack-deps' packages are installed from Debian (compilers, version control, the common -dev "
         "libraries) except ImageMagick and its headers; documentation and manuals are kept, as upstream")
_PY_PACKAGES = ("ca-certificates", "netbase", "python3", "python3-pip", "python3-venv", "python-is-python3")

DEBIAN_TRIXIE_SLIM = BaseRecipe(
    name="debian-trixie-slim", version=1, suite="trixie", path_excludes=SLIM_EXCLUDES,
    path_includes=SLIM_INCLUDES, env={"PATH": DEFAULT_PATH}, cmd=("bash",),
    differences=(_TRIXIE_BUILD, _TRIXIE_SOURCES))

PYTHON_313_SLIM_TRIXIE = BaseRecipe(
    name="python-3.13-slim-trixie", version=1, suite="trixie", packages=_PY_PACKAGES,
    path_excludes=(*SLIM_EXCLUDES, PEP668_MARKER), path_includes=SLIM_INCLUDES,
    env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}, cmd=("python3",), python="3.13",
    differences=(_TRIXIE_BUILD, _TRIXIE_SOURCES, _PY_DEBIAN.format("3.13"), *_PY_COMMON, _PY_SLIM))

PYTHON_311_BOOKWORM = BaseRecipe(
    name="python-3.11-bookworm", version=1, packages=(*BUILDPACK_DEPS, *_PY_PACKAGES, "python3-dev"),
    path_excludes=(PEP668_MARKER,), env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}, cmd=("python3",),
    python="3.11", differences=(_DEBIAN_BUILD, _APT_SOURCES, _FULL, _PY_DEBIAN.format("3.11"), *_PY_COMMON,
                                _PY_FULL))

PYTHON_313_TRIXIE = BaseRecipe(
    name="python-3.13-trixie", version=1, suite="trixie",
    packages=(*BUILDPACK_DEPS, *_PY_PACKAGES, "python3-dev"), path_excludes=(PEP668_MARKER,),
    env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}, cmd=("python3",), python="3.13",
    differences=(_TRIXIE_BUILD, _TRIXIE_SOURCES, _FULL, _PY_DEBIAN.format("3.13"), *_PY_COMMON, _PY_FULL))

#: Built for every map: what most tasks name, cheap to build.
CORE: tuple[BaseRecipe, ...] = (DEBIAN_BOOKWORM_SLIM, PYTHON_311_SLIM_BOOKWORM)
#: Built only when a selected task needs one (`validate.taskdir.images.bases.needed_recipes`).
RECIPES: tuple[BaseRecipe, ...] = (*CORE, DEBIAN_TRIXIE_SLIM, PYTHON_313_SLIM_TRIXIE, PYTHON_311_BOOKWORM,
                                   PYTHON_313_TRIXIE)

_NEWER = "Python 3.11 is served where the task asks for Python {0}: code needing {0} features fails"
_TRIXIE = "the upstream tag may now be Debian trixie-based; Debian bookworm is served"
_NOT_BOOKWORM = (
    "the tag asks for Debian bookworm; Debian trixie is served (Debian has no Python {0} for bookworm)"
)
SUBSTITUTIONS: tuple[Substitution, ...] = (
    Substitution(upstream="debian:bookworm-slim", recipe="debian-bookworm-slim", version=1),
    Substitution(upstream="debian:12-slim", recipe="debian-bookworm-slim", version=1),
    Substitution(upstream="debian:trixie-slim", recipe="debian-trixie-slim", version=1),
    Substitution(upstream="debian:13-slim", recipe="debian-trixie-slim", version=1),
    Substitution(upstream="python:3.11-slim-bookworm", recipe="python-3.11-slim-bookworm", version=1),
    Substitution(upstream="python:3.11-slim", recipe="python-3.11-slim-bookworm", version=1,
                 differences=(_TRIXIE,)),
    Substitution(upstream="python:3.12-slim*", recipe="python-3.11-slim-bookworm", version=1,
                 differences=(_NEWER.format("3.12"), _TRIXIE)),
    # version 2: Python 3.13 itself (Debian trixie's), where version 1 served 3.11
    Substitution(upstream="python:3.13-slim-bookworm", recipe="python-3.13-slim-trixie", version=2,
                 differences=(_NOT_BOOKWORM.format("3.13"),)),
    Substitution(upstream="python:3.13-slim*", recipe="python-3.13-slim-trixie", version=2),
    Substitution(upstream="python:3-slim*", recipe="python-3.11-slim-bookworm", version=1,
                 differences=(_NEWER.format("3 (the latest 3.x)"), _TRIXIE)),
    Substitution(upstream="python:3.11-bookworm", recipe="python-3.11-bookworm", version=1),
    Substitution(upstream="python:3.11", recipe="python-3.11-bookworm", version=1, differences=(_TRIXIE,)),
    Substitution(upstream="python:3.12-bookworm", recipe="python-3.11-bookworm", version=1,
                 differences=(_NEWER.format("3.12"),)),
    Substitution(upstream="python:3.12", recipe="python-3.11-bookworm", version=1,
                 differences=(_NEWER.format("3.12"), _TRIXIE)),
    Substitution(upstream="python:3.13-bookworm", recipe="python-3.13-trixie", version=1,
                 differences=(_NOT_BOOKWORM.format("3.13"),)),
    Substitution(upstream="python:3.13-trixie", recipe="python-3.13-trixie", version=1),
    Substitution(upstream="python:3.13", recipe="python-3.13-trixie", version=1),
)

#: Registries that serve Docker Hub's images under their own names: a reference through one
#: is the Docker Hub image it mirrors (the mirror is recorded with the substitution).
HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com")
HUB_MIRRORS = ("mirror.gcr.io", "public.ecr.aws/docker", "docker.m.daocloud.io", "dockerhub.timeweb.cloud",
               "registry.docker-cn.com", "hub.docker.mirror")


def _host(first: str) -> bool:
    return "." in first or ":" in first or first == "localhost"


def split_reference(ref: str) -> tuple[str, str | None, str | None]:
    """``(name:tag, pinned digest or None, mirror or None)``: the tag defaults to ``latest``; a
    Docker Hub host or ``library/`` prefix is dropped, and so is a Docker Hub mirror's host
    (`HUB_MIRRORS`, or any registry path ending ``library/<name>``), which is returned. A
    reference naming another registry keeps its host and is served only if a substitution
    names it so."""
    name, _, digest = ref.partition("@")
    mirror = None
    parts = name.split("/")
    if len(parts) > 1 and _host(parts[0]):
        host_path = next((m for m in HUB_MIRRORS if name.startswith(m + "/")), None)
        if parts[0] in HUB_HOSTS:
            parts = parts[1:]
        elif host_path is not None:
            mirror, parts = host_path, name[len(host_path) + 1:].split("/")
        elif "library" in parts[1:-1]:
            at = len(parts) - 1 - parts[::-1].index("library")
            mirror, parts = "/".join(parts[:at]), parts[at:]
        name = "/".join(parts)
    if name.startswith("library/"):
        name = name[len("library/"):]
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name, digest or None, mirror


def normalize_reference(ref: str) -> tuple[str, str | None]:
    """``(name:tag, pinned digest or None)`` (`split_reference` without the mirror)."""
    name, digest, _ = split_reference(ref)
    return name, digest


class BaseImage(BaseModel):
    """A recipe built and imported: the local image that serves its substitutions."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recipe: BaseRecipe
    recipe_digest: str
    backend: str = Field(description="the backend that imported it (the image id is that backend's)")
    image_id: str = Field(description="the backend's id of the image, e.g. docker's 'sha256:<config digest>'")
    layer: str = Field(description="'sha256:<hex>' of the reproducible tarball: the image's one layer")
    tree_digest: str = Field(description="digest of the tree the tarball holds "
                                         "(`validate.sandbox.image.tree_digest`)")
    python: str | None = Field(description="the image's Python version, e.g. '3.11.2'; None without one")
    packages: tuple[str, ...] = Field(description="the image's Debian packages, sorted 'name=version'")
    apt_sources: tuple[str, ...] = Field(description="the image's /etc/apt/sources.list lines")


class ResolvedBase(BaseModel):
    """One ``FROM`` reference of a task and what serves it: the patch recorded for the task."""

    model_config = ConfigDict(frozen=True)

    upstream: str = Field(description="the reference as the Dockerfile writes it")
    reference: str = Field(description="normalised: 'name:tag'")
    pinned: str | None = Field(default=None, description="the digest the reference pins, which the served "
                                                         "image is not (the unmatched digest, recorded)")
    mirror: str | None = Field(default=None, description="the Docker Hub mirror the reference names, dropped")
    substitution: Substitution
    recipe: str
    recipe_version: int
    image_id: str
    layer: str
    differences: tuple[str, ...] = Field(description="the recipe's and the substitution's "
                                                     "lines, in that order")

    def key(self) -> dict[str, object]:
        """What of this resolution a task image's cache key covers."""
        return {"upstream": self.upstream, "image_id": self.image_id, "layer": self.layer,
                "recipe": self.recipe, "recipe_version": self.recipe_version,
                "substitution": self.substitution.upstream, "substitution_version": self.substitution.version}


class BaseImageMap(BaseModel):
    """Upstream references → local images, as a profile declares (and a manifest freezes) it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    bases: dict[str, BaseImage] = Field(description="recipe name → the built base (the core recipes and "
                                                    "those the selected tasks need)")
    substitutions: tuple[Substitution, ...] = Field(description="tried in order; the first "
                                                                "that matches serves")

    @model_validator(mode="after")
    def _recipes_exist(self):
        for name, base in self.bases.items():
            if base.recipe.name != name:
                raise ValueError(f"bases[{name!r}] holds recipe {base.recipe.name!r}")
        # A substitution may name a recipe this map did not build (recipes beyond `CORE` are
        # built only for the tasks that need one): it then serves nothing here.
        return self

    def digest(self) -> str:
        return sha256_tag(canonical_json(self.model_dump(mode="json")))

    def resolve(self, ref: str) -> ResolvedBase | None:
        """What serves ``FROM ref`` here, or None when this profile cannot serve it."""
        reference, pinned, mirror = split_reference(ref)
        sub = next((s for s in self.substitutions if s.matches(reference)), None)
        if sub is None or sub.recipe not in self.bases:
            return None
        base = self.bases[sub.recipe]
        extra = (f"the Dockerfile pins the upstream image {pinned}; this profile cannot serve that digest, "
                 f"it serves {sub.recipe} by the tag",) if pinned else ()
        via = (f"the reference goes through the registry mirror {mirror}; Docker Hub's {reference} is what "
               "is substituted",) if mirror else ()
        return ResolvedBase(upstream=ref, reference=reference, substitution=sub, recipe=sub.recipe,
                            recipe_version=base.recipe.version, image_id=base.image_id, layer=base.layer,
                            differences=(*base.recipe.differences, *sub.differences, *extra, *via),
                            pinned=pinned, mirror=mirror)

    def recipe_for(self, ref: str) -> str | None:
        """The recipe the first matching substitution names (built here or not)."""
        reference = split_reference(ref)[0]
        return next((s.recipe for s in self.substitutions if s.matches(reference)), None)
