"""The report of a run directory, for reviewers: Markdown and one self-contained HTML.

Rendered from sealed evidence alone, as a pure function of it: the files a report reads are
named in its ``report.json`` (``ledgers``: path → sha256; the contract, run.json, the three
Parquet ledgers, the frozen and variant contracts, the smoke results that existed), nothing
else is read (no clock, no other run directory), and ``renderer`` names this module's
version. So `validate audit` renders every report again from those files and demands the
stored report.md, report.html and report.json byte for byte (`validate.audit.reports`).
Its first line is the dataset verdict; every count carries its denominator; the claim is
scoped to the machine, architecture, backend and image the run used. Each report is a new
entry ``reports/<UTC time>/``. Agent-provided text (replies, stderr, error messages) is
escaped for Markdown and HTML alike.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field

from validate.core.paths import REPORT_HTML, REPORT_JSON, REPORT_MD, RunPaths
from validate.core.plot import box_plot_svg
from validate.core.records import (
    COMPATIBLE,
    CONTROL,
    EXCEPTION_STATUSES,
    INCOMPLETE,
    NO_REFERENCE_SOLUTION,
    ROLES,
    SCORER_ERROR,
)
from validate.core.render import Bold, to_html, to_markdown
from validate.evidence.journal import atomic_write, file_sha256, new_entry, write_checksums

# The run's evidence is loaded below the report (`validate.evidence.run`), where the audit and
# ``eval freeze`` read it too.
from validate.evidence.run import RunEvidence, current_verdict, load_run, report_inputs
from validate.evidence.summary import hack_claim
from validate.evidence.verdicts import DatasetVerdict


def count_rows(ev: RunEvidence) -> list[list[str]]:
    """The Counts table: every number the report states about tasks and attempts."""
    c = ev.summary.counts
    n = c.tasks
    rows = [["tasks judged", str(n)],
            ["compatible", _of(c.compatible, n)],
            ["excluded", _of(c.excluded, n)],
            ["incomplete", _of(c.incomplete, n)]]
    rows += [[f"excluded: {r}", _of(k, n)] for r, k in c.excluded_by_reason.items()]
    if ev.frozen is not None:
        rows.append(["frozen for the controls", _of(len(ev.frozen["tasks"]), n)])
    rows += [["passed only after a retry", _of(c.retried_passes, c.compatible)],
             ["attempts (all, superseded included)", str(c.attempts)],
             ["superseded attempts", _of(c.superseded, c.attempts)],
             ["attempts with an exception", _of(c.exceptions, c.attempts)]]
    return rows


def _of(k: int, n: int) -> str:
    return f"{k}/{n}" + (f" ({100 * k / n:.1f} %)" if n else "")


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return "—"
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def _agents_in_order(final: pd.DataFrame) -> list[str]:
    rank = {role: i for i, role in enumerate(ROLES)}
    roles = final.groupby("agent")["role"].first()
    return sorted(roles.index, key=lambda a: (rank.get(roles[a], 9), a))


def _claim(ev: RunEvidence, verdict: DatasetVerdict) -> str:
    s, m = ev.summary, ev.manifest
    mach, ex = s.machine, m["execution"]
    c = s.counts
    where = (f"{mach.os or mach.system}, Linux {mach.kernel}, {mach.architecture}, {mach.cpus} cores, "
             f"{mach.memory_gib} GiB; backend {ex['backend']} ({ex['backend_version']}), image {ex['image']} "
             f"{ex['image_digest']}, network {ex['network']}, user {ex['user']}")
    rule = m["expectations"]["exception_rule"]
    retry = (f"; exception rule retry: {c.retried_passes} of them passed only after an infrastructure retry"
             if rule == "retry"
             else "; exception rule strict: no task with any infrastructure exception counts")
    repeats = m["expectations"].get("oracle_repeats", 1)
    each = f" on each of its {repeats} repeats" if repeats > 1 else ""
    return (f"Claim (scoped): {_of(c.compatible, c.tasks)} tasks of contract {m['name']} ({s.kind}) passed — "
            f"the oracle reached reward ≥ {m['expectations']['pass_threshold']}{each} and every negative "
            f"control the contract names stayed under its ceiling, all in this run{retry} — on "
            f"{where}.{_certified(c)}{hack_claim(c, m)} Dataset verdict {verdict.verdict}. This is evidence "
            "for that execution profile only.")


def _certified(c) -> str:
    """What the claim says of tasks without a reference solution, when the run has any: how
    many tasks are oracle-certified and how many runtime-tested only (no oracle; every control
    rejected), each over every task judged. (Said only then, so a report of a run without
    such a task keeps its bytes.)"""
    runtime = c.excluded_by_reason.get(NO_REFERENCE_SOLUTION, 0)
    if not runtime:
        return ""
    return (f" {_of(c.compatible, c.tasks)} oracle-certified, {_of(runtime, c.tasks)} runtime-tested only "
            "(no reference solution: every control rejected, no oracle played; excluded as "
            "no_reference_solution, never counted as passed).")


def _contract_rows(ev: RunEvidence) -> list[list[str]]:
    m = ev.manifest
    exp = m["expectations"]
    agents = [f"{n} ({a['role']}{', ceiling ' + str(a['ceiling']) if a['ceiling'] is not None else ''})"
              for n, a in exp["agents"].items()]
    rows = [["manifest", f"{m['name']} {m['sha256']}"], ["parent manifest", _fmt(m.get("parent_sha256"))],
            ["environment", f"{m['environment']['name']}, revision {m['environment']['revision']}"],
            ["config", ", ".join(f"{k}={v}" for k, v in sorted(m["environment"]["config"].items()))],
            ["scorer", json.dumps(m["environment"]["scorer"], sort_keys=True)],
            ["selection", f"{m['selection']['rule']}; {len(m['tasks'])} tasks"],
            ["task list sha256", m["task_list_sha256"]], ["agents", "; ".join(agents)],
            ["pass threshold", str(exp["pass_threshold"])], ["exception rule", exp["exception_rule"]],
            *([["oracle repeats", f"{exp['oracle_repeats']} (every repeat must pass)"]]
              if exp.get("oracle_repeats", 1) > 1 else []),
            ["minimum task count", str(m["min_task_count"])],
            ["limits", ", ".join(f"{k}={v}" for k, v in sorted(m["execution"]["limits"].items()))],
            ["harness", f"version {m['harness_version']}, frozen at {m['git_commit']}; ran at "
                        f"{ev.summary.code_commit}"]]
    if ev.frozen is not None:
        rows.append(["frozen child", f"{ev.frozen['name']} {ev.frozen['sha256']}"])
    rows += [[f"variant {k}", f"{v['name']} {v['sha256']}; {len(v['tasks'])} tasks"]
             for k, v in ev.variants.items()]
    return rows


def _reward_blocks(ev: RunEvidence) -> list:
    final = ev.attempts[~ev.attempts["superseded"]]
    rows, series = [], []
    for agent in _agents_in_order(final):
        g = final[final["agent"] == agent]
        r = g["reward"].fillna(0.0)
        rows.append([agent, str(g["role"].iloc[0]), _of(int(g["as_expected"].sum()), len(g)),
                     f"{r.min():.4f}", f"{statistics.median(r):.4f}", f"{r.max():.4f}"])
        series.append((agent, str(g["role"].iloc[0]), r.tolist()))
    exp = ev.manifest["expectations"]
    ceilings = {n: a["ceiling"] for n, a in exp["agents"].items() if a["role"] == CONTROL
                and a["ceiling"] is not None}
    margins = ev.tasks["margin"].dropna()
    statuses = final.groupby(["agent", "status"]).size()
    out = [("h2", "Rewards per agent (final attempts)"),
           ("table", ["agent", "role", "as expected", "min", "median", "max"], rows),
           ("svg", box_plot_svg(series, exp["pass_threshold"], ceilings), "Reward per agent: box plot"),
           ("h2", "Margins (oracle reward minus the best control's, per task)"),
           ("p", [f"Minimum margin over the run: {_fmt(float(margins.min())) if len(margins) else '—'}; "
                  f"median {_fmt(float(margins.median())) if len(margins) else '—'}; over {len(margins)} "
                  "tasks with both."]),
           ("table", ["task", "margin", "oracle", "best control", "control"],
            [[r.task_id, _fmt(r.margin), _fmt(r.oracle_reward), _fmt(r.max_control_reward),
              _fmt(r.max_control_agent)]
             for r in ev.tasks.dropna(subset=["margin"]).nsmallest(10, "margin").itertuples()]),
           ("h2", "Attempt outcomes"),
           ("table", ["agent", "status", "attempts"], [[a, st, str(k)] for (a, st), k in statuses.items()])]
    return out


def _family_blocks(ev: RunEvidence) -> list:
    t = ev.tasks
    fam = t.groupby("family").agg(tasks=("task_id", "size"),
                                 compatible=("verdict", lambda v: int((v == COMPATIBLE).sum())),
                                 oracle=("oracle_reward", "mean"), margin=("margin", "min"))
    missing = ev.summary.families_uncovered
    cover = ("The environment does not list its families, so coverage is not stated." if missing is None else
             f"Families the selection did not cover: {', '.join(missing)}." if missing else
             "The selection covers every family the environment can produce.")
    return [("h2", "Per family"),
            ("table", ["family", "compatible / tasks", "mean oracle reward", "min margin"],
             [[f, _of(int(r.compatible), int(r.tasks)), _fmt(float(r.oracle)), _fmt(float(r.margin))]
              for f, r in fam.iterrows()]),
            ("p", [cover])]


def _ledger_blocks(ev: RunEvidence) -> list:
    s, n = ev.summary, ev.summary.counts.tasks
    excl, incomplete = ev.exclusions, ev.tasks[ev.tasks["verdict"] == INCOMPLETE]
    out = [("h2", "Exclusion ledger"),
           ("p", [f"{_of(len(excl), n)} tasks excluded, one reason each." if len(excl)
                  else "No task was excluded."])]
    if len(excl):
        out.append(("table", ["task", "reason", "detail"],
                    [[r.task_id, r.reason, r.detail] for r in excl.itertuples()]))
    out.append(("h2", "Incomplete tasks"))
    if len(incomplete):
        out += [("p", [f"{_of(len(incomplete), n)} tasks lack evidence"
                       + (f": {s.facts.note}." if s.facts.note else ".")]),
                ("table", ["task", "missing"],
                 [[r.task_id, ", ".join(r.missing)] for r in incomplete.head(200).itertuples()])]
    else:
        out.append(("p", ["None: every task has a final verdict."]))
    out.append(("h2", "Patches"))
    if s.patch is not None:
        out.append(("p", [f"The code ran with an uncommitted patch on {s.patch.base_commit}: patch.diff, "
                          f"sha256 {s.patch.sha256}, files {', '.join(s.patch.files)}."]))
    else:
        out.append(("p", [f"None: the code that ran is commit {s.code_commit}."]))
    patched = [(r.task_id, f["detail"]) for r in ev.tasks.itertuples()
               for f in _findings(r) if f["kind"] == "patched"]
    if patched:
        out += [("p", [f"{_of(len(patched), n)} tasks were patched offline before they were frozen (the "
                       "contract holds the patched hashes):"]),
                ("table", ["task", "patch"], [list(x) for x in patched])]
    if ev.manifest.get("patch"):
        p = ev.manifest["patch"]
        out.append(("p", [f"The contract was frozen with a patch on {p['base_commit']}: sha256 "
                          f"{p['sha256']}, files {', '.join(p['files'])}."]))
    return out


def _findings(row) -> list:
    """A task row's findings (a Parquet list of structs; absent in an old ledger)."""
    found = getattr(row, "findings", None)
    return [] if found is None else list(found)


def _attempt_blocks(ev: RunEvidence) -> list:
    a = ev.attempts
    bad = a[a["superseded"] | a["status"].isin([*EXCEPTION_STATUSES, SCORER_ERROR])]
    out = [("h2", "Superseded and failed attempts")]
    if len(bad):
        out.append(("table", ["task", "agent", "try", "status", "superseded", "error"],
                    [[r.task_id, r.agent, str(r.attempt), r.status, str(r.superseded), _fmt(r.error_message)]
                     for r in bad.head(200).itertuples()]))
    else:
        out.append(("p", ["None: every attempt is final and exception-free."]))
    return out


def blocks(ev: RunEvidence) -> list:
    s = ev.summary
    verdict = current_verdict(ev.summary, ev.smokes)
    doc = [("h1", f"Validation report — {s.environment}, run {s.run_id}"),
           ("p", [Bold(verdict.headline)]),
           ("p", [_claim(ev, verdict)])]
    if s.interrupted:
        doc.append(("p", [Bold("This run was interrupted: its evidence is INCOMPLETE; resume "
                               "it with --resume.")]))
    doc += [("h2", "Protocol criteria"),
            ("table", ["criterion", "status", "detail"],
             [[c.name, c.status, c.detail] for c in verdict.criteria]),
            ("h2", "Counts"), ("table", ["what", "count"], count_rows(ev)),
            ("h2", "Contract"), ("table", ["field", "value"], _contract_rows(ev))]
    doc += _family_blocks(ev) + _reward_blocks(ev)
    if s.probes:
        ok = sum(p.ok for p in s.probes)
        doc += [("h2", "Partial-credit probes (pilot)"),
                ("p", [f"{_of(ok, len(s.probes))} probe attempts scored strictly between the controls' "
                       "median and the oracle's reward."]),
                ("table", ["variant", "task", "probe", "reward", "controls' median", "oracle", "ok"],
                 [[p.variant, p.task_id, p.probe, _fmt(p.reward), _fmt(p.control_typical),
                   _fmt(p.oracle_reward), "yes" if p.ok else Bold("NO")] for p in s.probes])]
    if s.strata:
        doc += [("h2", "Pilot strata"), ("table", ["stratum", "sampled / pool"],
                                         [[st.name, f"{len(st.sampled)}/{st.pool_tasks}"]
                                          for st in s.strata])]
    if s.dataset_findings:
        doc += [("h2", "Dataset findings"), ("table", ["finding", "blocking", "detail"],
                                             [[f.kind, str(f.blocking), f.detail]
                                              for f in s.dataset_findings])]
    doc += _ledger_blocks(ev) + _attempt_blocks(ev)
    doc.append(("h2", "Fresh-materialisation smoke test"))
    if ev.latest_smoke is not None:
        name, sm = ev.latest_smoke
        doc.append(("p", [f"{'PASSED' if sm['passed'] else 'FAILED'} (smoke/{name}, the latest of "
                          f"{len(ev.smokes)}): {sm['summary']}"]))
    else:
        doc.append(("p", ["Not run" + (": required for this kind of run, so the dataset "
                                       "verdict cannot be PASS."
                                       if "smoke" in s.required else ".")]))
    a = ev.attempts
    t0, t1 = a["started_at"].min(), a["finished_at"].max()
    span = (t1 - t0).total_seconds() if len(a) else 0.0
    doc += [("h2", "Timing"), ("p", [f"Attempts from {t0} to {t1} ({span:.0f} s of wall time, "
                                     f"{len(a) / max(span, 1e-9):.2f} attempts/s)."])]
    return doc


# --- rendering (validate.core.render) -------------------------------------------------------

STYLE = ("body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}"
         "table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem;"
         "text-align:left;vertical-align:top;font-size:.9rem}th{background:#f3f3f3}svg{max-width:100%}")


#: This renderer's version, recorded in each report.json. The audit re-renders a report with
#: the renderer it names and knows only this one: bump it whenever a change here (or in
#: `validate.core.plot`, `validate.evidence.verdicts`' headlines) changes a byte of a report, so an older
#: report fails the audit by name instead of by a puzzling difference.
RENDERER = "run-report/2"


class ReportRecord(BaseModel):
    """report.json: what a report states, and exactly what it was rendered from."""

    renderer: str = Field(description="The renderer's version (`RENDERER` when written).")
    dataset_verdict: DatasetVerdict
    counts: list[list[str]]
    ledgers: dict[str, str] = Field(description="Each file the report was rendered from (relative to the run "
                                                "directory) → its sha256.")


def render(src: Path, names: list[str]) -> dict[str, bytes]:
    """report.md, report.html and report.json of the evidence `names` under `src` (the run
    directory, or the copy of a report's inputs kept at a resume): a pure function of them."""
    ev = load_run(Path(src), sorted(names))
    doc = blocks(ev)
    record = ReportRecord(renderer=RENDERER, dataset_verdict=current_verdict(ev.summary, ev.smokes),
                          counts=count_rows(ev),
                          ledgers={n: file_sha256(Path(src) / n) for n in sorted(names)})
    return {REPORT_MD: to_markdown(doc).encode(),
            REPORT_HTML: to_html(doc, "Validation report", STYLE).encode(),
            REPORT_JSON: record.model_dump_json(indent=2).encode() + b"\n"}


def write_report(root: Path) -> tuple[Path, DatasetVerdict]:
    """Write a new report entry; return its directory and the verdict it states."""
    paths = RunPaths(Path(root))
    files = render(paths.root, report_inputs(paths.root))
    entry = new_entry(paths.reports)
    for name, data in files.items():
        atomic_write(entry / name, data)
    write_checksums(paths)
    return entry, ReportRecord.model_validate_json(files[REPORT_JSON]).dataset_verdict
