"""Freezing an eval contract: only on a dataset that passed, re-checked at the moment of freezing.

`parent_of` reads a pool run directory through the run model (`validate.evidence.run`: its
sealed run.json and ledgers) and refuses unless (1) the run froze a set, (2) its current
dataset verdict (`validate.evidence.run.current_verdict`, the latest smoke test counted) is
PASS, (3) `validate audit` of the run finds no problem (the audit is handed in by the caller,
`validate.api.eval_freeze`: evaluation sits below the audit and never imports it), (4) the
run's contract names a negative control and every frozen task was tested by one (not frozen
out of it, and a final, exception-free control attempt on it in the evidence: the protocol's
"oracle pass AND control rejection", re-checked here rather than trusted to the verdict;
checked before (2) and (3), since a refusal needs no trust in the evidence and names its
cause), and (5) a dataset manifest given beside it is that run's frozen set, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from validate.contract.manifest import Manifest, load_manifest
from validate.core.errors import ContractError, EvidenceError
from validate.core.paths import FROZEN_MANIFEST, MANIFEST, RunPaths
from validate.core.records import AGENT_STATUSES, CONTROL
from validate.eval.contract import DatasetParent
from validate.evidence.journal import file_sha256
from validate.evidence.run import current_verdict, load_run

#: The audit of a pool run directory: the problems `validate audit` finds in it (none: it passes).
PoolAudit = Callable[[Path], Sequence[str]]


def parent_of(pool_run: Path, manifest: Path | None = None, *,
              audit: PoolAudit) -> tuple[DatasetParent, Manifest]:
    """The parent record of an eval on `pool_run`'s frozen set, and that frozen manifest.
    `audit` is called after the checks that read the run's evidence alone, so a run refused
    for a cause those show is refused without the cost of an audit."""
    paths = RunPaths(Path(pool_run))
    if not paths.frozen_manifest.is_file():
        raise ContractError(f"--pool-run: {paths.root} froze no set (no frozen-manifest.json); an eval runs "
                            "on a pool's frozen set")
    try:
        ev = load_run(paths.root)
    except EvidenceError as e:
        raise ContractError(f"--pool-run: {e}") from None
    for name, raw in ((MANIFEST, ev.manifest), (FROZEN_MANIFEST, ev.frozen)):
        if not _controls_of(raw):
            raise ContractError(f"--pool-run: {paths.root}: its {name} names no negative control; an eval "
                                "runs only on tasks a control was shown to reject (freeze a contract "
                                "with --controls)")
    frozen = load_manifest(paths.frozen_manifest)
    _every_task_tested(paths.root, frozen, ev.attempts)
    verdict = current_verdict(ev.summary, ev.smokes)
    if verdict.verdict != "PASS":
        raise ContractError(f"--pool-run: {paths.root}: the dataset verdict is {verdict.verdict}, not PASS "
                            f"({verdict.headline}); an eval runs only on a dataset that passed")
    problems = list(audit(paths.root))
    if problems:
        shown = "; ".join(problems[:3]) + (" …" if len(problems) > 3 else "")
        raise ContractError(f"--pool-run: `validate audit {paths.root}` failed: {shown}")
    if manifest is not None and Path(manifest).read_bytes() != paths.frozen_manifest.read_bytes():
        given = load_manifest(manifest)
        raise ContractError(f"--manifest: {manifest} ({given.sha256}) is not the frozen set of {paths.root} "
                            f"({frozen.sha256})")
    parent = DatasetParent(
        manifest_name=frozen.name, manifest_sha256=frozen.sha256,
        manifest_path=str(manifest if manifest is not None else paths.frozen_manifest),
        pool_run_id=ev.summary.run_id, pool_run_dir=str(paths.root),
        pool_manifest_sha256=ev.summary.manifest_sha256, pool_checksums_sha256="sha256:"
        + file_sha256(paths.checksums), dataset_verdict="PASS", environment=frozen.environment.name,
        task_count=len(frozen.tasks))
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


def _controls_of(raw: object) -> list[str]:
    """The control names of a manifest's raw JSON (any shape: it is read before validation)."""
    exp = raw.get("expectations") if isinstance(raw, dict) else None
    agents = exp.get("agents") if isinstance(exp, dict) else None
    if not isinstance(agents, dict):
        return []
    return sorted(n for n, a in agents.items() if isinstance(a, dict) and a.get("role") == CONTROL)


def _every_task_tested(root: Path, frozen: Manifest, attempts) -> None:
    """Refuse a frozen set with a task no control can test (the contract froze every control
    out of it) or none did (no final, exception-free control attempt on it in the pool)."""
    untestable = [t.id for t in frozen.tasks if not frozen.expectations.testing(t.skip)]
    if untestable:
        raise ContractError(f"--pool-run: {root}: no negative control can test {len(untestable)} frozen "
                            f"task(s) (every control is frozen out of them: {', '.join(untestable[:3])}"
                            f"{' …' if len(untestable) > 3 else ''}); an eval runs only on tested tasks")
    final = attempts[(attempts["role"] == CONTROL) & ~attempts["superseded"].astype(bool)
                     & attempts["status"].isin(AGENT_STATUSES)]
    untested = sorted({t.id for t in frozen.tasks} - set(final["task_id"]))
    if untested:
        raise ContractError(f"--pool-run: {root}: {len(untested)} frozen task(s) have no final, "
                            "exception-free control attempt "
                            f"({', '.join(untested[:3])}{' …' if len(untested) > 3 else ''}); an eval runs "
                            "only on tasks a control tested")
