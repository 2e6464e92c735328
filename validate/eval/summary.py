"""``eval.json``: an eval run's summary, computed from its evidence by pure functions.

`summarize` takes the attempts and sample rows of a run (every try, superseded included)
and the frozen task list, and returns the `EvalSummary`: the greedy pass@1, the sampled
pass@k family (`validate.eval.metrics`), per-family rows, what the agent did (turns,
tokens, latency, tool calls, terminations), every error, and the failure classes
(`validate.eval.classes`) of the final attempts that did not solve their task.
`validate eval audit` recomputes it from the Parquet files and compares.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from validate.core.records import HARNESS_ERROR, INFRASTRUCTURE_ERROR, SCORER_ERROR
from validate.eval.metrics import (
    GREEDY_PHASE,
    SAMPLED_PHASE,
    FamilyRow,
    GreedyMetrics,
    Sample,
    SampledMetrics,
    TaskEval,
    family_rows,
    final_attempts,
    greedy_metrics,
    is_valid,
    sampled_metrics,
    samples_of,
    task_eval,
)
from validate.eval.records import SampleRow
from validate.evidence.patches import PatchInfo
from validate.evidence.summary import Machine


class Spread(BaseModel):
    n: int = Field(description="How many values.")
    mean: float | None = Field(description="Their mean.")
    p50: float | None = Field(description="Their median.")
    p95: float | None = Field(description="Their 95th percentile (nearest rank).")
    max: float | None = Field(description="Their maximum.")


def spread(values: Sequence[float]) -> Spread:
    v = sorted(values)
    if not v:
        return Spread(n=0, mean=None, p50=None, p95=None, max=None)
    return Spread(n=len(v), mean=statistics.fmean(v), p50=statistics.median(v),
                  p95=v[min(len(v) - 1, max(0, -(-95 * len(v) // 100) - 1))], max=v[-1])


class Operations(BaseModel):
    """What the agent did over one pass's final attempts."""

    attempts: int = Field(description="Final attempts of the pass.")
    statuses: dict[str, int] = Field(description="Final attempts by status.")
    terminations: dict[str, int] = Field(description="Final attempts by how the conversation ended.")
    turns: Spread = Field(description="Model calls per attempt.")
    prompt_tokens: Spread = Field(description="Prompt tokens per attempt (attempts the endpoint counted).")
    completion_tokens: Spread = Field(description="Completion tokens per attempt.")
    wall_s: Spread = Field(description="Seconds per attempt.")
    model_s: Spread = Field(description="Seconds in model requests per attempt.")
    tool_calls: int = Field(description="Tool calls made.")
    malformed_tool_calls: int = Field(description="Malformed tool calls (not run; the model was told).")
    tool_failures: int = Field(description="Well-formed calls whose command failed (exit ≠ 0, timeout, OOM).")
    tool_timeouts: int = Field(description="Commands that hit the tool timeout.")
    limit_terminations: int = Field(description="Ended by max_turns, max_tokens or the model's context.")
    timeout_terminations: int = Field(description="Ended by the attempt's wall clock.")
    verifier_errors: int = Field(description="Final attempts whose scorer raised.")
    environment_errors: int = Field(description="Final attempts lost to infrastructure (sandbox, endpoint, "
                                                "scorer dependency) after their retries.")
    harness_errors: int = Field(description="Final attempts with a harness error.")


class ErrorCount(BaseModel):
    phase: str = Field(description="The pass.")
    status: str = Field(description="The attempt status.")
    error_class: str = Field(description="The error's kind.")
    attempts: int = Field(description="Attempts, superseded included.")


class ClassCount(BaseModel):
    phase: str = Field(description="The pass.")
    failure_class: str = Field(description="The class.")
    rule: str = Field(description="The rule that gave it.")
    attempts: int = Field(description="Final attempts (unsolved) with it.")


class EvalSummary(BaseModel):
    schema_version: int = Field(default=1, description="Version of this summary's schema.")
    run_id: str = Field(description="The run directory's name.")
    contract_sha256: str = Field(description="The eval contract.")
    manifest_sha256: str = Field(description="The frozen dataset manifest evaluated.")
    environment: str = Field(description="The environment.")
    model: str = Field(description="Model id and revision.")
    backend: str = Field(description="The sandbox backend.")
    image_digest: str = Field(description="The sandbox image.")
    machine: Machine = Field(description="The machine it ran on.")
    code_commit: str = Field(description="The harness code that ran.")
    patch: PatchInfo | None = Field(default=None, description="Its uncommitted patch, if any.")
    started_at: datetime = Field(description="UTC start.")
    finished_at: datetime = Field(description="UTC end.")
    interrupted: bool = Field(description="The run was stopped before it finished.")
    pass_threshold: float = Field(description="A sample is solved at or above this reward.")
    attempts: int = Field(description="Attempts recorded, superseded included.")
    superseded: int = Field(description="Attempts superseded by an infrastructure retry.")
    greedy: GreedyMetrics = Field(description="Deterministic pass@1 (temperature 0).")
    sampled: SampledMetrics = Field(description="The sampled pass.")
    families: list[FamilyRow] = Field(description="Per family.")
    operations: dict[str, Operations] = Field(description="Per pass: what the agent did.")
    errors: list[ErrorCount] = Field(description="Every non-agent error, by pass, status and kind.")
    failure_classes: list[ClassCount] = Field(description="Failure classes of unsolved final attempts.")


def _ops(final: list, rows: dict[tuple, SampleRow]) -> Operations:
    mine = [rows[k] for k in (_key(a) for a in final) if k in rows]
    status = Counter(a.status for a in final)
    term = Counter(s.termination or "none" for s in mine)
    return Operations(
        attempts=len(final), statuses=dict(sorted(status.items())), terminations=dict(sorted(term.items())),
        turns=spread([s.turns for s in mine]),
        prompt_tokens=spread([s.prompt_tokens for s in mine if s.prompt_tokens is not None]),
        completion_tokens=spread([s.completion_tokens for s in mine if s.completion_tokens is not None]),
        wall_s=spread([s.wall_s for s in mine]), model_s=spread([s.model_s for s in mine]),
        tool_calls=sum(s.tool_calls for s in mine),
        malformed_tool_calls=sum(s.malformed_tool_calls for s in mine),
        tool_failures=sum(s.tool_failures for s in mine), tool_timeouts=sum(s.tool_timeouts for s in mine),
        limit_terminations=sum(term[t] for t in ("max_turns", "max_tokens", "context_length")),
        timeout_terminations=term["timeout"], verifier_errors=status[SCORER_ERROR],
        environment_errors=status[INFRASTRUCTURE_ERROR], harness_errors=status[HARNESS_ERROR])


def _key(a) -> tuple:
    return (a.phase, a.task_id, a.agent, int(a.sample), int(a.attempt))


def summarize(attempts: Sequence, samples: Sequence[SampleRow], task_ids: Sequence[str],
              families: dict[str, str], k: int, threshold: float,
              **identity) -> tuple[EvalSummary, list[TaskEval]]:
    """The summary of an eval run (see the module docstring) and its task table
    (eval-tasks.parquet), both from one selection of the final attempts; `identity` fills the
    rest of the summary."""
    final = final_attempts(attempts)
    scored = samples_of(final, families)
    rows = {s.key(): s for s in samples}
    tasks = task_table(scored, task_ids, families, k, threshold)
    greedy = [s for s in scored if s.phase == GREEDY_PHASE]
    errors = Counter((a.phase, a.status, a.error_class or "") for a in attempts if not is_valid(a.status))
    classes = Counter((a.phase, rows[_key(a)].failure_class, rows[_key(a)].failure_rule) for a in final
                      if _key(a) in rows and rows[_key(a)].failure_class is not None)
    summary = EvalSummary(
        **identity, pass_threshold=threshold, attempts=len(attempts),
        superseded=len(attempts) - len(final), greedy=greedy_metrics(greedy, task_ids, threshold),
        sampled=sampled_metrics(tasks, k), families=family_rows(greedy, tasks, threshold),
        operations={p: _ops([a for a in final if a.phase == p], rows) for p in (GREEDY_PHASE, SAMPLED_PHASE)},
        errors=[ErrorCount(phase=p, status=s, error_class=e, attempts=n)
                for (p, s, e), n in sorted(errors.items())],
        # The rows counted have a class; their rule (set with it, `classify`) is checked by ClassCount.
        failure_classes=[ClassCount(phase=p, failure_class=c, rule=r, attempts=n)  # type: ignore[arg-type]
                         for (p, c, r), n in sorted(classes.items())])
    return summary, tasks


def task_table(scored: Sequence[Sample], task_ids: Sequence[str], families: dict[str, str], k: int,
               threshold: float) -> list[TaskEval]:
    """One `TaskEval` per task of the sampled pass, from the final samples (`samples_of`)."""
    by_task: dict[str, list] = {}
    for s in scored:
        if s.phase == SAMPLED_PHASE:
            by_task.setdefault(s.task_id, []).append(s)
    return [task_eval(t, families.get(t, "?"), by_task.get(t, []), k, threshold) for t in task_ids]
