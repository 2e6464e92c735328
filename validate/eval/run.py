"""One eval run — a `validate.run.lifecycle.Run` whose conclusion is its metrics: open → the greedy
pass → the sampled pass → fold → summary, finished even when interrupted, resumable.

The run directory holds the frozen dataset manifest (``manifest.json``, as every run
directory does) and the eval contract (``eval-contract.json``), both byte-identical; a
resumed run refuses another contract or manifest, or another patch. The greedy pass
(phase ``eval-greedy``) plays each task once at temperature 0; the sampled pass (phase
``eval``) plays k samples at the contract's temperature. Then the journals are folded into
Parquet, the summary (`validate.eval.summary`) is written as ``eval.json``, and everything
is sealed with ``checksums``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from validate.core.errors import EvidenceError
from validate.core.paths import RunPaths
from validate.core.records import arrow_schema, flat_row
from validate.eval.client import ChatClient
from validate.eval.contract import EvalContract
from validate.eval.evidence import EvalJournal, EvalPaths, latest_entries, write_side_tables
from validate.eval.metrics import GREEDY_PHASE, SAMPLED_PHASE
from validate.eval.summary import EvalSummary, summarize
from validate.evidence.journal import Journal, write_parquet
from validate.evidence.summary import machine
from validate.kinds.chat import EvalContext, model_play
from validate.run.context import Interrupted, Play, RunContext
from validate.run.lifecycle import Conclusion, Run

PASSES: tuple[Literal["greedy", "sampled"], ...] = ("greedy", "sampled")


class EvalPhase(BaseModel):
    """``validate eval run``: the passes to play on the contract's frozen set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    passes: tuple[Literal["greedy", "sampled"], ...] = Field(
        default=PASSES, min_length=1,
        description="greedy (temperature 0, pass@1) and/or sampled (k samples).")


def plays(ec: EvalContext, idx: list[int], passes: tuple[str, ...] = PASSES) -> list[Play]:
    out = []
    if "greedy" in passes:
        out.append(model_play(ec, GREEDY_PHASE, 0.0, 1, idx))
    if "sampled" in passes:
        out.append(model_play(ec, SAMPLED_PHASE, ec.contract.sampling.temperature, ec.contract.k, idx))
    return out


class Metrics(Conclusion[None, EvalSummary]):
    """A model evaluation's conclusion: its eval contract sealed beside the manifest, its own
    journal of samples and turns (folded into samples.parquet and trajectories.parquet), the
    task table and the metrics, ``eval.json``."""

    def __init__(self, ctx: RunContext, contract: EvalContract) -> None:
        if contract.parent.manifest_sha256 != ctx.manifest.sha256:
            raise EvidenceError(f"{EvalPaths(ctx.paths).contract}: the eval contract's parent is "
                                f"{contract.parent.manifest_sha256}, not the run's manifest "
                                f"{ctx.manifest.sha256}")
        self.contract, self.paths = contract, EvalPaths(ctx.paths)
        self.journal = EvalJournal(self.paths)

    def documents(self, ctx: RunContext) -> dict[Path, bytes]:
        return {self.paths.contract: self.contract.to_json()}

    def summary_path(self, paths: RunPaths) -> Path:
        return EvalPaths(paths).summary

    def close(self) -> None:
        self.journal.close()

    def conclude(self, run: Run, interrupted: bool, ending: None) -> EvalSummary:
        """Fold the eval journal, write the task table, and compute the summary."""
        ctx, contract, paths = run.ctx, self.contract, self.paths
        self.journal.close()
        attempts = Journal(ctx.paths, ctx.taskset.metric_names).existing()
        recorded = {(a.phase, a.task_id, a.agent, a.sample, a.attempt) for a in attempts}
        entries = latest_entries(self.journal, recorded, previous=paths.samples)
        write_side_tables(paths, list(entries.values()))
        families = {e.id: ctx.taskset.task(e.idx).family for e in ctx.manifest.tasks}
        m = contract.model
        summary, tasks = summarize(
            attempts, [e.sample for e in entries.values()], [e.id for e in ctx.manifest.tasks], families,
            contract.k, contract.reward.pass_threshold, run_id=ctx.run_id, contract_sha256=contract.sha256,
            manifest_sha256=ctx.manifest.sha256, environment=ctx.manifest.environment.name,
            model=f"{m.id}@{m.revision}", backend=ctx.sandbox.backend,
            image_digest=ctx.manifest.execution.image_digest, machine=machine(), code_commit=ctx.code.label,
            patch=ctx.code.patch, started_at=ctx.started_at, finished_at=datetime.now(UTC),
            interrupted=interrupted)
        if tasks:
            write_parquet(paths.tasks, (flat_row(t) for t in tasks), arrow_schema(type(tasks[0])))
        return summary


def evaluate(ctx: RunContext, contract: EvalContract, client: ChatClient,
             cfg: EvalPhase = EvalPhase()) -> EvalSummary:
    """Play the passes on one `Run` and finish it; on an interrupt, finish what is there and re-raise."""
    metrics = Metrics(ctx, contract)
    run = Run(ctx, metrics)
    ec = EvalContext(run=ctx, contract=contract, client=client, journal=metrics.journal)
    try:
        for play in plays(ec, ctx.manifest.selection.idx, cfg.passes):
            run.play(play, resume="`validate eval run --resume`")
        return run.finish(False, None)
    except Interrupted:
        run.finish(True, None)
        raise
    finally:  # both journals keep a file open: closed however the run ends
        run.close()
