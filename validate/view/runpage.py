"""The page of one run: headline verdict and criteria, the per-task table with its filters
(phase, family, verdict, agent and the agent's outcome, as query parameters, so a filtered
view is a link), the exclusion ledger, incomplete tasks, agents, probes, related runs,
smoke tests, reports and the contract.

It reads only the small columns (`validate.view.tables`): never a reply, stdout or stderr.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow.compute as pc

from validate.core.paths import (
    ATTEMPTS,
    CHECKSUMS,
    EXCLUSIONS,
    FROZEN_MANIFEST,
    MANIFEST,
    PATCH,
    REPORTS,
    SIGNATURE,
    SMOKE,
    SMOKE_RESULT,
    SUMMARY,
    TASKS,
    VARIANTS,
)
from validate.core.records import INCOMPLETE, POOL, VERDICTS
from validate.eval.report import headline
from validate.view import tables
from validate.view.catalog import EvalEntry, RunEntry, is_plain_file
from validate.view.markup import Html, a, badge, join, num, page, table, tag, text, tone, url
from validate.view.pages import file_url, kv, related, run_link, run_url, short, task_url, when

#: The cap on rows of the ledger tables (the task table pages instead).
LEDGER_ROWS = tables.PAGE_ROWS
OUTCOMES = ("expected", "unexpected")


def _cards(e: RunEntry) -> Html:
    c = e.summary.counts
    items = [("tasks", c.tasks), ("compatible", c.compatible), ("excluded", c.excluded),
             ("incomplete", c.incomplete), ("attempts", c.attempts), ("superseded", c.superseded),
             ("with an exception", c.exceptions)]
    return Html('<div class="cards">' + "".join(f'<div class="card"><b>{n}</b><span>{text(k)}</span></div>'
                                                for k, n in items) + "</div>")


def _head(e: RunEntry) -> list[object]:
    s, v = e.summary, e.verdict
    out: list[object] = [
        tag("h1", e.key),
        tag("p", f"{s.kind} · {s.environment} · contract {e.contract.name if e.contract else '—'} "
                 f"{short(s.manifest_sha256)} · {s.backend} · {when(s.started_at)} → {when(s.finished_at)}",
            class_="sub"),
        tag("div", badge(v.verdict), " ", v.headline, class_=f"headline v-{tone(v.verdict)}")]
    if s.interrupted:
        out.append(tag("p", "This run was interrupted: its evidence is incomplete (resume it with --resume).",
                       class_="warn"))
    toc = [("tasks", "Tasks"), ("ledger", "Exclusion ledger"), ("incomplete", "Incomplete"),
           ("agents", "Agents"), ("related", "Related runs"), ("reports", "Reports and files"),
           ("contract", "Contract")]
    out += [_cards(e), Html('<nav class="toc">' + "".join(a(t, f"#{i}") for i, t in toc) + "</nav>")]
    return out


def _criteria(e: RunEntry) -> list[object]:
    return [tag("h2", "Protocol criteria", id="criteria"),
            table(["criterion", "status", "detail"],
                  [[c.name, badge(c.status), c.detail] for c in e.verdict.criteria])]


def _select(name: str, label: str, options: list[str], chosen: str | None) -> Html:
    opts = [tag("option", "any", value="")] + [tag("option", o, value=o,
                                                   selected="selected" if o == chosen else None)
                                               for o in options]
    return tag("label", label, Html(f'<select name="{name}">{join(opts)}</select>'))


def _filter_form(e: RunEntry, f: tables.TaskFilter, phases: list[str], families: list[str],
                 agents: list[str]) -> Html:
    fields = [_select("phase", "phase", phases, f.phase)] if len(phases) > 1 else []
    fields += [_select("family", "family", families, f.family),
               _select("verdict", "verdict", list(VERDICTS), f.verdict),
               _select("agent", "agent", agents, f.agent),
               _select("outcome", "agent's outcome", list(OUTCOMES), f.outcome),
               tag("button", "Apply", type="submit"), a("reset", run_url(e.key) + "#tasks")]
    return Html('<form class="filters" method="get" '
                f'action="{text(run_url(e.key))}#tasks">{join(fields)}</form>')


def _task_rows(e: RunEntry, rows: list[dict], f: tables.TaskFilter, many_phases: bool) -> Html:
    heads = ["task", "idx"] + (["phase"] if many_phases else []) + ["family", "verdict", "reason", "oracle",
                                                                      "best control", "margin", "attempts"]
    samples = f.agent is not None and any(r["a_sample"] for r in rows)
    if f.agent is not None:
        heads += [f"{f.agent}: sample"] * samples + [f"{f.agent}: status", "reward", "as expected"]
    body, classes = [], []
    for r in rows:
        cells = [a(r["task_id"], task_url(e.key, r["phase"], r["task_id"]), class_="nw"), Html(str(r["idx"]))]
        cells += [r["phase"]] if many_phases else []
        cells += [r["family"], badge(r["verdict"]), r["reason"] or "", r["oracle_reward"],
                  tag("span", r["max_control_agent"], " ", num(r["max_control_reward"]), class_="nw")
                  if r["max_control_agent"] else None,
                  r["margin"], Html(str(r["n_attempts"]))]
        if f.agent is not None:
            cells += [Html(str(r["a_sample"]))] * samples + [r["a_status"], r["a_reward"],
                                                              badge("yes" if r["a_expected"] else "no")]
        body.append(cells)
        classes.append(f"v-{r['verdict']}")
    return table(heads, body, cls="tasks", row_classes=classes)


def _pager(e: RunEntry, f: tables.TaskFilter, page_no: int, total: int) -> Html:
    pages = max(1, -(-total // tables.PAGE_ROWS))
    if pages == 1:
        return Html("")
    query = {"phase": f.phase, "family": f.family, "verdict": f.verdict, "agent": f.agent,
             "outcome": f.outcome}
    links = [a(str(p), run_url(e.key, **query, page=p) + "#tasks") if p != page_no else tag("b", str(p))
             for p in range(1, pages + 1)]
    return tag("p", "page ", join(links, " "))


def _tasks_section(e: RunEntry, f: tables.TaskFilter, agent_rows: list[tables.AgentRow]) -> list[object]:
    tasks = tables.read(e.root, TASKS, tables.TASK_COLUMNS)
    final = tables.final_attempts(e.root, e.summary)
    chosen = tables.filter_tasks(tasks, final, f)
    rows, page_no = tables.page_of(chosen, f.page)
    phases = tables.distinct(tasks, "phase")
    shown = (f"{chosen.num_rows} of {tasks.num_rows} tasks" if f.agent is None
             else f"{chosen.num_rows} of {tasks.num_rows} tasks, each row with a final attempt of {f.agent}")
    return [
        tag("h2", "Tasks", id="tasks"),
        _filter_form(e, f, phases, tables.distinct(tasks, "family"), [r.agent for r in agent_rows]),
        tag(
            "p",
            shown
            + (
                f", rows {(page_no - 1) * tables.PAGE_ROWS + 1}–"
                f"{(page_no - 1) * tables.PAGE_ROWS + len(rows)}"
                if len(rows) < chosen.num_rows
                else ""
            ),
            class_="sub",
        ),
        _pager(e, f, page_no, chosen.num_rows),
        _task_rows(e, rows, f, len(phases) > 1) if rows else tag("p", "No task matches.", class_="muted"),
    ]


def _ledgers(e: RunEntry) -> list[object]:
    excl = tables.read(e.root, EXCLUSIONS, ("phase", "task_id", "idx", "reason", "detail"))
    n = e.summary.counts.tasks
    out: list[object] = [tag("h2", "Exclusion ledger", id="ledger")]
    if excl.num_rows:
        out += [tag("p", f"{excl.num_rows}/{n} tasks excluded, one reason each"
                         + (f" (the first {LEDGER_ROWS} shown)" if excl.num_rows > LEDGER_ROWS else "") + ".",
                    class_="sub"),
                table(["task", "phase", "reason", "detail"],
                      [[a(r["task_id"], task_url(e.key, r["phase"], r["task_id"])), r["phase"], r["reason"],
                        r["detail"]]
                       for r in excl.slice(0, LEDGER_ROWS).to_pylist()])]
    else:
        out.append(tag("p", "No task was excluded.", class_="muted"))
    tasks = tables.read(e.root, TASKS, tables.TASK_COLUMNS)
    inc = tasks.filter(pc.equal(tasks.column("verdict"), INCOMPLETE))
    out.append(tag("h2", "Incomplete tasks", id="incomplete"))
    if inc.num_rows:
        note = e.summary.facts.note
        out += [tag("p", f"{inc.num_rows}/{n} tasks lack evidence" + (f": {note}" if note else "") + ".",
                    class_="sub"),
                table(["task", "phase", "missing", "detail"],
                      [[a(r["task_id"], task_url(e.key, r["phase"], r["task_id"])), r["phase"],
                        ", ".join(r["missing"]), r["detail"]]
                       for r in inc.slice(0, LEDGER_ROWS).to_pylist()])]
    else:
        out.append(tag("p", "None: every task has a final verdict.", class_="muted"))
    return out


def _agents(e: RunEntry, rows: list[tables.AgentRow]) -> list[object]:
    body = [[a(r.agent, run_url(e.key, agent=r.agent) + "#tasks"), r.role, Html(f"{r.as_expected}/{r.final}"),
             a("not as expected", run_url(e.key, agent=r.agent, outcome="unexpected") + "#tasks")
             if r.as_expected < r.final else "", r.reward_mean, ", ".join(f"{s} {k}" for s, k in r.statuses)]
            for r in rows]
    out: list[object] = [tag("h2", "Agents (final attempts)", id="agents"),
                         table(["agent", "role", "as expected", "", "mean reward", "outcomes"], body)]
    s = e.summary
    if s.probes:
        out += [tag("h3", "Partial-credit probes"),
                table(["variant", "task", "probe", "reward", "controls' median", "oracle", "ok"],
                      [[p.variant, p.task_id, p.probe, p.reward, p.control_typical, p.oracle_reward,
                        badge("yes" if p.ok else "no")] for p in s.probes])]
    if s.strata:
        out += [tag("h3", "Pilot strata"), table(["stratum", "sampled / pool tasks", "sampled idx"],
                                                 [[st.name, f"{len(st.sampled)}/{st.pool_tasks}",
                                                   ", ".join(map(str, st.sampled))] for st in s.strata])]
    return out


def _evaluations(e: RunEntry, evals: Sequence[EvalEntry]) -> list[Html]:
    """The model evaluations of this run's set: its frozen child (a pool's) or its own contract."""
    mine = {c.sha256 for c in (e.frozen, e.contract) if c is not None}
    return [join(["evaluated: ", a(x.key, url(["eval", x.key])),
                  f" — {x.summary.model}, {headline(x.summary)}"])
            for x in evals if x.summary is not None and x.contract is not None
            and x.contract.parent.manifest_sha256 in mine]


def _related(e: RunEntry, runs: Mapping[str, RunEntry], evals: Sequence[EvalEntry] = ()) -> list[object]:
    items = []
    if e.parent_key is not None and e.parent_key in runs:
        items.append(join(["a smoke rerun of the pool ", run_link(runs[e.parent_key])]))
    items += [join([badge(o.verdict.verdict), " ", run_link(o),
                    f" — {o.summary.kind}, {label}, started {when(o.summary.started_at)}"])
              for o, label in related(e, runs)]
    items += _evaluations(e, evals)
    out: list[object] = [tag("h2", "Related runs", id="related"),
                         _list(items) if items else tag("p", "No other run shares a contract with this one.",
                                                        class_="muted")]
    if e.smokes or e.summary.kind == POOL:
        out.append(tag("h3", "Fresh-materialisation smoke tests"))
        smokes = [join([badge("no result") if s.result is None else badge("passed" if s.result.get("passed")
                                                                          else "failed"), f" {s.entry}: ",
                        (s.result or {}).get("summary", f"stopped before writing {SMOKE_RESULT}"),
                        *([" · ", a("its run", run_url(s.run_key))] if s.run_key else []),
                        *([" · ", a(SMOKE_RESULT, file_url(e.key, SMOKE, s.entry, SMOKE_RESULT))]
                          if s.result is not None else [])])
                  for s in reversed(e.smokes)]
        out.append(_list(smokes) if smokes else tag("p", "None yet: `validate smoke RUN_DIR` runs one.",
                                                    class_="muted"))
    return out


def _list(items: list[Html]) -> Html:
    return Html('<ul class="links">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>")


def _files(e: RunEntry) -> list[object]:
    out: list[object] = [tag("h2", "Reports and files", id="reports")]
    if e.reports:
        out.append(
            table(
                ["report (UTC)", "files"],
                [
                    [name, join([a(f, file_url(e.key, REPORTS, name, f)) for f in files], " · ")]
                    for name, files in sorted(e.reports.items(), reverse=True)
                ],
            )
        )
    else:
        out.append(tag("p", "No report yet: `validate report RUN_DIR` writes one.", class_="muted"))
    names = [SUMMARY, MANIFEST, FROZEN_MANIFEST, PATCH, CHECKSUMS, SIGNATURE,
             ATTEMPTS, TASKS, EXCLUSIONS]
    links = [a(n, file_url(e.key, n)) for n in names if is_plain_file(e.root / n)]
    links += [a(f"{VARIANTS}/{v}.json", file_url(e.key, VARIANTS, f"{v}.json")) for v in sorted(e.variants)]
    out.append(tag("p", join(links, " · ")))
    return out


def _contract(e: RunEntry) -> list[object]:
    s = e.summary
    mach = s.machine
    pairs = [("run id", s.run_id), ("environment", s.environment),
             ("contract", f"{e.contract.name} {e.contract.sha256}" if e.contract else s.manifest_sha256),
             ("its parent", e.contract.parent_sha256 if e.contract else None),
             ("frozen child", f"{e.frozen.name} {e.frozen.sha256}" if e.frozen else s.frozen_manifest_sha256),
             *((f"variant {k}", f"{c.name} {c.sha256}; {c.tasks} tasks")
               for k, c in sorted(e.variants.items())),
             ("agents", ", ".join(s.agents)), ("backend", f"{s.backend} ({s.backend_version})"),
             ("image", f"{s.image} {s.image_digest}"),
             ("machine", (f"{mach.os or mach.system}, Linux {mach.kernel}, {mach.architecture}, "
                          f"{mach.cpus} cores, {mach.memory_gib} GiB, Python {mach.python}")),
             ("code", s.code_commit + (f"; patch {s.patch.sha256} on {s.patch.base_commit}" if s.patch
                                       else "")),
             ("required criteria", ", ".join(s.required))]
    return [tag("h2", "Contract and execution", id="contract"), kv(pairs)]


def run_page(e: RunEntry, runs: Mapping[str, RunEntry], f: tables.TaskFilter,
             evals: Sequence[EvalEntry] = ()) -> bytes:
    agent_rows = tables.agent_rows(tables.final_attempts(e.root, e.summary))
    side = [tag("div", *_criteria(e)), tag("div", *_related(e, runs, evals))]
    body = [*_head(e), tag("div", *side, class_="grid"), *_tasks_section(e, f, agent_rows), *_ledgers(e),
            *_agents(e, agent_rows), *_files(e), *_contract(e)]
    crumbs = [(e.parent_key, run_url(e.parent_key))] if e.parent_key else []
    return page(f"{e.key} — validate view", body, crumbs=[*crumbs, (e.key, run_url(e.key))])
