"""Building a profile's bases: one reproducible root filesystem tarball per `BaseRecipe`,
made on the host with ``mmdebstrap`` exactly as `validate.sandbox.image` makes the sandbox image
(``SOURCE_DATE_EPOCH`` clamps every mtime; the tar is name-sorted with numeric owners),
then imported by a backend, and the `BaseImageMap` made of them.

The store holds, per recipe, ``<store>/<recipe name>/rootfs.tar`` and ``base.json`` (a
`BaseTarball`); a tarball whose record names this recipe's digest is reused, so a second
`build_base_map` runs no mmdebstrap. What the record says of the image (packages, Python,
apt sources, the absence of the PEP 668 marker) is read from the tarball itself.

The build host reaches the Debian archive over HTTP (mmdebstrap's default mirrors for a
stable suite: the release, its updates and security); those sources stay in the image, so
``apt-get`` works inside a task's build when the build's network allows it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from environment.protocol import canonical_json, sha256_tag
from validate.core.errors import ProfileUnavailable
from validate.evidence.journal import atomic_write
from validate.sandbox.image import (
    DPKG_STATUS,
    SOURCE_DATE_EPOCH,
    member_path,
    parse_dpkg_status,
    python_version,
    tarball_digests,
)
from validate.taskdir.images.backend import ImageBackend
from validate.taskdir.images.basemap import (
    CORE,
    RECIPES,
    SUBSTITUTIONS,
    BaseImage,
    BaseImageMap,
    BaseRecipe,
    Substitution,
    split_reference,
)

SOURCES_LIST = "etc/apt/sources.list"
#: Debian's own images are merged-/usr with usr-is-merged; without this hook mmdebstrap's
#: minbase takes usrmerge, which brings all of perl.
HOOK_DIRS = ("/usr/share/mmdebstrap/hooks/merged-usr",)
#: Run in the finished tree: nothing of the build host may stay in the image; apt fetches no
#: translations (as Docker's own Debian images configure it).
CUSTOMIZE_HOOKS = (
    "printf 'localhost\\n' > \"$1/etc/hostname\" && chmod 0644 \"$1/etc/hostname\"",
    "rm -f \"$1/etc/resolv.conf\"",
    "printf 'Acquire::Languages \"none\";\\n' > \"$1/etc/apt/apt.conf.d/docker-no-languages\"",
)


class BaseTarball(BaseModel):
    """What the store records of one recipe's tarball (``base.json``)."""

    model_config = ConfigDict(frozen=True)

    recipe_digest: str = Field(description="the recipe (and these hooks) it was built from")
    layer: str = Field(description="'sha256:<hex>' of rootfs.tar")
    tree_digest: str
    python: str | None
    packages: tuple[str, ...]
    apt_sources: tuple[str, ...]


def recipe_build_digest(recipe: BaseRecipe) -> str:
    """The recipe's digest with this module's hooks and epoch: either changing rebuilds."""
    return sha256_tag(canonical_json([recipe.digest(), list(HOOK_DIRS), list(CUSTOMIZE_HOOKS),
                                     SOURCE_DATE_EPOCH]))


def mmdebstrap_argv(recipe: BaseRecipe, target: Path) -> list[str]:
    argv = ["mmdebstrap", f"--variant={recipe.variant}", "--quiet"]
    if recipe.packages:
        argv.append("--include=" + ",".join(recipe.packages))
    argv += [f"--dpkgopt=path-exclude={p}" for p in recipe.path_excludes]
    argv += [f"--dpkgopt=path-include={p}" for p in recipe.path_includes]
    argv += [f"--hook-dir={d}" for d in HOOK_DIRS]
    argv += [f"--customize-hook={hook}" for hook in CUSTOMIZE_HOOKS]
    return [*argv, recipe.suite, str(target)]


def build_tarball(recipe: BaseRecipe, store: Path, log=print) -> tuple[Path, BaseTarball]:
    """``<store>/<recipe>/rootfs.tar`` and its record, built unless the record is this recipe's."""
    root = store / recipe.name
    tarball, record_path = root / "rootfs.tar", root / "base.json"
    want = recipe_build_digest(recipe)
    try:
        record = BaseTarball.model_validate_json(record_path.read_bytes())
        if tarball.is_file() and record.recipe_digest == want:
            log(f"base {recipe.name}: tarball present ({record.layer[:19]}…)")
            return tarball, record
    except (OSError, ValueError):
        pass
    if shutil.which("mmdebstrap") is None:
        raise ProfileUnavailable("base image build: mmdebstrap is not installed (apt-get install mmdebstrap)")
    missing = [d for d in HOOK_DIRS if not Path(d).is_dir()]
    if missing:
        raise ProfileUnavailable(f"base image build: this mmdebstrap has no {', '.join(missing)} "
                                 "(bookworm's has)")
    root.mkdir(parents=True, exist_ok=True)
    partial = root / "rootfs.partial.tar"  # mmdebstrap picks the format from the name: keep .tar last
    log(f"base {recipe.name}: building with mmdebstrap ({len(recipe.packages)} packages added: a "
        "minute or more) ...")
    proc = subprocess.run(mmdebstrap_argv(recipe, partial), capture_output=True, text=True,
                          env={**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)})
    if proc.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise ProfileUnavailable(f"base image build: mmdebstrap failed for {recipe.name} "
                                 f"(exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    os.replace(partial, tarball)  # before describing it: the digests it caches are then the final file's
    try:
        record = describe(tarball, recipe, want)
    except ProfileUnavailable:
        tarball.unlink(missing_ok=True)
        raise
    atomic_write(record_path, (record.model_dump_json(indent=1) + "\n").encode())
    log(f"base {recipe.name}: built {record.layer[:19]}… ({len(record.packages)} packages, python "
        f"{record.python})")
    return tarball, record


def describe(tarball: Path, recipe: BaseRecipe, recipe_digest: str) -> BaseTarball:
    """The record of a tarball, read from it; refuses one that breaks the recipe's promises
    (a Python base without its promised Python, pip, or with the PEP 668 marker)."""
    layer, tree = tarball_digests(tarball)
    status, sources, names = _read_members(tarball)
    packages = parse_dpkg_status(status)
    python = python_version(packages) if recipe.python else None
    if recipe.python:
        broken = []
        assert python is not None  # read above whenever the recipe promises a Python
        if not python.startswith(recipe.python + "."):
            broken.append(f"Python {python}, not {recipe.python}")
        if any(n.endswith("/EXTERNALLY-MANAGED") for n in names):
            broken.append("the PEP 668 EXTERNALLY-MANAGED marker is present")
        if not {"usr/bin/python", "usr/bin/pip"} <= names:
            broken.append("no /usr/bin/python or /usr/bin/pip")
        if broken:
            raise ProfileUnavailable(f"base image build: {recipe.name}: " + "; ".join(broken))
    lines = tuple(line.strip() for line in sources.splitlines() if line.strip() and not line.startswith("#"))
    return BaseTarball(recipe_digest=recipe_digest, layer=layer, tree_digest=tree, python=python,
                       packages=tuple(f"{n}={v}" for n, v in packages.items()), apt_sources=lines)


def _read_members(tarball: Path) -> tuple[str, str, set[str]]:
    """(dpkg status, apt sources.list, every member's path) in one pass."""
    status = sources = ""
    names: set[str] = set()
    with tarfile.open(tarball, mode="r|") as tar:
        for m in tar:
            path = member_path(m.name)
            names.add(path)
            if m.isreg() and path in (DPKG_STATUS, SOURCES_LIST):
                data = tar.extractfile(m)
                assert data is not None  # a regular member always has its data
                text = data.read().decode()
                status, sources = (text, sources) if path == DPKG_STATUS else (status, text)
    return status, sources, names


def task_refs(tasks) -> list[str]:
    """Every image reference the loaded Harbor tasks name: each ``FROM`` of their Dockerfiles and
    each ``[environment].docker_image`` (what their maps must serve)."""
    refs: list[str] = []
    for task in tasks:
        parsed = getattr(task, "parsed", None)
        if parsed is None:
            continue
        refs += parsed.base_images
        if parsed.environment == "image" and parsed.docker_image:
            refs.append(parsed.docker_image)
    return refs


def needed_recipes(refs, substitutions: tuple[Substitution, ...] = SUBSTITUTIONS) -> set[str]:
    """The recipes that serve `refs` (image references), by the first matching substitution."""
    out = set()
    for ref in refs:
        reference = split_reference(ref)[0]
        sub = next((s for s in substitutions if s.matches(reference)), None)
        if sub is not None:
            out.add(sub.recipe)
    return out


def build_base_map(backend: ImageBackend, store: Path, recipes: tuple[BaseRecipe, ...] = RECIPES,
                   substitutions: tuple[Substitution, ...] = SUBSTITUTIONS, log=print,
                   needed: Iterable[str] = ()) -> BaseImageMap:
    """Build (or reuse) the tarball of every `CORE` recipe and of each recipe `needed` names,
    import each through `backend`, and return the map (every substitution, serving only what
    was built); its JSON is also written to ``<store>/base-map.json``. The tarballs are built
    side by side (each mmdebstrap waits on the archive much of its time); imports one by one."""
    wanted = {r.name for r in CORE} | set(needed)
    recipes = tuple(r for r in recipes if r.name in wanted)
    with ThreadPoolExecutor(max_workers=max(1, len(recipes))) as pool:
        built = list(pool.map(lambda recipe: build_tarball(recipe, store, log), recipes))
    bases = {}
    for recipe, (tarball, record) in zip(recipes, built, strict=True):
        image_id = backend.import_base(tarball, recipe, record.layer)
        bases[recipe.name] = BaseImage(recipe=recipe, recipe_digest=record.recipe_digest,
                                       backend=backend.name, image_id=image_id, layer=record.layer,
                                       tree_digest=record.tree_digest, python=record.python,
                                       packages=record.packages, apt_sources=record.apt_sources)
    base_map = BaseImageMap(bases=bases, substitutions=substitutions)
    atomic_write(store / "base-map.json", (base_map.model_dump_json(indent=1) + "\n").encode())
    return base_map
