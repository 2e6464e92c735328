"""What the viewer reads of a model evaluation, and only through `validate.view.tables` (each
file opened inside the run directory without following a link, read once per change).

Nothing here computes a metric: the overall figures are the run's ``eval.json``, the per-task
pass@k and pass^k its ``eval-tasks.parquet`` (both written by `validate eval run` and checked
by its audit), a task's pass@1 the ``solved`` of its final greedy attempt in
``samples.parquet``. The final attempt of each sample is chosen by the eval's own rule
(`validate.eval.metrics.final_attempts`); one attempt's trajectory is handed to the eval
report's own renderer (`validate.eval.trajectories.blocks`) as the rows it reads.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow.compute as pc

from validate.core.paths import ATTEMPTS, EVAL_TASKS, SAMPLES, TRAJECTORIES
from validate.eval.metrics import GREEDY_PHASE, final_attempts
from validate.view import tables

KEY = ("phase", "task_id", "agent", "sample", "attempt")
ATTEMPT_COLUMNS = (*KEY, "superseded", "status", "reward", "error_class")
SAMPLE_COLUMNS = (*KEY, "termination", "turns", "tool_calls", "malformed_tool_calls", "tool_failures",
                  "wall_s", "solved", "failure_class", "failure_rule")


def _key(row: dict) -> tuple:
    return tuple(row[k] for k in KEY)


def attempts(root: Path, task_id: str | None = None) -> list[SimpleNamespace]:
    """Every attempt (superseded included), its sample row's columns beside its own; of one task
    when `task_id` is given. An attempt without a sample row keeps None in those columns."""
    a = tables.read(root, ATTEMPTS, ATTEMPT_COLUMNS)
    s = tables.read(root, SAMPLES, SAMPLE_COLUMNS)
    if task_id is not None:
        a = a.filter(pc.equal(a.column("task_id"), task_id))
        s = s.filter(pc.equal(s.column("task_id"), task_id))
    rows = {_key(r): r for r in s.to_pylist()}
    blank = {c: None for c in SAMPLE_COLUMNS if c not in KEY}
    return [SimpleNamespace(**{**blank, **rows.get(_key(r), {}), **r}) for r in a.to_pylist()]


@dataclass(frozen=True)
class TaskLine:
    """A row of the eval page's task table."""

    task: dict  # its eval-tasks.parquet row (the sampled pass): solved, n_valid, pass_at_k, pass_hat_k, …
    greedy: SimpleNamespace | None  # its final greedy attempt (None: never played)
    rules: dict[str, int]  # failure rule → final attempts of either pass with it


def task_lines(root: Path) -> list[TaskLine]:
    """One line per task of eval-tasks.parquet, in its order, with its greedy attempt and failure rules."""
    final = final_attempts(attempts(root))
    greedy = {a.task_id: a for a in final if a.phase == GREEDY_PHASE}
    rules: dict[str, Counter] = {}
    for a in final:
        if a.failure_rule is not None:
            rules.setdefault(a.task_id, Counter())[a.failure_rule] += 1
    return [TaskLine(task=t, greedy=greedy.get(t["task_id"]),
                     rules=dict(sorted(rules.get(t["task_id"], {}).items())))
            for t in tables.read(root, EVAL_TASKS).to_pylist()]


def task_row(root: Path, task_id: str) -> dict | None:
    t = tables.read(root, EVAL_TASKS)
    t = t.filter(pc.equal(t.column("task_id"), task_id))
    return t.to_pylist()[0] if t.num_rows else None


def task_attempts(root: Path, task_id: str) -> list[SimpleNamespace]:
    """A task's attempts, final or not, greedy pass first, then by sample and try; ``final`` set."""
    rows = attempts(root, task_id)
    chosen = {id(a) for a in final_attempts(rows)}
    for a in rows:
        a.final = id(a) in chosen
    return sorted(rows, key=lambda a: (a.phase != GREEDY_PHASE, a.phase, a.sample, a.attempt))


@dataclass
class OneAttempt:
    """The evidence of one attempt in the shape `validate.eval.trajectories.blocks` reads (the
    eval report's `EvalEvidence` narrowed to one key): its attempt and sample rows, its turns."""

    attempts: pd.DataFrame
    samples: pd.DataFrame
    turns: dict[tuple, list[dict]]
    attempt: dict  # the whole attempt row: reply, metrics, error


def one_attempt(root: Path, key: tuple) -> OneAttempt | None:
    """The attempt `key` (phase, task_id, agent, sample, attempt); None when the run has no such one."""
    phase, task_id = key[0], key[1]
    rows = [r for r in tables.task_attempts(root, [phase], task_id) if _key(r) == key]
    samples = tables.read(root, SAMPLES)
    samples = samples.filter(pc.equal(samples.column("task_id"), task_id)).to_pylist()
    sample = [r for r in samples if _key(r) == key]
    if not rows or not sample:
        return None
    turns = tables.read(root, TRAJECTORIES)
    turns = turns.filter(pc.equal(turns.column("task_id"), task_id)).to_pylist()
    mine = sorted((t for t in turns if _key(t) == key), key=lambda t: t["turn"])
    return OneAttempt(attempts=pd.DataFrame(rows), samples=pd.DataFrame(sample), turns={key: mine},
                      attempt=rows[0])
