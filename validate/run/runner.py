"""Play a phase's attempts and judge its tasks.

For each (task, agent, sample) still pending, the runner hands the executor an attempt
specification (plain data, `validate.run.executors.AttemptSpec`); the executor runs the
runner's worker on it somewhere and gives back every try's result, which the runner — the
only writer of evidence — journals as it arrives. One try is made by the play's attempt
kind (`validate.kinds`), which puts whatever goes wrong *in its row*; an infrastructure
fault (status ``infrastructure_error``) is retried with backoff, each try its own row; an
agent's own failure is data, never retried. An executor that runs attempts in another
process or machine ships the worker's `recipe` (plain data) and rebuilds the worker there
with `worker_from_recipe`; what such a worker returns is kept on the driver (the kind's
`keep`), and a try lost with its machine becomes its row through `PlayWorker.lost`.

Resuming is not a mode: the runner always skips (phase, task, agent, sample) keys whose
latest recorded attempt is final (anything but an infrastructure error).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential

from environment.protocol import Environment, LoadHints, Task, Taskset
from validate.agents import declared
from validate.contract.manifest import (
    Manifest,
    TaskCheck,
    TaskEntry,
    check_environment,
    check_execution,
    parse_manifest,
)
from validate.core.paths import RunPaths
from validate.core.records import ORACLE, Attempt, FindingRow, TaskVerdict
from validate.evidence.journal import Journal
from validate.evidence.patches import CodeState
from validate.evidence.verdicts import Outcome, TaskOutcomes, decide
from validate.kinds import KINDS
from validate.run.context import Interrupted, Play, RunContext
from validate.run.executors import AttemptSpec, ExecutorUnavailable, WorkerRecipe, make_executor
from validate.sandbox import open_sandbox

T = TypeVar("T")


def with_retries(ctx: RunContext, infra_retries: int, once: Callable[[int], T],
                 failed: Callable[[T], bool]) -> list[T]:
    """Every try of one unit of work: `once(try_index)` again while `failed(result)` (an
    infrastructure fault), with exponential backoff, at most ``1 + infra_retries`` times;
    each try is kept."""
    tries: list[T] = []
    mult, cap = ctx.backoff_s
    retrying = Retrying(retry=retry_if_result(lambda r: failed(r) and not ctx.stop.is_set()),
                        stop=stop_after_attempt(1 + infra_retries),
                        wait=wait_exponential(multiplier=mult, max=cap),
                        retry_error_callback=lambda state: None)
    for attempt in retrying:
        with attempt:
            result = once(len(tries))
            tries.append(result)
        assert attempt.retry_state.outcome is not None  # set when the attempt's block exits
        if not attempt.retry_state.outcome.failed:
            attempt.retry_state.set_result(result)
    return tries


class PlayWorker:
    """Plays one attempt specification of `play` on this machine: every try of it, retried
    only on infrastructure faults. `cancel` kills what runs (closes the sandbox)."""

    def __init__(self, ctx: RunContext, play: Play, check: Callable[[int, Task], None] | None = None) -> None:
        self.ctx, self.play, self.check = ctx, play, check
        self.agents = {a.name: a for a in play.agents}
        self.task: Callable[[int], Task] = lru_cache(maxsize=max(8, 4 * ctx.executor.concurrency))(self._task)

    def _task(self, idx: int) -> Task:
        """The play's task `idx`, checked against the contract first when `check` is given."""
        task = self.play.taskset.task(idx)
        if self.check is not None:
            self.check(idx, task)
        return task

    def __call__(self, spec: AttemptSpec) -> list:
        ctx, play, kind = self.ctx, self.play, self.play.kind
        if spec.contract != play.manifest.sha256 or spec.limits != play.manifest.execution.limits:
            raise ValueError(f"attempt {spec.phase}/{spec.idx}/{spec.agent}: specified under contract "
                             f"{spec.contract}, not this play's {play.manifest.sha256} and its limits")
        task, agent = self.task(spec.idx), self.agents[spec.agent]
        if task.requires_network_isolation and not ctx.sandbox.isolates_network:
            return [kind.unsupported(ctx, play, task, agent, spec.sample, spec.attempt)]
        return with_retries(ctx, play.manifest.execution.infra_retries,
                            lambda n: kind.once(ctx, play, task, agent, spec.sample, spec.attempt + n),
                            lambda r: kind.row(r).status == "infrastructure_error")

    def cancel(self) -> None:
        self.ctx.stop.set()
        self.ctx.sandbox.close()

    def recipe(self) -> WorkerRecipe:
        """The plain data `worker_from_recipe` rebuilds this worker from on another machine."""
        ctx, play, kind = self.ctx, self.play, self.play.kind
        if not kind.standalone:
            raise ExecutorUnavailable(f"--executor: the {kind.name!r} attempt kind plays with this process's "
                                      "live context and cannot be shipped; run it with --executor threads")
        return WorkerRecipe(run_id=ctx.run_id, sandbox_label=ctx.paths.sandbox_label,
                            manifest=play.manifest.to_json().decode(),
                            execution=play.manifest.execution.model_dump(mode="json"),
                            data=[str(p) for p in ctx.hints.search], phase=play.phase, kind=kind.name,
                            agents=[a.name for a in play.agents], samples=play.samples,
                            backoff_s=ctx.backoff_s, code=ctx.code.label)

    def placed(self, results: list, node: str, host: str) -> list:
        """`results` with where they ran (a cluster node's id and host, as the executor knows them)."""
        return [self.play.kind.placed(r, node, host) for r in results]

    def lost(self, spec: AttemptSpec, first: int, error_class: str,
             message: str) -> tuple[list, AttemptSpec | None]:
        """The infrastructure-error result of try `spec.attempt`, lost with the machine that ran
        it, and the next try's specification while the contract's infra_retries allow one
        (tries since `first`, this one included, count against them)."""
        play = self.play
        result = play.kind.lost(self.ctx, play, self.task(spec.idx), self.agents[spec.agent], spec.sample,
                                spec.attempt, error_class, message)
        again = (
            spec.attempt + 1 - first <= play.manifest.execution.infra_retries and not self.ctx.stop.is_set()
        )
        return [result], spec.model_copy(update={"attempt": spec.attempt + 1}) if again else None


def worker_from_recipe(recipe: WorkerRecipe, scratch: Path, label: str | None = None) -> PlayWorker:
    """A worker on this machine from the driver's `recipe`: the contract is parsed and verified
    here (environment, this backend and its image digest; each task before it is first played,
    a `ContractError` if it differs); `scratch` is a directory of
    this machine for what a try may cache (the scorer's), never the run directory. `label`
    labels its sandbox (default: the driver's, `WorkerRecipe.sandbox_label`); a backend sweeps what an earlier
    process of the same label left, so each of several workers of one run on one machine needs its own."""
    m = parse_manifest(recipe.manifest.encode(), "the worker recipe's manifest")
    hints = LoadHints(search=tuple(Path(p) for p in recipe.data))
    sandbox = open_sandbox(m.execution.backend, image=m.execution.image,
                           run_label=label or recipe.sandbox_label)
    # The contract as `verify` checks it, but each task only when this worker is handed it
    # (`TaskCheck`): a node regenerates its share of a 10,000-task pool, not the whole of it
    # once per Ray worker process and play.
    env, config, taskset = check_environment(m, hints)
    check_execution(m, sandbox)
    agents = declared(env, env.Config.model_validate(m.environment.config))
    ctx = RunContext(env=env, manifest=m, taskset=taskset, sandbox=sandbox, paths=RunPaths(scratch),
                     run_id=recipe.run_id, code=CodeState(recipe.code, b"", ()), hints=hints,
                     backoff_s=recipe.backoff_s, executor=make_executor())
    play = Play(recipe.phase, m, taskset, [], [agents[n] for n in recipe.agents], KINDS.load(recipe.kind)(),
                recipe.samples)
    return PlayWorker(ctx, play, TaskCheck(m, env, config))


def play_task(ctx: RunContext, play: Play, task: Task, agent, sample: int, first: int) -> list[Attempt]:
    """The rows of every try of one (task, agent, sample) (see `PlayWorker`), their further
    evidence kept (the kind's `keep`) as `execute` keeps it."""
    worker = PlayWorker(ctx, play)
    worker.task = lambda idx: task
    results = worker(AttemptSpec(phase=play.phase, idx=task.idx, agent=agent.name, sample=sample,
                                 attempt=first, contract=play.manifest.sha256,
                                 limits=play.manifest.execution.limits))
    play.kind.keep(ctx, results)
    return [play.kind.row(r) for r in results]


def _latest(done: Iterable[Attempt], phase: str) -> dict[tuple[int, str, int], tuple[int, str]]:
    """(try number, status) of the latest recorded try of each (task, agent, sample) of `phase`."""
    latest: dict[tuple[int, str, int], tuple[int, str]] = {}
    for a in done:
        key = (a.idx, a.agent, a.sample)
        if a.phase == phase and (key not in latest or a.attempt > latest[key][0]):
            latest[key] = (a.attempt, a.status)
    return latest


def _unfinished(latest: dict, keys: Iterable[tuple[int, str, int]]) -> Iterator[tuple]:
    for key in keys:
        number, status = latest.get(key, (0, "infrastructure_error"))
        if status == "infrastructure_error":
            yield (*key, number + 1)


class Pending:
    """The specifications still to play (keys of a play with no final attempt recorded yet, less
    the (task, agent) pairs its contract skips), made one at a time as they are handed out:
    `len()` counts them without holding them, so a 10,000-task play costs the driver no list
    of specifications (only the latest try of keys already recorded, on a resume)."""

    def __init__(self, done: Iterable[Attempt], play: Play) -> None:
        self.play, self.latest = play, _latest(done, play.phase)
        self.skip = {e.idx: e.skip for e in play.manifest.tasks if e.skip} if play.skips else {}
        self.count = sum(1 for _ in self._todo())

    def _todo(self) -> Iterator[tuple]:
        play, skip = self.play, self.skip
        keys = ((idx, a.name, sample) for idx in play.idx
                for a in play.agents if a.name not in skip.get(idx, {})
                for sample in range(play.samples_of(a)))
        return _unfinished(self.latest, keys)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[AttemptSpec]:
        m = self.play.manifest
        for idx, name, sample, n in self._todo():
            yield AttemptSpec(phase=self.play.phase, idx=idx, agent=name, sample=sample, attempt=n,
                              contract=m.sha256, limits=m.execution.limits)


def pending(done: Iterable[Attempt], play: Play) -> Pending:
    """The specifications still to play (see `Pending`), produced lazily."""
    return Pending(done, play)


def execute(ctx: RunContext, journal: Journal, play: Play, resume: str = "--resume") -> None:
    """Play every pending specification of `play` through the context's executor and journal
    each result as it arrives. On Ctrl-C: the executor is cancelled, what finished is kept,
    `Interrupted` is raised."""
    kind = play.kind
    specs = pending(journal, play)
    ctx.progress.plan(len(specs))

    def record(results: list) -> None:
        kind.keep(ctx, results)
        rows = [kind.row(r) for r in results]
        journal.append(rows)
        if rows:  # one step per specification played (its final try), as planned
            ctx.progress.attempt(rows[-1])

    stopped = Interrupted(f"interrupted: what finished is recorded in {ctx.paths.root}; "
                          f"continue with {resume} {ctx.paths.root}")
    try:
        ctx.executor.run(specs, PlayWorker(ctx, play), record)
    except KeyboardInterrupt:
        ctx.executor.cancel()  # whatever the executor did: nothing of ours keeps running
        raise stopped from None
    if ctx.stop.is_set():  # cancelled without a Ctrl-C: the phase ends as interrupted too
        raise stopped


def judge(ctx: RunContext, outcomes: TaskOutcomes, phase: str, manifest: Manifest, taskset: Taskset,
          phases: tuple[str, ...]) -> Iterator[TaskVerdict]:
    """One verdict per task of `manifest`, in its order, from all its attempts in `phases`,
    superseded ones included (`decide` counts the oracle's repeats, sample 0 of the rest), made
    as they are consumed. `outcomes` gives each task's (`Journal.outcomes_by_task`, or `by_task`
    of (phase, task id, outcome) triples as `outcomes_of` gives them)."""
    tasks = manifest.tasks
    for e, found in zip(tasks, outcomes(phases, (t.id for t in tasks)), strict=True):
        yield verdict_row(ctx.env, ctx.run_id, phase, manifest, e, taskset.task(e.idx), found)


def verdict_row(env: Environment, run_id: str, phase: str, manifest: Manifest, entry: TaskEntry, task: Task,
                outcomes: list[Outcome]) -> TaskVerdict:
    """One task's verdict row from its attempts' outcomes (the run's and the audit's one way)."""
    exp = manifest.expectations
    findings = env.findings(task)
    oracle = exp.named(ORACLE)[0]
    d = decide(outcomes, exp.required(entry.skip), exp.rules(), exp.pass_threshold, exp.exception_rule,
               findings, oracle_repeats=exp.oracle_repeats, no_reference=entry.skip.get(oracle))
    return TaskVerdict(
        run_id=run_id, phase=phase, task_id=entry.id, idx=entry.idx, task_hash=entry.hash,
        family=task.family, meta=dict(task.meta), verdict=d.verdict, reason=d.reason, missing=d.missing,
        detail=d.detail, findings=[FindingRow(**f.model_dump()) for f in findings],
        oracle_reward=d.oracle_reward, max_control_reward=d.max_control_reward,
        max_control_agent=d.max_control_agent, margin=d.margin, retried=d.retried, n_attempts=len(outcomes),
        oracle_certified=None if manifest.execution.trial is None else d.oracle_certified)
