"""The protocol's phases, each a sequence of plays on one `validate.run.lifecycle.Run`, and each a
function of its own config model (`RunPhase`, `PoolPhase`, `PilotPhase`: what the command line
or the API asks of it; the context says where and with what it runs).

- `run_agents`: chosen agents on a contract's tasks (one phase).
- `pool`: one oracle attempt on every task; each non-pass classified; the exception-free
  passes that some control can test frozen as a child contract (if they reach the minimum count); the controls
  then run on exactly that frozen set; then the fresh-materialisation smoke test; one verdict
  per pool task and one dataset verdict.
- `pilot`: a stratified sample of the contract's tasks (the environment's strata), played
  under each of the environment's pilot config variants with the oracle, every control and
  the partial-credit probes; a probe must score strictly between the controls' median and
  the oracle's reward, task by task.

Each resumes: rerunning on the same run directory plays only what is missing.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from environment.protocol import Taskset
from validate.agents import resolve
from validate.contract.manifest import Manifest, derive, load_manifest, load_taskset, write_manifest
from validate.core.paths import MANIFEST, VARIANTS
from validate.core.records import (
    COMPATIBLE,
    CONTROL,
    ORACLE,
    PILOT,
    POOL,
    PROBE,
    RUN,
    Attempt,
    RunKind,
    TaskVerdict,
)
from validate.evidence.journal import Journal, atomic_write
from validate.evidence.summary import JudgedGroup, ProbeCheck, RunSummary, Stratum
from validate.evidence.verdicts import by_task
from validate.kinds import kind_of
from validate.run.context import Interrupted, Play, RunContext
from validate.run.lifecycle import Ending, Run, Verdicts
from validate.run.runner import judge
from validate.run.smoke import SmokePhase, smoke as smoke_test


class RunPhase(BaseModel):
    """``validate run``: chosen agents on every task of the contract, as one phase."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ClassVar[RunKind] = RUN
    #: The protocol criteria its dataset verdict is held to (`validate.evidence.verdicts.CRITERIA`).
    required: ClassVar[tuple[str, ...]] = ("complete", "minimum", "one_reason", "patches", "dataset_findings",
                                           "chance_controls")

    agents: str | list[str] = Field(
        default="all",
        description="Agent names or groups (all, oracle, controls, probes), comma-separated or a list.",
    )
    phase: str = Field(default="run", min_length=1,
                       description="The phase name the attempts are recorded under.")


class PoolPhase(BaseModel):
    """``validate pool``: the oracle on every task, freeze, controls on the frozen set, smoke."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ClassVar[RunKind] = POOL
    required: ClassVar[tuple[str, ...]] = ("complete", "minimum", "one_reason", "patches", "dataset_findings",
                                           "chance_controls", "smoke")

    smoke_sample: int = Field(default=0, ge=0, description="Tasks of the frozen set the smoke test reruns "
                                                           "from an installed wheel (0: no smoke test; the "
                                                           "CLI's default is 5).")
    manifest_dir: Path | None = Field(default=None,
                                      description="Where the frozen child contract is also written.")


class PilotPhase(BaseModel):
    """``validate pilot``: a stratified sample under each config variant, probes included."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ClassVar[RunKind] = PILOT
    required: ClassVar[tuple[str, ...]] = ("complete", "every_task_compatible", "probes", "one_reason",
                                           "patches", "dataset_findings", "chance_controls")

    per_stratum: int = Field(default=1, ge=1, description="Lowest-idx tasks sampled from each stratum.")


def run_agents(ctx: RunContext, cfg: RunPhase) -> RunSummary:
    """Play the chosen agents (names or groups) on every task of the contract; judge; finish."""
    m, phase = ctx.manifest, cfg.phase
    config = ctx.env.Config.model_validate(m.environment.config)
    play = Play(phase, m, ctx.taskset, m.selection.idx,
                resolve(ctx.env, config, list(m.expectations.agents), cfg.agents), kind_of(ctx.env))
    verdicts = Verdicts(cfg.kind, cfg.required,
                        [JudgedGroup(phase=phase, attempt_phases=[phase], manifest=MANIFEST,
                                     expectations=MANIFEST)],
                        lambda j: judge(ctx, j.outcomes_by_task, phase, m, ctx.taskset, (phase,)))
    run = Run(ctx, verdicts)
    try:
        run.play(play)
    except Interrupted:
        run.finish(True, Ending(verdicts.judge(run)))
        raise
    return run.finish(False, Ending(verdicts.judge(run)))


# --- pool -------------------------------------------------------------------------------

#: The pool's phase of the controls on tasks without a reference solution (the oracle frozen
#: out of them): such a task is never frozen, since no oracle certifies it, but it is
#: runtime-tested — its verdict is ``no_reference_solution`` only when every control rejects.
RUNTIME_ONLY = "runtime-only"


def runtime_only(m: Manifest) -> list[int]:
    """The contract's tasks its oracle is frozen out of that some control can test."""
    oracle = m.expectations.named(ORACLE)[0]
    return [t.idx for t in m.tasks if oracle in t.skip and m.expectations.testing(t.skip)]


def pool(ctx: RunContext, cfg: PoolPhase, log: Callable[[str], None] = print) -> RunSummary:
    """Oracle on every task → freeze the exception-free passes some control can test → controls on
    that set → smoke (its progress lines go to `log`)."""
    parent, paths = ctx.manifest, ctx.paths
    config = ctx.env.Config.model_validate(parent.environment.config)
    names = list(parent.expectations.agents)
    kind = kind_of(ctx.env)
    oracle_play = Play("oracle", parent, ctx.taskset, parent.selection.idx,
                       resolve(ctx.env, config, names, ["oracle"]), kind)
    controls = resolve(ctx.env, config, names, ["controls"])
    unreferenced = runtime_only(parent)
    phases = ("oracle", "controls", *((RUNTIME_ONLY,) if unreferenced else ()))
    verdicts = Verdicts(cfg.kind, cfg.required,
                        [JudgedGroup(phase="pool", attempt_phases=list(phases), manifest=MANIFEST,
                                     expectations=MANIFEST)],
                        lambda j: judge(ctx, j.outcomes_by_task, "pool", parent, ctx.taskset, phases))
    run = Run(ctx, verdicts)
    frozen = None
    try:
        run.play(oracle_play)
        exp = parent.expectations
        oracle_only = parent.model_copy(update={"expectations": exp.model_copy(
            update={"agents": {n: a for n, a in exp.agents.items() if a.role == ORACLE}})})
        # A task no control can test can never be compatible: it is not frozen (its verdict, with
        # its own reason, comes from the whole pool's judgement).
        testable = {t.id for t in parent.tasks if exp.testing(t.skip)}
        passes = [v.idx for v in judge(ctx, run.journal.outcomes_by_task, "oracle", oracle_only, ctx.taskset,
                                       ("oracle",))
                  if v.verdict == COMPATIBLE and v.task_id in testable]
        del testable  # 10,000 ids at 10,000 tasks: not held through the controls' play
        if len(passes) < parent.min_task_count:
            note = (f"controls never ran: the oracle passed {len(passes)}/{len(parent.tasks)} tasks, below "
                    f"the minimum {parent.min_task_count}, so nothing was frozen")
            return run.finish(False, Ending(verdicts.judge(run), note=note))
        if paths.frozen_manifest.exists():  # resuming: the set was frozen already
            frozen = load_manifest(paths.frozen_manifest)
        else:
            frozen = derive(parent, ctx.env, ctx.taskset, name=f"{parent.name}.frozen", idx=passes,
                            rule=f"exception-free oracle passes of {parent.name}: "
                                 f"{len(passes)}/{len(parent.tasks)}")
            atomic_write(paths.frozen_manifest, frozen.to_json())
        if cfg.manifest_dir is not None:
            write_manifest(frozen, cfg.manifest_dir / f"{frozen.name}.json")
        run.play(Play("controls", frozen, ctx.taskset, frozen.selection.idx, controls, kind))
        if unreferenced:  # never frozen (nothing certifies them), but their controls still run
            run.play(Play(RUNTIME_ONLY, parent, ctx.taskset, unreferenced, controls, kind))
    except Interrupted:
        run.finish(True, Ending(verdicts.judge(run), frozen_sha256=frozen.sha256 if frozen else None))
        raise
    judged = verdicts.judge(run)
    outcome = "not run"
    if cfg.smoke_sample:
        outcome = "passed" if smoke_test(ctx, frozen, SmokePhase(sample=cfg.smoke_sample),
                                         log=log).passed else "failed"
    return run.finish(False, Ending(judged, smoke=outcome, frozen_sha256=frozen.sha256))


# --- pilot ------------------------------------------------------------------------------

def stratify(ctx: RunContext, per_stratum: int) -> list[Stratum]:
    """The environment's strata over the contract's tasks; the lowest idx of each are sampled."""
    groups: dict[str, list[int]] = {}
    for entry in ctx.manifest.tasks:
        groups.setdefault(ctx.env.strata(ctx.taskset.task(entry.idx)), []).append(entry.idx)
    return [Stratum(name=n, pool_tasks=len(ix),
                    sampled=sorted(ix)[:per_stratum]) for n, ix in sorted(groups.items())]


def probe_checks(variant: str, attempts: list[Attempt], verdicts: list[TaskVerdict]) -> list[ProbeCheck]:
    out = []
    for v in verdicts:
        mine = [a for a in attempts if a.task_id == v.task_id and not a.superseded]
        typical = statistics.median([a.reward or 0.0 for a in mine if a.role == CONTROL] or [0.0])
        for a in sorted((a for a in mine if a.role == PROBE), key=lambda a: a.agent):
            ok = a.status == "ok" and a.reward is not None and v.oracle_reward is not None \
                and typical < a.reward < v.oracle_reward
            out.append(ProbeCheck(variant=variant, task_id=v.task_id, probe=a.agent, reward=a.reward,
                                  control_typical=typical, oracle_reward=v.oracle_reward, ok=ok))
    return out


@dataclasses.dataclass(frozen=True)
class _Variant:
    name: str
    manifest: Manifest
    taskset: Taskset


def _variants(ctx: RunContext, sample: list[int], per_stratum: int) -> list[_Variant]:
    """The pilot's config variants, each a child contract of the sample: read from the run's
    ``variants/`` when resuming, derived otherwise (and written by `_keep_variants`)."""
    config = ctx.env.Config.model_validate(ctx.manifest.environment.config)
    out = []
    for name, variant in ctx.env.pilot_variants(config):
        copy = ctx.paths.variants / f"{name}.json"
        taskset = ctx.taskset if variant == config else load_taskset(
            ctx.env, variant, ctx.manifest.hints(ctx.hints.search))
        if copy.exists():
            child = load_manifest(copy)
        else:
            child = derive(ctx.manifest, ctx.env, taskset, name=f"{ctx.manifest.name}.pilot-{name}",
                           idx=sample, config=variant,
                           rule=f"pilot: {per_stratum} lowest idx per stratum, config variant {name}")
        out.append(_Variant(name=name, manifest=child, taskset=taskset))
    return out


def _keep_variants(ctx: RunContext, variants: list[_Variant]) -> None:
    ctx.paths.variants.mkdir(exist_ok=True)
    for var in variants:
        copy = ctx.paths.variants / f"{var.name}.json"
        if not copy.exists():
            atomic_write(copy, var.manifest.to_json())


def pilot(ctx: RunContext, cfg: PilotPhase) -> RunSummary:
    # an unplayable kind is refused before the run opens
    per_stratum, kind = cfg.per_stratum, kind_of(ctx.env)
    strata = stratify(ctx, per_stratum)
    sample = sorted(i for s in strata for i in s.sampled)
    variants = _variants(ctx, sample, per_stratum)
    config = ctx.env.Config.model_validate(ctx.manifest.environment.config)
    agents = resolve(ctx.env, config, list(ctx.manifest.expectations.agents), ["all", "probes"])
    groups = [JudgedGroup(phase=f"pilot-{v.name}", attempt_phases=[f"pilot-{v.name}"],
                          manifest=f"{VARIANTS}/{v.name}.json", expectations=f"{VARIANTS}/{v.name}.json")
              for v in variants]

    def verdicts_all(j: Journal) -> list[TaskVerdict]:
        attempts = by_task(list(j.outcomes()))  # a pilot is small
        return [v for var in variants for v in judge(ctx, attempts, f"pilot-{var.name}", var.manifest,
                                                     var.taskset, (f"pilot-{var.name}",))]

    conclusion = Verdicts(cfg.kind, cfg.required, groups, verdicts_all)
    run = Run(ctx, conclusion)
    _keep_variants(ctx, variants)
    shas = {v.name: v.manifest.sha256 for v in variants}
    try:
        for var in variants:
            run.play(Play(f"pilot-{var.name}", var.manifest, var.taskset, sample, agents, kind))
    except Interrupted:
        run.finish(True, Ending(conclusion.judge(run), strata=strata, variants=shas))
        raise
    verdicts = conclusion.judge(run)
    attempts = run.journal.existing()
    checks = [c for var in variants
              for c in probe_checks(var.name, [a for a in attempts if a.phase == f"pilot-{var.name}"],
                                    [v for v in verdicts if v.phase == f"pilot-{var.name}"])]
    return run.finish(False, Ending(verdicts, strata=strata, probes=checks, variants=shas))


#: The criteria each kind of dataset run is held to, from its phase's config model (what the
#: audit checks a run's summary against).
CRITERIA: dict[RunKind, tuple[str, ...]] = {c.kind: c.required for c in (RunPhase, PoolPhase, PilotPhase)}
