"""Freezing an eval contract: only on a dataset that passed, re-checked at the moment of freezing.

`parent_of` reads a pool run directory and refuses unless (1) the run froze a set, (2) its
current dataset verdict (`validate.report.current_verdict`, the latest smoke test counted)
is PASS, (3) `validate audit` of the run finds no problem, and (4) a dataset manifest given
beside it is that run's frozen set, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

from validate.contract import Manifest, load_manifest
from validate.errors import ContractError
from validate.eval.contract import DatasetParent
from validate.evidence import file_sha256
from validate.paths import RunPaths


def parent_of(pool_run: Path, manifest: Path | None = None,
              data: tuple[Path, ...] = ()) -> tuple[DatasetParent, Manifest]:
    """The parent record of an eval on `pool_run`'s frozen set, and that frozen manifest."""
    from validate.audit import audit
    from validate.errors import EvidenceError
    from validate.report import current_verdict, load_run

    paths = RunPaths(Path(pool_run))
    if not paths.frozen_manifest.is_file():
        raise ContractError(f"--pool-run: {paths.root} froze no set (no frozen-manifest.json); an eval runs on a "
                            f"pool's frozen set")
    try:
        ev = load_run(paths.root)
    except EvidenceError as e:
        raise ContractError(f"--pool-run: {e}") from None
    verdict = current_verdict(ev.summary, ev.smokes)
    if verdict.verdict != "PASS":
        raise ContractError(f"--pool-run: {paths.root}: the dataset verdict is {verdict.verdict}, not PASS "
                            f"({verdict.headline}); an eval runs only on a dataset that passed")
    result = audit(paths.root, data=data)
    if result.problems:
        shown = "; ".join(result.problems[:3]) + (" …" if len(result.problems) > 3 else "")
        raise ContractError(f"--pool-run: `validate audit {paths.root}` failed: {shown}")
    frozen = load_manifest(paths.frozen_manifest)
    if manifest is not None and Path(manifest).read_bytes() != paths.frozen_manifest.read_bytes():
        given = load_manifest(manifest)
        raise ContractError(f"--manifest: {manifest} ({given.sha256}) is not the frozen set of {paths.root} "
                            f"({frozen.sha256})")
    parent = DatasetParent(
        manifest_name=frozen.name, manifest_sha256=frozen.sha256,
        manifest_path=str(manifest if manifest is not None else paths.frozen_manifest),
        pool_run_id=ev.summary.run_id, pool_run_dir=str(paths.root), pool_manifest_sha256=ev.summary.manifest_sha256,
        pool_checksums_sha256="sha256:" + file_sha256(paths.checksums), dataset_verdict="PASS",
        environment=frozen.environment.name, task_count=len(frozen.tasks))
    return parent, frozen


def dataset_manifest(parent: DatasetParent, given: Path | None) -> Manifest:
    """The dataset manifest an eval contract names: `given`, else the path recorded at freeze;
    refused unless its sha256 is the parent's."""
    where = Path(given) if given is not None else Path(parent.manifest_path)
    m = load_manifest(where)
    if m.sha256 != parent.manifest_sha256:
        raise ContractError(f"--manifest: {where} has sha256 {m.sha256}, but the eval contract's parent is "
                            f"{parent.manifest_sha256} ({parent.manifest_name})")
    return m
