"""One eval run: open → the greedy pass → the sampled pass → fold → summary, finished even when
interrupted, resumable.

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

from validate.errors import EvidenceError
from validate.eval.client import ChatClient
from validate.eval.contract import EvalContract
from validate.eval.evidence import EvalJournal, EvalPaths, latest_entries, write_side_tables
from validate.eval.metrics import GREEDY_PHASE, SAMPLED_PHASE
from validate.eval.chat import EvalContext, model_play
from validate.eval.summary import EvalSummary, summarize
from validate.evidence import Journal, atomic_write, fold, write_checksums, write_json, write_parquet
from validate.lifecycle import open_directory
from validate.records import arrow_schema, flat_row
from validate.context import Interrupted, Play, RunContext
from validate.runner import execute
from validate.summary import machine

PASSES = ("greedy", "sampled")


def plays(ec: EvalContext, idx: list[int], passes: tuple[str, ...] = PASSES) -> list[Play]:
    out = []
    if "greedy" in passes:
        out.append(model_play(ec, GREEDY_PHASE, 0.0, 1, idx))
    if "sampled" in passes:
        out.append(model_play(ec, SAMPLED_PHASE, ec.contract.sampling.temperature, ec.contract.k, idx))
    return out


def open_eval(ctx: RunContext, contract: EvalContract) -> EvalPaths:
    """Create (or check, when resuming) the run directory with both contracts and the patch."""
    paths = EvalPaths(ctx.paths)
    if contract.parent.manifest_sha256 != ctx.manifest.sha256:
        raise EvidenceError(f"{paths.contract}: the eval contract's parent is {contract.parent.manifest_sha256}, "
                            f"not the run's manifest {ctx.manifest.sha256}")
    # Every refusal comes before anything is written: a resume refused leaves the sealed run as it was.
    if paths.contract.exists() and paths.contract.read_bytes() != contract.to_json():
        raise EvidenceError(f"{paths.contract}: this run directory was made with another eval contract; resume "
                            f"it with that contract or start a new run directory")
    open_directory(ctx)
    if not paths.contract.exists():
        atomic_write(paths.contract, contract.to_json())
    return paths


def evaluate(ctx: RunContext, contract: EvalContract, client: ChatClient,
             passes: tuple[str, ...] = PASSES) -> EvalSummary:
    """Play the passes and finish the run; on an interrupt, finish what is there and re-raise."""
    paths = open_eval(ctx, contract)
    journal = Journal(ctx.paths, ctx.taskset.metric_names)
    ec = EvalContext(run=ctx, contract=contract, client=client, journal=EvalJournal(paths))
    try:
        for play in plays(ec, ctx.manifest.selection.idx, passes):
            execute(ctx, journal, play, resume="`validate eval run --resume`")
    except Interrupted:
        finish(ec, journal, interrupted=True)
        raise
    finally:  # both journals keep a file open: closed however the run ends (finish closed them already)
        journal.close()
        ec.journal.close()
    return finish(ec, journal, interrupted=False)


def finish(ec: EvalContext, journal: Journal, interrupted: bool) -> EvalSummary:
    """Fold both journals, write the task table and the summary, seal the directory."""
    ctx, contract = ec.run, ec.contract
    paths = EvalPaths(ctx.paths)
    fold(journal)
    ec.journal.close()
    attempts = Journal(ctx.paths, ctx.taskset.metric_names).existing()
    recorded = {(a.phase, a.task_id, a.agent, a.sample, a.attempt) for a in attempts}
    entries = latest_entries(ec.journal, recorded, previous=paths.samples)
    write_side_tables(paths, list(entries.values()))
    families = {e.id: ctx.taskset.task(e.idx).family for e in ctx.manifest.tasks}
    task_ids = [e.id for e in ctx.manifest.tasks]
    threshold = contract.reward.pass_threshold
    m = contract.model
    summary, tasks = summarize(
        attempts, [e.sample for e in entries.values()], task_ids, families, contract.k, threshold,
        run_id=ctx.run_id, contract_sha256=contract.sha256, manifest_sha256=ctx.manifest.sha256,
        environment=ctx.manifest.environment.name, model=f"{m.id}@{m.revision}", backend=ctx.sandbox.backend,
        image_digest=ctx.manifest.execution.image_digest, machine=machine(), code_commit=ctx.code.label,
        patch=ctx.code.patch, started_at=ctx.started_at, finished_at=datetime.now(UTC), interrupted=interrupted)
    write_parquet(paths.tasks, (flat_row(t) for t in tasks), arrow_schema(type(tasks[0]))) if tasks else None
    write_json(paths.summary, summary)
    write_checksums(ctx.paths)
    return summary
