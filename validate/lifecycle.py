"""One run's lifecycle: open → journal → plays → finish, finished even when interrupted.

`Run` opens the run directory (the contract copied byte for byte, the patch stored when the
code has one), keeps the journal, plays each `Play`, and `finish` folds the journal into
Parquet, judges every task, decides the dataset verdict from the protocol's criteria, writes
``run.json`` and seals everything with ``checksums``. Every phase (`validate.phases`) is a
sequence of plays on one `Run`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from environment.protocol import LoadHints
from validate.contract import Manifest, load_manifest, verify
from validate.errors import EvidenceError, ValidateError
from validate.evidence import Journal, atomic_write, fold, open_run, write_checksums, write_json, write_verdicts
from validate.records import (
    COMPATIBLE, CONTROL, EXCEPTION_STATUSES, EXCLUDED, INCOMPLETE, PILOT, POOL, RUN, FindingRow, RunKind, TaskVerdict,
)
from validate.context import Play, RunContext
from validate.patches import code_state
from validate.paths import RunPaths
from validate.runner import execute
from validate.sandbox import open_sandbox
from validate.summary import Counts, JudgedGroup, ProbeCheck, RunSummary, Stratum, machine
from validate.verdicts import RunFacts, dataset_verdict

#: The protocol criteria each kind of run is held to (see `validate.verdicts.CRITERIA`).
REQUIRED: dict[RunKind, tuple[str, ...]] = {
    RUN: ("complete", "minimum", "one_reason", "patches", "dataset_findings", "chance_controls"),
    POOL: ("complete", "minimum", "one_reason", "patches", "dataset_findings", "chance_controls", "smoke"),
    PILOT: ("complete", "every_task_compatible", "probes", "one_reason", "patches", "dataset_findings",
              "chance_controls"),
}


def counts(verdicts: Sequence[TaskVerdict], attempts_path) -> Counts:
    table = pq.read_table(attempts_path, columns=["status", "superseded"])
    status = table.column("status")
    exceptions = pc.sum(pc.is_in(status, value_set=pa.array(EXCEPTION_STATUSES))).as_py() or 0
    by_reason: dict[str, int] = {}
    for v in verdicts:
        if v.reason is not None:
            by_reason[v.reason] = by_reason.get(v.reason, 0) + 1
    return Counts(tasks=len(verdicts), compatible=sum(v.verdict == COMPATIBLE for v in verdicts),
                  excluded=sum(v.verdict == EXCLUDED for v in verdicts),
                  incomplete=sum(v.verdict == INCOMPLETE for v in verdicts),
                  excluded_by_reason=dict(sorted(by_reason.items())), attempts=table.num_rows,
                  superseded=pc.sum(table.column("superseded")).as_py() or 0, exceptions=exceptions,
                  retried_passes=sum(v.verdict == COMPATIBLE and v.retried for v in verdicts))


def chance_means(attempts_path, rules) -> dict[str, tuple[float, float]]:
    """Each chance-level control's mean final reward (sample 0; no reward counts 0) and ceiling."""
    chance = {n: r.ceiling for n, r in rules.items() if r.role == CONTROL and r.scope == "mean"}
    if not chance:
        return {}
    t = pq.read_table(attempts_path, columns=["agent", "sample", "superseded", "reward"]).to_pylist()
    rewards: dict[str, list[float]] = {n: [] for n in chance}
    for row in t:
        if row["agent"] in chance and row["sample"] == 0 and not row["superseded"]:
            rewards[row["agent"]].append(row["reward"] or 0.0)
    return {n: (sum(r) / len(r), chance[n]) for n, r in sorted(rewards.items()) if r}


def run_facts(c: Counts, verdicts: Sequence[TaskVerdict], *, interrupted: bool, min_task_count: int, patch: str,
              dataset_findings: Sequence[FindingRow], probes: Sequence[ProbeCheck], smoke: str,
              chance: dict[str, tuple[float, float]], note: str = "") -> RunFacts:
    return RunFacts(tasks=c.tasks, compatible=c.compatible, excluded=c.excluded, incomplete=c.incomplete,
                    interrupted=interrupted, min_task_count=min_task_count,
                    excluded_without_one_reason=sum(v.verdict == EXCLUDED and v.reason is None for v in verdicts),
                    patch=patch, blocking_dataset_findings=[f.detail for f in dataset_findings if f.blocking],
                    probes_total=len(probes), probes_ok=sum(p.ok for p in probes), smoke=smoke, note=note,
                    chance_controls=chance)


def open_directory(ctx: RunContext) -> None:
    """Create the run directory with its contract, or check it when resuming: the same
    contract, and the same uncommitted patch (stored as ``patch.diff``) if there is one."""
    paths = ctx.paths
    open_run(paths, ctx.manifest.to_json())
    if ctx.code.diff:
        if paths.patch.exists() and paths.patch.read_bytes() != ctx.code.diff:
            raise EvidenceError(f"{paths.patch}: this run was started with another patch; resume it with the "
                                f"same code, or start a new run directory")
        atomic_write(paths.patch, ctx.code.diff)


class Run:
    """One run directory's lifecycle: opened (contract, patch), played into its journal, folded
    into Parquet and judged by `verdicts_of` (the phase's groups of attempts), finished with a
    sealed summary."""

    def __init__(self, ctx: RunContext, kind: RunKind, groups: list[JudgedGroup],
                 verdicts_of: Callable[[Journal], list[TaskVerdict]]) -> None:
        self.ctx, self.kind, self.groups, self.verdicts_of = ctx, kind, groups, verdicts_of
        open_directory(ctx)
        self.journal = Journal(ctx.paths, ctx.taskset.metric_names)

    def play(self, play: Play) -> None:
        execute(self.ctx, self.journal, play)

    def dataset_findings(self) -> list[FindingRow]:
        ctx = self.ctx
        tasks = (ctx.taskset.task(e.idx) for e in ctx.manifest.tasks)
        return [FindingRow(**f.model_dump()) for f in ctx.env.dataset_findings(ctx.taskset, tasks)]

    def fold(self) -> list[TaskVerdict]:
        """Fold the journal into Parquet and write the verdict tables; return the verdicts."""
        fold(self.journal)
        verdicts = self.verdicts_of(self.journal)
        write_verdicts(self.ctx.paths, verdicts)
        return verdicts

    def finish(self, verdicts: list[TaskVerdict], *, interrupted: bool, smoke: str = "not run", note: str = "",
               strata: Sequence[Stratum] = (), probes: Sequence[ProbeCheck] = (),
               frozen_sha256: str | None = None, variants: dict[str, str] | None = None) -> RunSummary:
        ctx = self.ctx
        c = counts(verdicts, ctx.paths.attempts)
        findings = self.dataset_findings()
        facts = run_facts(c, verdicts, interrupted=interrupted, min_task_count=ctx.manifest.min_task_count,
                          patch="documented" if ctx.code.diff else "none", dataset_findings=findings,
                          probes=probes, smoke=smoke, note=note,
                          chance=chance_means(ctx.paths.attempts, ctx.manifest.expectations.rules()))
        required = REQUIRED[self.kind]
        ex = ctx.manifest.execution
        agents = sorted(set(pq.read_table(ctx.paths.attempts, columns=["agent"]).column("agent").to_pylist()))
        every = ctx.env.families(ctx.taskset)
        uncovered = None if every is None else sorted(set(every) - {v.family for v in verdicts})
        summary = RunSummary(
            run_id=ctx.run_id, kind=self.kind, groups=self.groups, environment=ctx.manifest.environment.name,
            manifest_sha256=ctx.manifest.sha256, frozen_manifest_sha256=frozen_sha256,
            variant_manifest_sha256=variants or {}, backend=ctx.sandbox.backend, backend_version=ex.backend_version,
            image=ex.image, image_digest=ex.image_digest, machine=machine(), code_commit=ctx.code.label,
            patch=ctx.code.patch, started_at=ctx.started_at, finished_at=datetime.now(UTC), interrupted=interrupted,
            agents=agents, counts=c, required=list(required), facts=facts,
            dataset_verdict=dataset_verdict(facts, required), dataset_findings=findings,
            families_uncovered=uncovered, strata=list(strata), probes=list(probes))
        write_json(ctx.paths.summary, summary)
        write_checksums(ctx.paths)
        return summary


def reopen(root, data: tuple = ()) -> tuple[RunContext, Manifest]:
    """A finished pool's run context (its own contract verified on this machine) and its
    frozen contract, to add evidence to it (a smoke test)."""
    paths = RunPaths(Path(root))
    if not paths.manifest.is_file() or not paths.attempts.is_file():
        raise ValidateError(f"RUN_DIR: {root} is not a finished run directory (no manifest.json or attempts.parquet)")
    if not paths.frozen_manifest.is_file():
        raise ValidateError(f"RUN_DIR: {root} froze no set (no frozen-manifest.json): smoke tests a pool's frozen set")
    manifest, frozen = load_manifest(paths.manifest), load_manifest(paths.frozen_manifest)
    if frozen.parent_sha256 != manifest.sha256:
        raise ValidateError(f"{paths.frozen_manifest}: its parent_sha256 is not the run's manifest")
    hints = LoadHints(search=tuple(data))
    sandbox = open_sandbox(manifest.execution.backend, image=manifest.execution.image, run_label=paths.root.name)
    env, taskset = verify(manifest, sandbox, hints)
    ctx = RunContext(env=env, manifest=manifest, taskset=taskset, sandbox=sandbox, paths=paths,
                     run_id=paths.root.name, code=code_state(), hints=hints)
    return ctx, frozen
