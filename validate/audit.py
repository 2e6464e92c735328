"""Re-check a run directory without rerunning anything (`validate audit RUN_DIR`).

1. Every file is listed in ``checksums`` and matches it; no file is missing or extra.
2. Every Parquet file reads back and has exactly the columns its model derives.
3. The manifest hash chain holds: each manifest's sha256 matches its content; the frozen
   child, the pilot variants and the smoke sample point at their parent by hash; the frozen
   set is a subset of the pool with the same task hashes, and every frozen task had an
   oracle pass.
4. The ledgers agree with each other and with the report: one verdict per task, one
   exclusion per excluded task with the same reason, every attempt's task hash is in a
   manifest, and ``report.json`` equals the counts recomputed from the ledgers.

Any failure names the file it concerns.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from validate.contract import load_manifest
from validate.errors import ContractError, EvidenceError
from validate.evidence import file_sha256
from validate.paths import RunPaths
from validate.records import Attempt, Exclusion, TaskVerdict, arrow_schema


def _checksums(root: Path, problems: list[str]) -> None:
    paths = RunPaths(root)
    if not paths.checksums.exists():
        problems.append(f"{paths.checksums}: missing")
        return
    listed: dict[str, str] = {}
    for lineno, line in enumerate(paths.checksums.read_text().splitlines(), 1):
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name:
            problems.append(f"{paths.checksums} line {lineno}: malformed")
            continue
        listed[name] = digest
    present = {p.relative_to(root).as_posix() for p in root.rglob("*")
               if p.is_file() and p != paths.checksums and not p.name.startswith(".")}
    for name in sorted(set(listed) - present):
        problems.append(f"{root / name}: listed in checksums but missing")
    for name in sorted(present - set(listed)):
        problems.append(f"{root / name}: present but not listed in checksums")
    for name in sorted(set(listed) & present):
        if file_sha256(root / name) != listed[name]:
            problems.append(f"{root / name}: sha256 does not match checksums (changed after the run)")


def _tables(root: Path, metric_names: tuple[str, ...], problems: list[str]) -> dict:
    paths = RunPaths(root)
    tables = {}
    for path, model, metrics in ((paths.attempts, Attempt, metric_names), (paths.tasks, TaskVerdict, ()),
                                 (paths.exclusions, Exclusion, ())):
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - any read failure is the finding
            problems.append(f"{path}: unreadable Parquet ({type(e).__name__}: {e})")
            continue
        expected = arrow_schema(model, metrics).names
        if table.schema.names != expected:
            problems.append(f"{path}: columns {table.schema.names} differ from the {model.__name__} model's")
        tables[path.name] = table.to_pandas()
    return tables


def _manifests(root: Path, problems: list[str]):
    def load(path: Path):
        try:
            return load_manifest(path)
        except ContractError as e:
            problems.append(str(e))
            return None

    pool = load(root / "manifest.json")
    children = {p.name: load(p) for p in sorted(root.glob("*.manifest.json"))}
    for extra in ("frozen-manifest.json", "smoke/manifest.json"):
        if (root / extra).exists():
            children[extra] = load(root / extra)
    if pool is None:
        return None, children
    pool_hashes = {t.id: t.hash for t in pool.tasks}
    frozen = children.get("frozen-manifest.json")
    for name, child in children.items():
        if child is None:
            continue
        parent = frozen if name == "smoke/manifest.json" else pool
        if parent is not None and child.parent_sha256 != parent.sha256:
            problems.append(f"{root / name}: parent_sha256 {child.parent_sha256} is not its parent's sha256 {parent.sha256}")
    if frozen is not None:
        for t in frozen.tasks:
            if pool_hashes.get(t.id) != t.hash:
                problems.append(f"{root / 'frozen-manifest.json'}: task {t.id} is not in the pool with that hash")
    return pool, children


def audit(root: Path) -> list[str]:
    """Every problem found, each naming its file; an empty list means the run checks out."""
    root = Path(root)
    problems: list[str] = []
    if not (root / "manifest.json").exists():
        return [f"{root}: not a run directory (no manifest.json)"]
    _checksums(root, problems)
    pool, children = _manifests(root, problems)
    try:
        summary = json.loads((root / "run.json").read_text())
    except (OSError, ValueError) as e:
        problems.append(f"{root / 'run.json'}: not readable JSON ({e})")
        summary = {}
    if pool is not None and summary.get("manifest_sha256") not in (pool.sha256, *(c.sha256 for c in children.values() if c)):
        problems.append(f"{root / 'run.json'}: manifest_sha256 names no manifest of this run")
    try:
        columns = pq.read_schema(root / "attempts.parquet").names
    except Exception:  # noqa: BLE001 - reported by _tables below
        columns = []
    metric_names = tuple(c.removeprefix("metric_") for c in columns if c.startswith("metric_"))
    tables = _tables(root, metric_names, problems)
    if len(tables) < 3 or pool is None:
        return problems
    attempts, tasks, exclusions = tables["attempts.parquet"], tables["tasks.parquet"], tables["exclusions.parquet"]
    known = {(t.id, t.hash) for m in (pool, *children.values()) if m for t in m.tasks}
    stray = {(r.task_id, r.task_hash) for r in attempts.itertuples()} - known
    if stray:
        problems.append(f"{root / 'attempts.parquet'}: {len(stray)} attempt task hash(es) are in no manifest, "
                        f"e.g. {sorted(stray)[0]}")
    if tasks.duplicated(["phase", "task_id"]).any():
        problems.append(f"{root / 'tasks.parquet'}: a task has more than one verdict")
    excluded = tasks[~tasks["compatible"]].set_index(["phase", "task_id"])["reason"].to_dict()
    ledger = exclusions.set_index(["phase", "task_id"])["reason"].to_dict()
    if excluded != ledger:
        problems.append(f"{root / 'exclusions.parquet'}: does not list exactly the excluded tasks with their reasons")
    frozen = children.get("frozen-manifest.json")
    if frozen is not None:
        final = attempts[(attempts["phase"] == "oracle") & ~attempts["superseded"]]
        passed = set(final.loc[final["as_expected"], "idx"])
        if not set(frozen.selection.idx) <= passed:
            problems.append(f"{root / 'frozen-manifest.json'}: freezes tasks whose oracle did not pass")
    if (root / "report.json").exists():
        from validate.report import counts, load_run

        try:
            if json.loads((root / "report.json").read_text()) != json.loads(json.dumps(counts(load_run(root)))):
                problems.append(f"{root / 'report.json'}: the report's counts differ from the ledgers'")
        except (EvidenceError, ValueError, OSError) as e:
            problems.append(f"cannot recompute the report's counts: {e}")
        md = (root / "report.md").read_text() if (root / "report.md").exists() else ""
        if f"{int(tasks['compatible'].sum())}/{len(tasks)}" not in md:
            problems.append(f"{root / 'report.md'}: does not state the ledgers' compatible count")
    return problems
