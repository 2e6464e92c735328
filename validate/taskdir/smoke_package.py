"""The smoke test of a task-directory dataset reruns its sample from a package, not from the
dataset it was validated in (protocol step 5: package, then re-test the package).

`materialise_sample` writes the sampled tasks of the frozen set as a package
(`validate.taskdir.package`: byte-identical task directories and the ``package.json`` hash manifest)
in a fresh location, named ``package-<its revision's first 12 hex>``, and derives the sample
contract on it: the frozen contract's terms with the config's ``dataset`` and the revision
the package's, its tasks the package's (the same ids and hashes as in the frozen set, the
package's own indices). The rerun is given only the package (``--data``), so it runs in
the materialised copy and nothing else; the smoke entry keeps the package
(``smoke/<t>/package/``), so the audit loads it again (`package_search`) and holds the sample
contract to it (`same_package_terms`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from environment.harbor.taskdir import load_dataset
from environment.protocol import LoadHints
from validate.contract.manifest import Manifest, derive
from validate.core.errors import ValidateError
from validate.evidence.journal import atomic_write
from validate.taskdir.package import HASH_MANIFEST, hash_manifest, materialise

PACKAGE = "package"


def is_task_directories(taskset) -> bool:
    return hasattr(taskset, "task_dir")


def materialise_sample(ctx, frozen: Manifest, idx: list[int], where: Path) -> tuple[Manifest, Path]:
    """(the sample contract on a package of the tasks `idx` of `frozen`, the package's parent
    directory under `where`: what the rerun is given as ``--data``)."""
    ids = [ctx.taskset.task(i).id for i in idx]
    parent = where / PACKAGE
    parent.mkdir(parents=True)
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=parent))
    materialise(ctx.taskset, ids, {t.id: t.hash for t in frozen.tasks}, staging)
    atomic_write(staging / HASH_MANIFEST, hash_manifest(staging, {"contract_sha256": frozen.sha256}))
    config = ctx.env.Config.model_validate(frozen.environment.config)

    name = f"package-{load_dataset(staging).revision.removeprefix('sha256:')[:12]}"
    staging.rename(parent / name)
    # The package holds the tasks as validated: a dataset frozen with offline patches is
    # packaged patched, so the sample's contract reads the package with none.
    config = config.model_copy(update={"dataset": name,
                                       **({"patches": None} if "patches" in type(config).model_fields
                                                            else {})})
    taskset = ctx.env.load(config, LoadHints(search=(parent,)))
    by_id = {taskset.task(i).id: i for i in range(taskset.size)}
    if sorted(by_id) != sorted(ids):
        raise ValidateError(f"smoke: the package holds {sorted(by_id)}, not the sample {sorted(ids)}")
    child = derive(frozen, ctx.env, taskset, name=f"{frozen.name}.smoke", idx=[by_id[t] for t in ids],
                   rule=f"smoke: {len(ids)} evenly spaced tasks of {frozen.name}, from their package",
                   config=config)
    # The package is a directory of tasks however the dataset came (a published one's source
    # record is the frozen contract's, not the package's).
    child = child.model_copy(update={"environment": child.environment.model_copy(
        update={"revision": taskset.revision, "source": getattr(taskset, "source", None)})}).sealed()
    return child, parent


def package_search(entry: Path) -> tuple[Path, ...]:
    """Where a smoke entry's package is (for the audit to load the sample contract's tasks)."""
    return (entry / PACKAGE,) if (entry / PACKAGE).is_dir() else ()


def same_package_terms(where: Path, child: Manifest, parent: Manifest, r) -> None:
    """A package smoke's contract: the parent's terms but the dataset's location and revision,
    and its tasks the parent's, by id and hash (the package holds them byte for byte)."""
    def blank(m: Manifest):
        blanked = {k: "" for k in ("dataset", "patches") if k in m.environment.config}
        return m.environment.model_copy(update={"revision": "", "source": None,
                                                "config": {**m.environment.config, **blanked}})

    for field, mine, its in (("expectations", child.expectations, parent.expectations),
                             ("execution", child.execution, parent.execution),
                             ("salt", child.salt, parent.salt), ("environment", blank(child), blank(parent))):
        if mine != its:
            r.problems.append(f"{where}: its {field} is not its parent's (a derived contract keeps them)")
    theirs = {t.id: t.hash for t in parent.tasks}
    if any(theirs.get(t.id) != t.hash for t in child.tasks):
        r.problems.append(f"{where}: packages a task that is not in its parent with that hash")
