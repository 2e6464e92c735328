"""The evidence tables as the viewer reads them: only the columns a page shows, with pyarrow.

The run page reads the small columns of ``tasks.parquet`` and ``attempts.parquet`` (never
replies, stdout or stderr) and filters with Arrow compute; a task page reads the whole rows
of one task's attempts, from only the row groups that hold them. Tables are cached by the
file's identity (inode, size, modification time), so a page reloads only what changed.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from validate.core.paths import ATTEMPTS, TASKS
from validate.core.records import ROLES
from validate.evidence.summary import RunSummary
from validate.view.catalog import open_inside, resolve_inside

TASK_COLUMNS = ("phase", "task_id", "idx", "family", "verdict", "reason", "detail", "missing",
                "oracle_reward", "max_control_reward", "max_control_agent", "margin", "retried", "n_attempts")
ATTEMPT_COLUMNS = ("phase", "task_id", "agent", "role", "sample", "attempt", "superseded", "status", "reward",
                   "as_expected")
#: Rows of the task table per page.
PAGE_ROWS = 1000
ROLE_RANK = {role: i for i, role in enumerate(ROLES)}


def _identity(root: Path, name: str) -> tuple:
    st = os.stat(resolve_inside(root, [name]))
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=32)
def _read(root: Path, name: str, columns: tuple[str, ...] | None, identity: tuple) -> pa.Table:
    with open_inside(root, [name]) as fh:
        pf = pq.ParquetFile(fh)
        present = [c for c in columns if c in pf.schema_arrow.names] if columns else None
        return pf.read(columns=present)


def read(root: Path, name: str, columns: Sequence[str] | None = None) -> pa.Table:
    """`name` (a Parquet file of the run) with these columns, from the cache when unchanged."""
    return _read(root, name, tuple(columns) if columns else None, _identity(root, name))


def attempt_to_verdict_phase(summary: RunSummary) -> dict[str, str]:
    """Which verdict phase each attempt phase is judged in (run.json's groups)."""
    return {a: g.phase for g in summary.groups for a in g.attempt_phases}


def _verdict_phase(attempts: pa.Table, summary: RunSummary) -> pa.Array:
    mapping = attempt_to_verdict_phase(summary)
    keys = sorted(mapping)
    where = pc.index_in(attempts.column("phase"), value_set=pa.array(keys, pa.string()))
    mapped = pa.array([mapping[k] for k in keys], pa.string()).take(where)
    return pc.coalesce(mapped, attempts.column("phase"))


def final_attempts(root: Path, summary: RunSummary) -> pa.Table:
    """The final (not superseded) attempts' small columns, with the verdict phase as ``vphase``."""
    a = read(root, ATTEMPTS, ATTEMPT_COLUMNS)
    a = a.filter(pc.invert(a.column("superseded")))
    return a.append_column("vphase", _verdict_phase(a, summary))


@dataclass(frozen=True)
class TaskFilter:
    """The run page's filters (query parameters); None: any."""

    phase: str | None = None
    family: str | None = None
    verdict: str | None = None
    agent: str | None = None
    outcome: str | None = None  # "expected" or "unexpected": the agent's (or any agent's) final attempts
    page: int = 1


def _eq(table: pa.Table, column: str, value: str | None) -> pa.Table:
    return table if value is None else table.filter(pc.equal(table.column(column), value))


def _join(tasks: pa.Table, right: pa.Table) -> pa.Table:
    """Task rows × `right`'s rows with the same (verdict phase, task id), `right`'s other columns
    appended. Arrow joins no list column (``missing``), so the join is on the keys and a row number."""
    keys = tasks.select(["phase", "task_id"]).append_column(
        "_row", pa.array(range(tasks.num_rows), pa.int64())
    )
    joined = keys.join(right, keys=["phase", "task_id"], right_keys=["vphase", "task_id"], join_type="inner")
    out = tasks.take(joined.column("_row"))
    for name in right.column_names:
        if name not in ("vphase", "task_id"):
            out = out.append_column(name, joined.column(name))
    return out


def filter_tasks(tasks: pa.Table, final: pa.Table, f: TaskFilter) -> pa.Table:
    """The task rows that pass `f`, sorted by phase and idx; with an agent, one row per task and
    sample carrying that agent's ``a_status``, ``a_reward``, ``a_expected``, ``a_sample``."""
    t = _eq(_eq(_eq(tasks, "phase", f.phase), "family", f.family), "verdict", f.verdict)
    if f.agent is not None:
        mine = final.filter(pc.equal(final.column("agent"), f.agent))
        right = mine.select(["vphase", "task_id", "sample", "status", "reward",
                             "as_expected"]).rename_columns(
            ["vphase", "task_id", "a_sample", "a_status", "a_reward", "a_expected"])
        t = _join(t, right)
        if f.outcome is not None:
            t = t.filter(pc.equal(t.column("a_expected"), f.outcome == "expected"))
    elif f.outcome is not None:
        every = final.group_by(["vphase", "task_id"]).aggregate([("as_expected", "all")])
        t = _join(t, every)
        t = t.filter(pc.equal(t.column("as_expected_all"), f.outcome == "expected"))
    order = [("phase", "ascending"), ("idx", "ascending"), ("task_id", "ascending")]
    if "a_sample" in t.column_names:
        order.append(("a_sample", "ascending"))
    return t.sort_by(order)


def page_of(table: pa.Table, page: int) -> tuple[list[dict], int]:
    """The rows of page `page` (1-based, clamped) and the page number shown."""
    pages = max(1, -(-table.num_rows // PAGE_ROWS))
    page = min(max(page, 1), pages)
    return table.slice((page - 1) * PAGE_ROWS, PAGE_ROWS).to_pylist(), page


@dataclass(frozen=True)
class AgentRow:
    agent: str
    role: str
    final: int
    as_expected: int
    statuses: list[tuple[str, int]]
    reward_mean: float | None


def agent_rows(final: pa.Table) -> list[AgentRow]:
    """Per agent over the final attempts: role, count, as expected, outcomes, mean reward."""
    by = final.group_by(["agent", "role"]).aggregate(
        [("as_expected", "sum"), ("agent", "count"), ("reward", "mean")]).to_pylist()
    statuses: dict[str, list[tuple[str, int]]] = {}
    for r in sorted(final.group_by(["agent", "status"]).aggregate([("agent", "count")]).to_pylist(),
                    key=lambda r: (r["agent"], r["status"])):
        statuses.setdefault(r["agent"], []).append((r["status"], r["agent_count"]))
    rows = [AgentRow(agent=r["agent"], role=r["role"], final=r["agent_count"],
                     as_expected=r["as_expected_sum"] or 0, statuses=statuses.get(r["agent"], []),
                     reward_mean=r["reward_mean"]) for r in by]
    return sorted(rows, key=lambda r: (ROLE_RANK.get(r.role, 9), r.agent, r.role))


def distinct(table: pa.Table, column: str) -> list[str]:
    return sorted(v for v in pc.unique(table.column(column)).to_pylist() if v is not None)


def task_row(root: Path, phase: str, task_id: str) -> dict | None:
    """The task's verdict row, every column (findings and meta included)."""
    t = read(root, TASKS)
    t = t.filter(pc.and_(pc.equal(t.column("phase"), phase), pc.equal(t.column("task_id"), task_id)))
    return t.to_pylist()[0] if t.num_rows else None


def task_attempts(root: Path, phases: Sequence[str], task_id: str) -> list[dict]:
    """Every attempt (superseded included) of `task_id` in these attempt phases, whole rows,
    read from only the row groups that hold them; ordered by role, agent, sample, try."""
    keys = read(root, ATTEMPTS, ("phase", "task_id"))
    hit = pc.and_(pc.equal(keys.column("task_id"), task_id),
                  pc.is_in(keys.column("phase"), pa.array(phases, pa.string())))
    rows = pc.indices_nonzero(hit).to_pylist()
    if not rows:
        return []
    with open_inside(root, [ATTEMPTS]) as fh:
        pf = pq.ParquetFile(fh)
        starts, n = [], 0
        for i in range(pf.num_row_groups):
            starts.append(n)
            n += pf.metadata.row_group(i).num_rows
        groups = sorted({bisect.bisect_right(starts, r) - 1 for r in rows})
        table = pf.read_row_groups(groups)
    table = table.filter(pc.and_(pc.equal(table.column("task_id"), task_id),
                                 pc.is_in(table.column("phase"), pa.array(phases, pa.string()))))
    out = table.to_pylist()
    return sorted(out, key=lambda a: (ROLE_RANK.get(a["role"], 9), a["agent"], a["phase"], a["sample"],
                                      a["attempt"]))
