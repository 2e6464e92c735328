"""`validate compare-profiles RUN_A RUN_B`: one dataset contract on two execution profiles.

Success under one profile does not show that a task works under another (rootful docker,
rootless podman, gVisor, bwrap). Two finished dataset runs compare when their contracts say
the same thing about *what* is validated — the environment (its config, revision and
scorer), the selection, every task's id, hash and skips, the expectations, the minimum count
and the salt the tasks were drawn with (`validate freeze --like` makes such a contract for
another profile) — and differ in *how* it ran: their execution profiles. A refusal names
the first field that differs.

The comparison lists every execution field that differs (both profiles' facts), each side's
counts with explicit denominators and dataset verdict, and every task whose verdict or
reason differs, with both sides' evidence (detail, oracle reward, the highest control).
It is written as a new entry under ``--out`` (by default
``ledgers/compare-profiles/<A>--<B>/<UTC time>/``): compare.md, compare.html and
compare.json, sealed with checksums. compare.json names the renderer's version and each file
of A and B it was computed from (``A/run.json`` → sha256 …); `comparison` and `render` are
pure functions of those files, so the audit computes and renders the entry again and demands
all three files byte for byte (`validate.audit.reports`).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from validate.core.errors import ValidateError
from validate.core.jsonio import field_differences
from validate.core.paths import (
    COMPARE_HTML,
    COMPARE_JSON,
    COMPARE_MD,
    LEDGER_DIR,
    MANIFEST,
    SUMMARY,
    TASKS,
    RunPaths,
)
from validate.core.records import PILOT
from validate.core.render import to_html, to_markdown
from validate.eval.render import STYLE  # the comparisons' one stylesheet
from validate.evidence.journal import atomic_write, file_sha256, new_entry, write_checksums
from validate.evidence.run import RunEvidence, load_run

#: Manifest fields two compared runs must share: what is validated, and how it is judged.
MUST_MATCH = ("environment", "selection", "tasks", "task_list_sha256", "expectations", "min_task_count",
              "salt")
#: What the comparison is computed from, in each run directory.
INPUTS = (MANIFEST, SUMMARY, TASKS)
#: This renderer's version; the audit knows only this one (bump it whenever a change here
#: changes a byte of a comparison).
RENDERER = "profiles/1"


class Side(BaseModel):
    """One run: its contract, where it ran, what it concluded."""

    run_id: str = Field(description="The run directory's name.")
    kind: str = Field(description="run, pool or pilot.")
    manifest_sha256: str = Field(description="Its contract.")
    backend: str = Field(description="The sandbox backend.")
    dataset_verdict: str = Field(description="Its dataset verdict.")
    tasks: int = Field(description="Tasks judged (the denominator).")
    verdicts: dict[str, int] = Field(description="Tasks by verdict.")
    reasons: dict[str, int] = Field(description="Excluded tasks by reason.")


class TaskDifference(BaseModel):
    """A task whose verdict or reason differs between the two runs."""

    task_id: str
    family: str
    a: tuple[str, str, str] = Field(description="A's (verdict, reason, detail).")
    b: tuple[str, str, str] = Field(description="B's (verdict, reason, detail).")
    oracle_reward: tuple[float | None, float | None] = Field(description="The oracle's reward in A and B.")
    top_control: tuple[str, str] = Field(description="The highest control and its reward, in A and B.")


class ProfileComparison(BaseModel):
    a: Side
    b: Side
    dataset: dict[str, str] = Field(description="The shared contract's environment, revision and task list.")
    profile: list[tuple[str, str, str]] = Field(description="(execution field, A's value, B's value) of "
                                                            "every execution-profile field that differs.")
    same: int = Field(description="Tasks with the same verdict and reason in both runs.")
    differences: list[TaskDifference] = Field(description="Every task whose verdict or reason differs.")
    renderer: str = Field(description="The renderer's version (`RENDERER` when written).")
    ledgers: dict[str, str] = Field(description="Each file of A and B it was computed from → its sha256.")


def _value(doc: dict, field: str) -> Any:
    value: Any = doc
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _check(a: RunEvidence, b: RunEvidence) -> list[str]:
    """The execution fields that differ; refused when anything that says what is validated does."""
    for field in field_differences(a.manifest, b.manifest):
        if field.split(".")[0] in MUST_MATCH:
            raise ValidateError(f"compare-profiles: the contracts differ in {field} (A: "
                                f"{_value(a.manifest, field)!r}, B: {_value(b.manifest, field)!r}); only "
                                "runs of the same dataset contract on two profiles compare (make B's with "
                                "`validate freeze --like A's manifest`)")
    return field_differences(a.manifest.get("execution", {}), b.manifest.get("execution", {}))


def _text(x: object) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def _top_control(r: Any) -> str:
    return f"{_text(r['max_control_agent'])} {_text(r['max_control_reward'])}".strip()


def _reward(x: Any) -> float | None:  # a table cell: None, NaN or a number
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _side(ev: RunEvidence) -> Side:
    s = ev.summary
    reasons = Counter(_text(r) for r in ev.tasks["reason"] if _text(r))
    return Side(run_id=s.run_id, kind=s.kind, manifest_sha256=s.manifest_sha256, backend=s.backend,
                dataset_verdict=s.dataset_verdict.verdict, tasks=len(ev.tasks),
                verdicts=dict(sorted(Counter(ev.tasks["verdict"]).items())),
                reasons=dict(sorted(reasons.items())))


def _rows(ev: RunEvidence) -> dict[str, dict]:
    """One row per task: the run's own phase's verdict (a pool's, a run's; a pilot keeps each variant)."""
    return {f"{r['phase']}\n{r['task_id']}" if ev.summary.kind == PILOT else r["task_id"]: r
            for r in ev.tasks.to_dict("records")}


def comparison(run_a: Path, run_b: Path) -> ProfileComparison:
    """The comparison of two finished dataset runs from their evidence alone."""
    a, b = load_run(run_a), load_run(run_b)
    profile = _check(a, b)
    ra, rb = _rows(a), _rows(b)
    if sorted(ra) != sorted(rb):
        raise ValidateError(f"compare-profiles: {a.summary.run_id} and {b.summary.run_id} judged different "
                            f"task sets ({len(ra)} and {len(rb)} rows): compare two runs of the same kind")
    diffs, same = [], 0
    for key in sorted(ra):
        x, y = ra[key], rb[key]
        if (x["verdict"], _text(x["reason"])) == (y["verdict"], _text(y["reason"])):
            same += 1
            continue
        diffs.append(TaskDifference(
            task_id=key.replace("\n", " / "), family=_text(x["family"]),
            a=(x["verdict"], _text(x["reason"]), _text(x["detail"])),
            b=(y["verdict"], _text(y["reason"]), _text(y["detail"])),
            oracle_reward=(_reward(x["oracle_reward"]), _reward(y["oracle_reward"])),
            top_control=(_top_control(x), _top_control(y))))
    ex_a, ex_b = a.manifest.get("execution", {}), b.manifest.get("execution", {})
    env = a.manifest.get("environment", {})
    ledgers = {f"{side}/{n}": file_sha256(Path(d) / n) for side, d in (("A", run_a), ("B", run_b))
               for n in INPUTS}
    return ProfileComparison(
        a=_side(a), b=_side(b),
        dataset={"environment": str(env.get("name")), "revision": str(env.get("revision")),
                 "task_list_sha256": str(a.manifest.get("task_list_sha256"))},
        profile=[(f, _short(_value(ex_a, f)), _short(_value(ex_b, f))) for f in profile],
        same=same, differences=diffs, renderer=RENDERER, ledgers=ledgers)


def _short(value: Any, cap: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= cap else text[:cap] + " …"


def _counts(s: Side) -> str:
    verdicts = ", ".join(f"{n}/{s.tasks} {v}" for v, n in s.verdicts.items())
    reasons = ", ".join(f"{n} {r}" for r, n in s.reasons.items()) or "none"
    return f"{verdicts}; excluded by reason: {reasons}"


def blocks(c: ProfileComparison) -> list:
    total = c.a.tasks
    return [("h1", f"Profiles — {c.a.run_id} (A, {c.a.backend}) vs {c.b.run_id} (B, {c.b.backend})"),
            ("p", [f"The same dataset contract ({c.dataset['environment']}, revision "
                   f"{c.dataset['revision']}, task list {c.dataset['task_list_sha256']}) on two execution "
                   f"profiles: contracts {c.a.manifest_sha256} (A) and {c.b.manifest_sha256} (B)."]),
            ("p", [f"{c.same}/{total} tasks got the same verdict and reason on both profiles; "
                   f"{len(c.differences)}/{total} differ."]),
            ("h2", "The two profiles (execution fields that differ)"),
            ("table", ["field", "A", "B"], [list(p) for p in c.profile] or [["none", "", ""]]),
            ("h2", "Each run"),
            ("table", ["", "A", "B"], [["run", c.a.run_id, c.b.run_id], ["kind", c.a.kind, c.b.kind],
                                       ["dataset verdict", c.a.dataset_verdict, c.b.dataset_verdict],
                                       ["tasks", _counts(c.a), _counts(c.b)]]),
            ("h2", "Tasks whose verdict or reason differs"),
            ("table", ["task", "family", "A", "B", "oracle reward A / B", "top control A / B"],
             [[d.task_id, d.family, " — ".join(p for p in d.a if p), " — ".join(p for p in d.b if p),
               " / ".join("—" if r is None else f"{r:.4f}" for r in d.oracle_reward),
               " / ".join(d.top_control)]
              for d in c.differences] or [["none", "", "", "", "", ""]])]


def render(c: ProfileComparison) -> dict[str, bytes]:
    """The entry's three files, from the comparison alone."""
    doc = blocks(c)
    return {COMPARE_MD: to_markdown(doc).encode(),
            COMPARE_HTML: to_html(doc, "Profile comparison", STYLE).encode(),
            COMPARE_JSON: c.model_dump_json(indent=2).encode() + b"\n"}


def compare_profiles(run_a: Path, run_b: Path, out: Path | None = None) -> tuple[ProfileComparison, Path]:
    """The comparison of two runs, and the new entry it was written to."""
    result = comparison(run_a, run_b)
    where = (
        out if out is not None else LEDGER_DIR / "compare-profiles" / f"{result.a.run_id}--{result.b.run_id}"
    )
    entry = new_entry(where)
    for name, data in render(result).items():
        atomic_write(entry / name, data)
    write_checksums(RunPaths(entry))  # the entry is sealed as a run directory is
    return result, entry


def entries_naming(root: Path) -> list[Path]:
    """Profile comparisons beside this run (``../compare-profiles/*--*/<t>/``) whose pair names it."""
    parent = root.parent / "compare-profiles"
    if not parent.is_dir():
        return []
    pairs = sorted(d for d in parent.iterdir() if d.is_dir() and root.name in d.name.split("--"))
    return [e for d in pairs for e in sorted(d.iterdir()) if e.is_dir()]
