"""The protocol's phases that span several runs of agents: the pilot and the full pool.

- `pilot`: a stratified sample of the contract's pool (source × paper count × paper
  length), played under the contract's config *and* with ``include_headers`` flipped, with
  the oracle, every control and the partial-credit probes. A probe must score strictly
  between the controls' typical (median) reward and the oracle's, task by task.
- `pool`: one oracle attempt on every task; each non-pass classified; the exception-free
  passes frozen as a child manifest (if they reach the minimum count); the controls then
  run on exactly that frozen set; one verdict per pool task.

Both resume: rerunning on the same run directory plays only what is missing.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from validate.agents import CONTROLS, PROBES, REGISTRY, resolve
from validate.contract import Manifest, build_taskset, derive, load_manifest, write_manifest
from validate.evidence import Journal, atomic_write, finalize, open_run
from validate.records import Attempt, TaskVerdict
from validate.runner import Interrupted, RunContext, execute, judge, summary
from validate.paths import MANIFEST_DIR

Hooks = dict[str, Callable]


def _finish(ctx: RunContext, journal: Journal, verdicts_of: Callable[[Journal], list[TaskVerdict]],
            **extra) -> tuple[dict, list[TaskVerdict]]:
    verdicts = verdicts_of(journal)
    return finalize(journal, verdicts, summary(ctx, verdicts, **extra)), verdicts


# --- pool -------------------------------------------------------------------------------

class PoolResult(BaseModel):
    run_dir: str
    tasks: int
    oracle_passes: int
    frozen_manifest: str | None
    compatible: int
    below_minimum: bool


def pool(ctx: RunContext, concurrency: int, hooks: Hooks | None = None,
         manifest_dir: Path = MANIFEST_DIR) -> PoolResult:
    """Oracle on every task → freeze the exception-free passes → controls on that set."""
    hooks = hooks or {}
    parent = ctx.manifest
    oracle, controls = REGISTRY["oracle"], [REGISTRY[c] for c in parent.expectations.control_max_reward]
    open_run(ctx.paths, parent.to_json())
    journal = Journal(ctx.paths, ctx.taskset.metric_names)
    octx = dataclasses.replace(ctx, phase="oracle")
    frozen_copy = ctx.paths.root / "frozen-manifest.json"
    verdicts_of = lambda j: judge(octx, j.marked(), [oracle])  # noqa: E731
    try:
        execute(octx, journal, parent.selection.idx, [oracle], concurrency, **hooks)
        oracle_verdicts = judge(octx, journal.marked(), [oracle])
        passes = [v.idx for v in oracle_verdicts if v.compatible]
        if len(passes) < parent.min_task_count:
            _finish(octx, journal, verdicts_of, below_minimum=True)
            return PoolResult(run_dir=str(ctx.paths.root), tasks=len(parent.tasks), oracle_passes=len(passes),
                              frozen_manifest=None, compatible=0, below_minimum=True)
        if frozen_copy.exists():  # resuming: the set was frozen already
            frozen = load_manifest(frozen_copy)
        else:
            frozen = derive(parent, name=f"{parent.name}.frozen", idx=passes, corpus=ctx.taskset.corpus,
                            rule=f"exception-free oracle passes of {parent.name}: {len(passes)}/{len(parent.tasks)}")
            atomic_write(frozen_copy, frozen.to_json())
        write_manifest(frozen, manifest_dir / f"{frozen.name}.json")
        cctx = dataclasses.replace(ctx, phase="controls", manifest=frozen)
        execute(cctx, journal, frozen.selection.idx, controls, concurrency, **hooks)
    except Interrupted:
        _finish(octx, journal, verdicts_of, interrupted=True)
        raise
    frozen_idx = set(frozen.selection.idx)

    def verdicts_all(j: Journal) -> list[TaskVerdict]:  # two streamed passes over the attempts
        both = judge(cctx, j.marked(), [oracle, *controls], entries=frozen.tasks, phases=["oracle", "controls"])
        by_idx = {v.idx: v for v in both}
        return [by_idx[v.idx] if v.idx in frozen_idx else v for v in judge(octx, j.marked(), [oracle])]

    _, verdicts = _finish(cctx, journal, verdicts_all, frozen_manifest_sha256=frozen.sha256,
                          pool_manifest_sha256=parent.sha256)
    return PoolResult(run_dir=str(ctx.paths.root), tasks=len(parent.tasks), oracle_passes=len(passes),
                      frozen_manifest=str(manifest_dir / f"{frozen.name}.json"),
                      compatible=sum(v.compatible for v in verdicts), below_minimum=False)


# --- pilot ------------------------------------------------------------------------------

class Stratum(BaseModel):
    name: str
    pool_tasks: int
    sampled: list[int]


class ProbeCheck(BaseModel):
    variant: str
    task_id: str
    probe: str
    reward: float | None
    control_typical: float
    oracle_reward: float | None
    ok: bool


class PilotResult(BaseModel):
    run_dir: str
    strata: list[Stratum]
    variants: list[str]
    tasks: int
    compatible: int
    probes: list[ProbeCheck]
    probes_ok: bool


def stratify(manifest: Manifest, taskset, per_stratum: int) -> list[Stratum]:
    """Strata of the pool: anchor paper's source × 1 or several papers × anchor length (short
    ≤ the pool's median anchor length < long). The lowest idx of each stratum are sampled."""
    facts = []
    for entry in manifest.tasks:
        task = taskset.task(entry.idx)
        facts.append((entry.idx, task.paper_ids[0].split(":")[0], task.n_papers, len(task.gold[0])))
    median = statistics.median(f[3] for f in facts)
    groups: dict[str, list[int]] = {}
    for idx, source, k, length in facts:
        name = f"{source} / {'1 paper' if k == 1 else 'several papers'} / {'short' if length <= median else 'long'}"
        groups.setdefault(name, []).append(idx)
    return [Stratum(name=n, pool_tasks=len(ix), sampled=sorted(ix)[:per_stratum]) for n, ix in sorted(groups.items())]


def _probe_checks(variant: str, attempts: list[Attempt], verdicts: list[TaskVerdict]) -> list[ProbeCheck]:
    out = []
    for v in verdicts:
        mine = [a for a in attempts if a.idx == v.idx and not a.superseded]
        control_rewards = [a.reward or 0.0 for a in mine if a.agent in CONTROLS]
        typical = statistics.median(control_rewards) if control_rewards else 0.0
        for a in sorted((a for a in mine if a.agent in PROBES), key=lambda a: a.agent):
            ok = a.status == "ok" and a.reward is not None and v.oracle_reward is not None \
                and typical < a.reward < v.oracle_reward
            out.append(ProbeCheck(variant=variant, task_id=v.task_id, probe=a.agent, reward=a.reward,
                                  control_typical=typical, oracle_reward=v.oracle_reward, ok=ok))
    return out


def pilot(ctx: RunContext, per_stratum: int, concurrency: int, hooks: Hooks | None = None) -> PilotResult:
    hooks = hooks or {}
    parent = ctx.manifest
    strata = stratify(parent, ctx.taskset, per_stratum)
    sample = sorted(i for s in strata for i in s.sampled)
    open_run(ctx.paths, parent.to_json())
    journal = Journal(ctx.paths, ctx.taskset.metric_names)
    agents = resolve("all")
    probes = [REGISTRY[p] for p in PROBES]
    variants: list[tuple[str, RunContext]] = []
    for headers in (parent.environment.config.include_headers, not parent.environment.config.include_headers):
        variant = f"headers-{'on' if headers else 'off'}"
        copy = ctx.paths.root / f"pilot-{variant}.manifest.json"
        if copy.exists():
            child = load_manifest(copy)
        else:
            config = parent.environment.config.model_copy(update={"include_headers": headers})
            child = derive(parent, name=f"{parent.name}.pilot-{variant}", idx=sample, corpus=ctx.taskset.corpus,
                           config=config, rule=f"pilot: {per_stratum} lowest idx per stratum "
                                               f"(source × paper count × length), include_headers={headers}")
            atomic_write(copy, child.to_json())
        taskset = build_taskset(child.environment, ctx.taskset.corpus)
        variants.append((variant, dataclasses.replace(ctx, manifest=child, taskset=taskset, phase=f"pilot-{variant}")))

    def verdicts_all(j: Journal) -> list[TaskVerdict]:
        attempts = j.existing()  # a pilot is small
        return [v for _, vctx in variants for v in judge(vctx, attempts, agents)]

    try:
        for _, vctx in variants:
            execute(vctx, journal, sample, [*agents, *(p for p in probes if p.min_papers == 1)], concurrency, **hooks)
            multi = [e.idx for e in vctx.manifest.tasks if vctx.taskset.task(e.idx).n_papers >= 2]
            execute(vctx, journal, multi, [p for p in probes if p.min_papers >= 2], concurrency, **hooks)
    except Interrupted:
        _finish(ctx, journal, verdicts_all, interrupted=True)
        raise
    attempts = journal.existing()  # a pilot is small
    checks = []
    for variant, vctx in variants:
        mine = [a for a in attempts if a.phase == vctx.phase]
        checks += _probe_checks(variant, mine, judge(vctx, attempts, agents))
    result_extra = {"strata": [s.model_dump() for s in strata], "probes_ok": all(c.ok for c in checks)}
    atomic_write(ctx.paths.root / "probes.json",
                 PilotResultProbes(probes=checks).model_dump_json(indent=2).encode() + b"\n")
    _, verdicts = _finish(ctx, journal, verdicts_all, **result_extra)
    return PilotResult(run_dir=str(ctx.paths.root), strata=strata, variants=[v for v, _ in variants],
                       tasks=len(verdicts), compatible=sum(v.compatible for v in verdicts), probes=checks,
                       probes_ok=all(c.ok for c in checks))


class PilotResultProbes(BaseModel):
    probes: list[ProbeCheck]


