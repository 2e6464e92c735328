"""One run's lifecycle, for every kind of run: open → journal → plays → fold → conclude → seal,
finished even when interrupted.

`Run` opens the run directory (the contract copied byte for byte, the run's other sealed
documents, the patch stored when the code has one), keeps the journal, plays each `Play`
through the runner, and `finish` folds the journal into Parquet, hands the run to its
`Conclusion` for the summary, writes it and seals everything with ``checksums``. The kinds
of run differ only in their phases and their conclusion: a dataset run's is `Verdicts` (one
verdict per task, the dataset verdict from the protocol's criteria its phase requires,
``run.json``), a model evaluation's its metrics (`validate.eval.run.Metrics`, ``eval.json``).
Every phase (`validate.run.phases`, `validate.eval.run`) is a sequence of plays on one `Run`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel

from environment.protocol import LoadHints
from validate.contract.manifest import Manifest, load_manifest, verify
from validate.core.errors import EvidenceError, ValidateError
from validate.core.paths import RunPaths
from validate.core.records import (
    COMPATIBLE,
    CONTROL,
    EXCEPTION_STATUSES,
    EXCLUDED,
    INCOMPLETE,
    FindingRow,
    RunKind,
    TaskVerdict,
)
from validate.evidence.journal import (
    BATCH_ROWS,
    Journal,
    atomic_write,
    fold,
    open_run,
    write_checksums,
    write_json,
    write_verdicts,
)
from validate.evidence.patches import code_state
from validate.evidence.summary import Counts, JudgedGroup, ProbeCheck, RunSummary, Stratum, machine
from validate.evidence.verdicts import RunFacts, dataset_verdict
from validate.run.context import Play, RunContext
from validate.run.runner import execute
from validate.sandbox import open_sandbox


def hack_profile(manifest) -> tuple[str, int] | None:
    """(verifier mode, how many tampering controls) of a contract with a trial profile (a
    `Manifest` or its JSON as a dict), else None: what the claim's N and H are counted under."""
    data = manifest if isinstance(manifest, dict) else manifest.model_dump(mode="json")
    trial = data["execution"].get("trial")
    if trial is None:
        return None
    return trial["verifier_mode"], sum(1 for a in data["expectations"]["agents"].values() if a.get("tampers"))


def counts(verdicts: Iterable[TaskVerdict], attempts_path, hack: tuple[str, int] | None = None) -> Counts:
    """The run's counts, in one pass over `verdicts` (which may be read from disk); `hack`
    (`hack_profile`): also the oracle-certified tasks (N) and the hack-resistant ones (H)."""
    attempts = exceptions = superseded = 0
    exception_statuses = pa.array(EXCEPTION_STATUSES)
    # A batch at a time: reading the two columns whole held ~8 MB more at 10,000 tasks than at 1,000.
    for batch in pq.ParquetFile(attempts_path).iter_batches(batch_size=BATCH_ROWS,
                                                            columns=["status", "superseded"]):
        attempts += batch.num_rows
        exceptions += pc.sum(pc.is_in(batch.column("status"), value_set=exception_statuses)).as_py() or 0
        superseded += pc.sum(batch.column("superseded")).as_py() or 0
    by_reason: dict[str, int] = {}
    tally = {"tasks": 0, COMPATIBLE: 0, EXCLUDED: 0, INCOMPLETE: 0, "retried": 0, "certified": 0}
    for v in verdicts:
        tally["tasks"] += 1
        tally["certified"] += bool(v.oracle_certified)
        tally[v.verdict] += 1
        tally["retried"] += v.verdict == COMPATIBLE and v.retried
        if v.reason is not None:
            by_reason[v.reason] = by_reason.get(v.reason, 0) + 1
    return Counts(tasks=tally["tasks"], compatible=tally[COMPATIBLE], excluded=tally[EXCLUDED],
                  incomplete=tally[INCOMPLETE], excluded_by_reason=dict(sorted(by_reason.items())),
                  attempts=attempts, superseded=superseded,
                  exceptions=exceptions, retried_passes=tally["retried"],
                  oracle_certified=None if hack is None else tally["certified"],
                  hack_resistant=None if hack is None else
                  (tally[COMPATIBLE] if hack == ("trusted", hack[1]) and hack[1] > 0 else 0))


def chance_means(attempts_path, rules) -> dict[str, tuple[float, float]]:
    """Each chance-level control's mean final reward (sample 0; no reward counts 0) and ceiling."""
    chance = {n: r.ceiling for n, r in rules.items() if r.role == CONTROL and r.scope == "mean"}
    if not chance:
        return {}
    t = pq.read_table(attempts_path, columns=["agent", "sample", "superseded", "reward"])
    final = t.filter(pc.and_(pc.equal(t["sample"], 0), pc.invert(t["superseded"])))
    out = {}
    for name in sorted(chance):  # computed in Arrow: a pool's 80,000 rows are never Python objects
        rewards = pc.fill_null(final.filter(pc.equal(final["agent"], name))["reward"], 0.0).to_pylist()
        if rewards:  # summed in row order, as always (the audit compares the float)
            out[name] = (sum(rewards) / len(rewards), chance[name])
    return out


def run_facts(c: Counts, verdicts: Sequence[TaskVerdict], *, interrupted: bool, min_task_count: int,
              patch: str, dataset_findings: Sequence[FindingRow], probes: Sequence[ProbeCheck], smoke: str,
              chance: dict[str, tuple[float, float]], note: str = "") -> RunFacts:
    return RunFacts(tasks=c.tasks, compatible=c.compatible, excluded=c.excluded, incomplete=c.incomplete,
                    interrupted=interrupted, min_task_count=min_task_count,
                    excluded_without_one_reason=sum(v.verdict == EXCLUDED and v.reason is None
                                                    for v in verdicts),
                    patch=patch, blocking_dataset_findings=[f.detail for f in dataset_findings if f.blocking],
                    probes_total=len(probes), probes_ok=sum(p.ok for p in probes), smoke=smoke, note=note,
                    chance_controls=chance)


def open_directory(ctx: RunContext, documents: dict[Path, bytes] | None = None) -> None:
    """Create the run directory with its contract and the run's other sealed `documents`
    (path → bytes, e.g. an eval contract), or check them when resuming: the same contract,
    the same documents, and the same uncommitted patch (stored as ``patch.diff``) if there is
    one. Every refusal comes before anything is written: a refused resume leaves the sealed
    run as it was."""
    paths, documents = ctx.paths, documents or {}
    for path, data in sorted(documents.items()):
        if path.exists() and path.read_bytes() != data:
            raise EvidenceError(f"{path}: this run directory was made with another {path.name}; resume it "
                                "with that one or start a new run directory")
    if ctx.code.diff and paths.patch.exists() and paths.patch.read_bytes() != ctx.code.diff:
        raise EvidenceError(f"{paths.patch}: this run was started with another patch; resume it with the "
                            f"same code, or start a new run directory")
    open_run(paths, ctx.manifest.to_json())
    for path, data in sorted(documents.items()):
        if not path.exists():
            atomic_write(path, data)
    if ctx.code.diff:
        atomic_write(paths.patch, ctx.code.diff)


E = TypeVar("E")
S = TypeVar("S", bound=BaseModel)


class Conclusion(ABC, Generic[E, S]):
    """What one kind of run concludes from its folded evidence, sealed as its summary: a
    dataset run its verdicts and dataset verdict (`Verdicts`, ``run.json``), a model
    evaluation its metrics (`validate.eval.run.Metrics`, ``eval.json``). `E` is what the phase
    knows at its end beyond the evidence (a smoke test's outcome, probe checks; nothing for
    an eval)."""

    def documents(self, ctx: RunContext) -> dict[Path, bytes]:
        """Sealed documents the run directory holds beside its contract (none by default)."""
        return {}

    @abstractmethod
    def summary_path(self, paths: RunPaths) -> Path:
        """Where the summary is written."""

    @abstractmethod
    def conclude(self, run: Run, interrupted: bool, ending: E) -> S:
        """The summary, from the run's folded attempts (and any evidence of its own)."""

    def close(self) -> None:
        """Close what the conclusion keeps open (its own journals; nothing by default)."""


class Run(Generic[E, S]):
    """One run directory's lifecycle, for every kind of run: opened (contract, sealed
    documents, patch), played into its journal, folded into Parquet, concluded (`Conclusion`)
    and sealed with ``checksums``; `close` closes its journals however it ends."""

    def __init__(self, ctx: RunContext, conclusion: Conclusion[E, S]) -> None:
        self.ctx, self.conclusion = ctx, conclusion
        open_directory(ctx, conclusion.documents(ctx))
        self.journal = Journal(ctx.paths, ctx.taskset.metric_names)
        self._folded = False

    def play(self, play: Play, resume: str = "--resume") -> None:
        self._folded = False
        execute(self.ctx, self.journal, play, resume=resume)

    def fold(self) -> None:
        """Fold the journal into attempts.parquet (once per batch of plays)."""
        if not self._folded:
            fold(self.journal)
            self._folded = True

    def finish(self, interrupted: bool, ending: E) -> S:
        """Fold, conclude, write the summary and seal the directory."""
        self.fold()
        summary = self.conclusion.conclude(self, interrupted, ending)
        write_json(self.conclusion.summary_path(self.ctx.paths), summary)
        write_checksums(self.ctx.paths)
        return summary

    def close(self) -> None:
        self.journal.close()
        self.conclusion.close()


@dataclass(frozen=True)
class Ending:
    """What a dataset phase knows at its end besides its attempts."""

    verdicts: Sequence[TaskVerdict]
    smoke: str = "not run"
    note: str = ""
    strata: Sequence[Stratum] = ()
    probes: Sequence[ProbeCheck] = ()
    frozen_sha256: str | None = None
    variants: dict[str, str] = field(default_factory=dict)


class Verdicts(Conclusion[Ending, RunSummary]):
    """A dataset run's conclusion: one verdict per task of its groups (`verdicts_of`, from the
    journal), the dataset verdict by the criteria its phase requires, ``run.json``."""

    def __init__(self, kind: RunKind, required: Sequence[str], groups: list[JudgedGroup],
                 verdicts_of: Callable[[Journal], Iterable[TaskVerdict]]) -> None:
        self.kind, self.required, self.groups, self.verdicts_of = kind, tuple(required), groups, verdicts_of

    def summary_path(self, paths: RunPaths) -> Path:
        return paths.summary

    def judge(self, run: Run) -> Sequence[TaskVerdict]:
        """Fold the journal and write the verdict tables, streamed; return the verdicts as
        stored (read back on each pass, never all held)."""
        run.fold()
        return write_verdicts(run.ctx.paths, self.verdicts_of(run.journal))

    def conclude(self, run: Run, interrupted: bool, ending: Ending) -> RunSummary:
        ctx, verdicts = run.ctx, ending.verdicts
        c = counts(verdicts, ctx.paths.attempts, hack_profile(ctx.manifest))
        findings = dataset_findings(ctx)
        facts = run_facts(c, verdicts, interrupted=interrupted, min_task_count=ctx.manifest.min_task_count,
                          patch="documented" if ctx.code.diff else "none", dataset_findings=findings,
                          probes=ending.probes, smoke=ending.smoke, note=ending.note,
                          chance=chance_means(ctx.paths.attempts, ctx.manifest.expectations.rules()))
        ex = ctx.manifest.execution
        agents = sorted({a for batch in pq.ParquetFile(ctx.paths.attempts).iter_batches(batch_size=BATCH_ROWS,
                                                                                       columns=["agent"])
                         for a in pc.unique(batch.column("agent")).to_pylist()})
        every = ctx.env.families(ctx.taskset)
        uncovered = None if every is None else sorted(set(every) - {v.family for v in verdicts})
        return RunSummary(
            run_id=ctx.run_id, kind=self.kind, groups=self.groups, environment=ctx.manifest.environment.name,
            manifest_sha256=ctx.manifest.sha256, frozen_manifest_sha256=ending.frozen_sha256,
            variant_manifest_sha256=ending.variants, backend=ctx.sandbox.backend,
            backend_version=ex.backend_version, image=ex.image, image_digest=ex.image_digest,
            machine=machine(), code_commit=ctx.code.label, patch=ctx.code.patch, started_at=ctx.started_at,
            finished_at=datetime.now(UTC), interrupted=interrupted, agents=agents, counts=c,
            required=list(self.required), facts=facts, dataset_verdict=dataset_verdict(facts, self.required),
            dataset_findings=findings, families_uncovered=uncovered, strata=list(ending.strata),
            probes=list(ending.probes))


def dataset_findings(ctx: RunContext) -> list[FindingRow]:
    tasks = (ctx.taskset.task(e.idx) for e in ctx.manifest.tasks)
    return [FindingRow(**f.model_dump()) for f in ctx.env.dataset_findings(ctx.taskset, tasks)]


def reopen(root, data: tuple = ()) -> tuple[RunContext, Manifest]:
    """A finished pool's run context (its own contract verified on this machine) and its
    frozen contract, to add evidence to it (a smoke test)."""
    paths = RunPaths(Path(root))
    if not paths.manifest.is_file() or not paths.attempts.is_file():
        raise ValidateError(f"RUN_DIR: {root} is not a finished run directory (no manifest.json or "
                            "attempts.parquet)")
    if not paths.frozen_manifest.is_file():
        raise ValidateError(f"RUN_DIR: {root} froze no set (no frozen-manifest.json): smoke tests a "
                            "pool's frozen set")
    manifest, frozen = load_manifest(paths.manifest), load_manifest(paths.frozen_manifest)
    if frozen.parent_sha256 != manifest.sha256:
        raise ValidateError(f"{paths.frozen_manifest}: its parent_sha256 is not the run's manifest")
    hints = LoadHints(search=tuple(data))
    sandbox = open_sandbox(manifest.execution.backend, image=manifest.execution.image,
                           run_label=paths.sandbox_label)
    env, taskset = verify(manifest, sandbox, hints)
    ctx = RunContext(env=env, manifest=manifest, taskset=taskset, sandbox=sandbox, paths=paths,
                     run_id=paths.root.name, code=code_state(), hints=hints)
    return ctx, frozen
