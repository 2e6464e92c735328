"""Audit, the contracts: every manifest of a run directory read and its sha256 checked, the
hash chain from each derived contract (frozen set, pilot variants, smoke samples) to its
parent, each derived contract holding its parent's terms, and the run's contract compared
with the project's committed ``manifests/<name>.json`` (its anchor).
"""

from __future__ import annotations

from pathlib import Path

from validate.contract.manifest import ContractError, Manifest, load_manifest
from validate.core.paths import FROZEN_MANIFEST, MANIFEST, SMOKE, VARIANTS, RunPaths
from validate.taskdir.smoke_package import package_search, same_package_terms


def read_manifests(paths: RunPaths, r) -> dict[str, Manifest]:
    found: dict[str, Manifest] = {}
    files = [paths.manifest, paths.frozen_manifest, *sorted(paths.variants.glob("*.json")),
             *sorted(paths.smoke.glob(f"*/{MANIFEST}"))]
    for p in files:
        if p.exists():
            try:
                found[p.relative_to(paths.root).as_posix()] = load_manifest(p)
            except ContractError as e:
                r.problems.append(str(e))
    root = found.get(MANIFEST)
    frozen = found.get(FROZEN_MANIFEST)
    for name, m in found.items():
        parent = None if name == MANIFEST else frozen if name.startswith(f"{SMOKE}/") else root
        if name != MANIFEST and (parent is None or m.parent_sha256 != parent.sha256):
            r.problems.append(f"{paths.root / name}: parent_sha256 {m.parent_sha256} is not "
                              "its parent's sha256")
        elif parent is not None and name != MANIFEST and package_search((paths.root / name).parent) \
                and name.startswith(f"{SMOKE}/"):  # a task-directory smoke, rerun from its package
            same_package_terms(paths.root / name, m, parent, r)
        elif parent is not None and name != MANIFEST:
            _same_terms(paths.root / name, m, parent, variant=name.startswith(f"{VARIANTS}/"), r=r)
    if frozen is not None and root is not None:
        pool = {t.id: t.hash for t in root.tasks}
        if any(pool.get(t.id) != t.hash for t in frozen.tasks):
            r.problems.append(f"{paths.frozen_manifest}: freezes a task that is not in the "
                              "pool with that hash")
    r.checked.append(f"{len(found)} manifests and their hash chain")
    return found


def _same_terms(where: Path, child: Manifest, parent: Manifest, variant: bool, r) -> None:
    """A child contract (`validate.contract.manifest.derive`) keeps its parent's expectations, execution
    profile and salt, and its environment (a pilot variant: all but the config)."""
    env, theirs = child.environment, parent.environment
    if variant:
        env, theirs = env.model_copy(update={"config": {}}), theirs.model_copy(update={"config": {}})
    for field, mine, its in (("expectations", child.expectations, parent.expectations),
                             ("execution", child.execution, parent.execution),
                             ("salt", child.salt, parent.salt), ("environment", env, theirs)):
        if mine != its:
            r.problems.append(f"{where}: its {field} is not its parent's (a derived contract keeps them)")


def committed_manifests(root: Path) -> Path | None:
    """The project's ``manifests/`` directory: the nearest one above the run directory."""
    for parent in Path(root).resolve().parents:
        if (parent / "manifests").is_dir():
            return parent / "manifests"
    return None


def check_anchor(paths: RunPaths, found: dict, directory: Path | None, r,
                 names: tuple[str, ...] = (MANIFEST,), loader=load_manifest) -> int:
    """Each contract equals the committed ``<directory>/<its name>.json`` when that exists;
    one that has none is named as sealed only (its limits and ceilings are the run's word).
    Returns how many were compared. A run's derived contracts (the frozen set, the variants)
    are held to manifest.json instead (`_same_terms`): a pool run again rewrites the
    committed ``<name>.frozen.json``, which must not fail the earlier pool."""
    anchored = 0
    for rel in names:
        m = found.get(rel)
        if m is None:
            continue
        committed = None if directory is None else Path(directory) / f"{m.name}.json"
        if committed is None or not committed.is_file():
            r.sealed_only.append(f"{rel}: no committed {committed or 'manifests/' + m.name + '.json'} to "
                                 "compare with (its limits, ceilings and thresholds are bound "
                                 "by the seal only)")
            continue
        try:
            theirs = loader(committed)
        except ContractError as e:
            r.problems.append(str(e))
            continue
        if theirs.sha256 != m.sha256:
            r.problems.append(f"{paths.root / rel}: is not the committed {committed} (sha256 {m.sha256}, "
                              f"committed {theirs.sha256})")
        anchored += 1
    return anchored
