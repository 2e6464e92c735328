"""The pages of a model evaluation and of a comparison of two.

An eval run's page: the headline and figures of its ``eval.json`` (pass@1, pass@k, pass^k
with their denominators, as the eval report states them), per family, the failure classes
with the rules that gave them, the errors, and per task its greedy pass@1 and the sampled
pass's solved / valid, pass@k and pass^k (filterable by family and failure rule as query
parameters). A task's page lists every attempt with its failure class; an attempt's page is
its trajectory, rendered by the eval report's own `validate.eval.trajectories` (messages, tool
calls, capped outputs; for a task directory, the task's verifier's output) and shown here
through `validate.view.markup`, so model and tool text are escaped as everything else the
viewer shows. A task-directory attempt's reply is the harness's record of the reward files
(base64 in JSON): its files are shown decoded, as the harness read them.
"""

from __future__ import annotations

from collections.abc import Mapping

from validate.core.paths import (
    ATTEMPTS,
    CHECKSUMS,
    COMPARE_HTML,
    COMPARE_JSON,
    COMPARE_MD,
    EVAL_CONTRACT,
    EVAL_SUMMARY,
    EVAL_TASKS,
    MANIFEST,
    REPORTS,
    SAMPLES,
    TRAJECTORIES,
)
from validate.core.render import Bold
from validate.eval import trajectories
from validate.eval.classes import rule_table
from validate.eval.report import headline, mean, pct
from validate.view import evaldata
from validate.view.catalog import CompareEntry, EvalEntry, Listing, is_plain_file
from validate.view.markup import Html, a, badge, join, num, page, pre, table, tag, text, url
from validate.view.pages import file_url, kv, reward_files, run_url, short, when


def eval_url(key: str, **query: object) -> str:
    return url(["eval", key], query)


def eval_task_url(key: str, task_id: str) -> str:
    return url(["eval", key, "task"], {"id": task_id})


def attempt_url(key: str, phase: str, task_id: str, agent: str, sample: int, attempt: int) -> str:
    return url(["eval", key, "sample"], {"phase": phase, "id": task_id, "agent": agent, "sample": sample,
                                         "attempt": attempt})


def compare_url(key: str) -> str:
    return url(["compare", key])


def _list(items: list[Html]) -> Html:
    return Html('<ul class="links">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>")


def _cards(e: EvalEntry) -> Html:
    s = e.summary
    g, m = s.greedy, s.sampled
    items = [("pass@1 (greedy)", pct(g.pass_at_1)), (f"pass@{m.k}", pct(m.pass_at_k)),
             (f"pass^{m.k}", pct(m.pass_hat_k)), ("mean sample accuracy", pct(m.mean_accuracy)),
             ("zero-variance groups", f"{m.zero_variance}/{m.eligible}"), ("tasks", str(g.tasks)),
             ("attempts", str(s.attempts)), ("superseded", str(s.superseded))]
    return Html('<div class="cards">'
                + "".join(f'<div class="card"><b>{text(v)}</b><span>{text(k)}</span></div>'
                                                for k, v in items) + "</div>")


def _figures(e: EvalEntry) -> list[object]:
    g, m = e.summary.greedy, e.summary.sampled
    rows = [["pass@1 (greedy, solved / valid)", pct(g.pass_at_1)],
            ["pass@1 over all tasks", pct(g.pass_at_1_all)], ["mean greedy reward", mean(g.mean_reward)],
            ["greedy tasks lost", "; ".join(f"{w}: {n}" for w, n in g.lost.items()) or "none"],
            [f"pass@{m.k} (unbiased, eligible tasks)", pct(m.pass_at_k)], [f"pass^{m.k}", pct(m.pass_hat_k)],
            ["mean sample accuracy", pct(m.mean_accuracy)],
            ["exploration headroom", "—" if m.headroom is None else f"{m.headroom:.4f}"],
            ["mean sampled reward", mean(m.mean_reward)], [f"mean best-of-{m.k} reward", mean(m.best_reward)],
            ["mean within-task reward std", mean(m.reward_std)],
            ["eligible tasks", f"{m.eligible}/{m.tasks}"],
            ["samples lost", "; ".join(f"{w}: {n}" for w, n in m.samples_lost.items()) or "none"],
            ["zero-variance groups", f"{m.zero_variance}/{m.eligible} (all solved {m.zero_variance_solved}, "
                                     f"all unsolved {m.zero_variance_failed})"]]
    fam = [[f.family, str(f.tasks), pct(f.greedy_pass_at_1), mean(f.greedy_mean_reward), pct(f.pass_at_k),
            pct(f.mean_accuracy), mean(f.mean_reward)] for f in e.summary.families]
    return [tag("h2", "Metrics", id="metrics"), table(["what", "value"], rows, cls="figures"),
            tag("h3", "Per family"),
            table(["family", "tasks", "pass@1", "greedy reward", f"pass@{m.k}", "sample accuracy",
                   "sampled reward"],
                  fam)]


def _classes(e: EvalEntry) -> list[object]:
    said = {r[0]: r[2] for r in rule_table(True)}
    rows = [[c.phase, c.failure_class, a(c.rule, eval_url(e.key, rule=c.rule) + "#tasks"),
             said.get(c.rule, "?"), Html(str(c.attempts))] for c in e.summary.failure_classes]
    errs = [[x.phase, x.status, x.error_class, Html(str(x.attempts))] for x in e.summary.errors]
    return [
        tag("h2", "Failure classes (unsolved final attempts)", id="classes"),
        table(["pass", "class", "rule", "the rule says", "attempts"], rows)
        if rows
        else tag("p", "No unsolved final attempt.", class_="muted"),
        tag("h3", "Errors (every try, superseded included)"),
        table(["pass", "status", "kind", "attempts"], errs) if errs else tag("p", "None.", class_="muted"),
    ]


def _task_table(e: EvalEntry, family: str | None, rule: str | None) -> list[object]:
    lines = evaldata.task_lines(e.root)
    families = sorted({ln.task["family"] for ln in lines})
    shown = [ln for ln in lines if (family is None or ln.task["family"] == family)
             and (rule is None or rule in ln.rules)]
    k = e.summary.sampled.k
    rows = []
    for ln in shown:
        t, g = ln.task, ln.greedy
        greedy = "—" if g is None or g.solved is None else join([badge("yes" if g.solved else "no"), " ",
                                                                 num(g.reward)])
        rows.append([a(t["task_id"], eval_task_url(e.key, t["task_id"]), class_="nw"), t["family"], greedy,
                     Html(f"{t['solved']}/{t['n_valid']}") if not t["n_lost"]
                     else f"{t['solved']}/{t['n_valid']} ({t['n_lost']} lost)",
                     num(t["pass_at_k"], 3), num(t["pass_hat_k"], 3), t["mean_reward"],
                     "yes" if t["zero_variance"] else "", ", ".join(f"{r} {n}" for r, n in ln.rules.items())])
    filters = [join(["family: ", *_choices(e, "family", families, family, rule=rule)])]
    rules = sorted({r for ln in lines for r in ln.rules})
    filters.append(join(["failure rule: ", *_choices(e, "rule", rules, rule, family=family)]))
    return [tag("h2", "Tasks", id="tasks"), tag("p", join(filters, " · "), class_="sub"),
            tag("p", f"{len(shown)} of {len(lines)} tasks", class_="sub"),
            table(["task", "family", "pass@1 (greedy solved, reward)", "solved / valid samples", f"pass@{k}",
                   f"pass^{k}", "mean sampled reward", "zero variance", "failure rules (final attempts)"],
                  rows, cls="tasks") if rows else tag("p", "No task matches.", class_="muted")]


def _choices(e: EvalEntry, name: str, options: list[str], chosen: str | None,
             **keep: str | None) -> list[object]:
    links: list[object] = [tag("b", "any") if chosen is None
                           else a("any", eval_url(e.key, **keep) + "#tasks")]
    for o in options:
        links += [" ", tag("b", o) if o == chosen else a(o, eval_url(e.key, **{name: o}, **keep) + "#tasks")]
    return links


def _related(e: EvalEntry, listing: Listing) -> list[object]:
    c, items = e.contract, []
    for r in listing.runs.values():
        if r.summary is not None and r.summary.run_id == c.parent.pool_run_id and r.parent_key is None:
            items.append(join(["the pool that froze the evaluated set: ", a(r.key, run_url(r.key))]))
    for o in listing.evals.values():
        if (
            o.key != e.key
            and o.contract is not None
            and o.contract.parent.manifest_sha256 == c.parent.manifest_sha256
        ):
            items.append(join(["another evaluation of the same set: ", a(o.key, eval_url(o.key)),
                               f" ({o.contract.model.id}@{o.contract.model.revision})"]))
    for x in listing.compares.values():
        if x.comparison is not None and e.summary.run_id in (x.comparison.run_a, x.comparison.run_b):
            items.append(join(["compared: ", a(x.key, compare_url(x.key))]))
    return [tag("h2", "Related", id="related"),
            _list(items) if items else tag("p", "Nothing else here shares its dataset.", class_="muted")]


def _files(e: EvalEntry) -> list[object]:
    out: list[object] = [tag("h2", "Reports and files", id="files")]
    if e.reports:
        rows = [[n, join([a(f, file_url(e.key, REPORTS, n, f)) for f in fs], " · ")]
                for n, fs in sorted(e.reports.items(), reverse=True)]
        out.append(table(["report (UTC)", "files"], rows))
    else:
        out.append(tag("p", "No report yet: `validate eval report RUN_DIR` writes one.", class_="muted"))
    names = [EVAL_SUMMARY, EVAL_CONTRACT, MANIFEST, CHECKSUMS, ATTEMPTS, SAMPLES, TRAJECTORIES, EVAL_TASKS]
    out.append(tag("p", join([a(n, file_url(e.key, n)) for n in names if is_plain_file(e.root / n)], " · ")))
    return out


def _contract(e: EvalEntry) -> list[object]:
    c, s = e.contract, e.summary
    pairs = [("eval contract", f"{c.name} {c.sha256}"), ("model", f"{c.model.id} @ {c.model.revision}"),
             ("endpoint", f"{c.model.endpoint_kind} via {c.model.server} at {c.model.base_url}; key from "
                          f"{'$' + c.model.api_key_env if c.model.api_key_env else 'none'}"),
             ("dataset", f"{c.parent.manifest_name} {c.parent.manifest_sha256}, {c.parent.task_count} tasks, "
                         f"pool run {c.parent.pool_run_id}"),
             ("agent", f"{c.agent.name} {c.agent.version}"),
             ("tools", ", ".join(str(t.get("function", {}).get("name")) for t in c.tools)),
             ("sampling", ", ".join(f"{k}={v}" for k, v in c.sampling.model_dump().items())),
             ("limits", ", ".join(f"{k}={v}" for k, v in c.limits.model_dump().items())),
             ("reward", f"pass threshold {c.reward.pass_threshold}; code {c.reward.code_sha256}"),
             ("k", str(c.k)), ("backend", f"{s.backend}, image {s.image_digest}"),
             ("code", s.code_commit + (f"; patch {s.patch.sha256}" if s.patch else ""))]
    return [tag("h2", "Contract and execution", id="contract"), kv(pairs)]


def eval_page(e: EvalEntry, listing: Listing, family: str | None = None, rule: str | None = None) -> bytes:
    s, c = e.summary, e.contract
    body: list[object] = [
        tag("h1", e.key),
        tag("p", f"model evaluation · {s.environment} · {s.model} on {c.parent.manifest_name} "
                 f"{short(s.manifest_sha256)} · {s.backend} · {when(s.started_at)} → {when(s.finished_at)}",
            class_="sub"),
        tag("div", headline(s), class_="headline")]
    if s.interrupted:
        body.append(tag("p", "This evaluation was interrupted: its evidence is incomplete (resume it with "
                             "`validate eval run --resume`).", class_="warn"))
    toc = [("metrics", "Metrics"), ("classes", "Failure classes"), ("tasks", "Tasks"), ("related", "Related"),
           ("files", "Reports and files"), ("contract", "Contract")]
    body += [_cards(e), Html('<nav class="toc">' + "".join(a(t, f"#{i}") for i, t in toc) + "</nav>"),
             tag("div", tag("div", *_figures(e)), tag("div", *_classes(e), *_related(e, listing)),
                 class_="grid"),
             *_task_table(e, family, rule), *_files(e), *_contract(e)]
    return page(f"{e.key} — validate view", body, crumbs=[(e.key, eval_url(e.key))])


def eval_task_page(e: EvalEntry, t: dict) -> bytes:
    """One task of an evaluation: its figures and every attempt with its failure class."""
    rows = evaldata.task_attempts(e.root, t["task_id"])
    k = e.summary.sampled.k
    pairs = [("family", t["family"]), ("solved / valid samples", f"{t['solved']}/{t['n_valid']}"),
             ("lost samples", f"{t['n_lost']}" + (f" ({', '.join(t['lost'])})" if t["lost"] else "")),
             (f"pass@{k}", t["pass_at_k"]), (f"pass^{k}", t["pass_hat_k"]),
             ("sample accuracy", t["accuracy"]), ("mean sampled reward", t["mean_reward"]),
             ("best sampled reward", t["best_reward"]), ("reward std", t["reward_std"]),
             ("zero variance", "—" if t["zero_variance"] is None
                                                else "yes" if t["zero_variance"] else "no"),
             ("left out of pass@k", t["excluded_reason"] or "no"),
             ("rewards by sample", ", ".join("—" if r is None else f"{r:.4f}" for r in t["rewards"]))]
    table_rows = [[a("trajectory", attempt_url(e.key, x.phase, x.task_id, x.agent, x.sample, x.attempt)),
                   x.phase, Html(str(x.sample)), Html(str(x.attempt)), "final" if x.final else "superseded",
                   x.status, x.reward, "—" if x.solved is None else badge("yes" if x.solved else "no"),
                   x.termination, None if x.turns is None else Html(str(x.turns)),
                   None if x.tool_calls is None
                   else Html(f"{x.tool_calls} ({x.malformed_tool_calls} malformed)"), x.failure_class,
                   x.failure_rule, x.error_class] for x in rows]
    body = [tag("h1", t["task_id"]), tag("p", f"family {t['family']} · evaluation {e.key}", class_="sub"),
            tag("h2", "Figures (the sampled pass, from eval-tasks.parquet)"), kv(pairs),
            tag("h2", f"Attempts ({len(rows)}, superseded included)"),
            table(["", "pass", "sample", "try", "", "status", "reward", "solved", "termination", "turns",
                   "tool calls", "failure class", "rule", "error"], table_rows)]
    return page(f"{t['task_id']} — {e.key}", body,
                crumbs=[(e.key, eval_url(e.key)), (t["task_id"], eval_task_url(e.key, t["task_id"]))])


def _block(b: tuple) -> Html:
    """One block of the eval report's document model, as viewer markup (every text escaped)."""
    kind = b[0]
    if kind in ("h1", "h2", "h3"):
        return tag("h2" if kind == "h3" else "h1", b[1])
    if kind == "p":
        return tag("p", *(tag("strong", x[1]) if isinstance(x, tuple) else tag("strong", x)
                          if isinstance(x, Bold)
                          else x for x in b[1]))
    if kind == "message":
        role = b[1] if b[1] in ("system", "user", "assistant", "tool") else "other"
        return tag("section", tag("header", tag("b", b[1]), " — ", b[2]), pre(b[3]), class_=f"msg {role}")
    if kind == "table":
        return table(b[1], b[2])
    return tag("p", f"({kind})", class_="muted")


def attempt_page(e: EvalEntry, one: evaldata.OneAttempt, key: tuple) -> bytes:
    """One attempt's trajectory: the eval report's blocks, then the reply as scored."""
    phase, task_id, agent, sample, attempt = key
    x = one.attempt
    metrics = ", ".join(f"{k[len('metric_'):]}={num(v)}" for k, v in sorted(x.items())
                        if k.startswith("metric_") and v is not None)
    body: list[object] = [tag("h1", f"{task_id} · {phase} · sample {sample} · try {attempt}"),
                          tag("p", join(["evaluation ", a(e.key, eval_url(e.key)), " · task ",
                                         a(task_id, eval_task_url(e.key, task_id))]), class_="sub")]
    body += [_block(b) for b in trajectories.blocks(one, key)]
    body += [tag("h2", "The reply, as scored"),
             kv([("status", x["status"]), ("reward", x["reward"]), ("metrics", metrics or None),
                 ("reply", None if x["reply_bytes"] is None
                  else f"{x['reply_bytes']} bytes, {x['reply_sha256']}")]),
             pre(x["reply_text"], "(no reply)")]
    body += reward_files(x["reply_text"])
    if x["error_class"] or x["error_message"]:
        body += [tag("h2", f"Error: {x['error_class'] or ''}"), pre(x["error_message"])]
    crumbs = [(e.key, eval_url(e.key)), (task_id, eval_task_url(e.key, task_id)),
              (f"{phase} sample {sample} try {attempt}",
               attempt_url(e.key, phase, task_id, agent, sample, attempt))]
    return page(f"{task_id} · {phase} · sample {sample} · try {attempt} — {e.key}", body, crumbs=crumbs)


def compare_page(x: CompareEntry, listing: Listing) -> bytes:
    """A comparison of two evaluations: what varied, the overall, per-family and per-task deltas."""
    c = x.comparison
    by_id = {e.summary.run_id: e for e in listing.evals.values() if e.summary is not None}
    side = {name: a(run, eval_url(by_id[run].key)) if run in by_id else run for name, run in (("A", c.run_a),
                                                                                             ("B", c.run_b))}
    body = [tag("h1", f"{c.run_a} (A) vs {c.run_b} (B)"),
            tag("p", join(["comparison ", x.key, " · A: ", side["A"], " · B: ", side["B"],
                           " · the same frozen set ", short(c.dataset), "; deltas are B − A"]), class_="sub"),
            tag("h2", "What differs between the two contracts"),
            table(["field", "A", "B"], [list(v) for v in c.varied]) if c.varied else tag("p", "Nothing.",
                                                                                      class_="muted"),
            tag("h2", "Overall"), table(["metric", "A", "B", "B − A"], [list(r) for r in c.overall]),
            tag("h2", "Per family"), table(["family", "pass@1 A", "pass@1 B", "pass@k A", "pass@k B"],
                                           [list(r) for r in c.families]),
            tag("h2", "Per task (largest change first)"),
            table(["task", "family", "greedy A", "greedy B", "sampled A", "sampled B", "solved A",
                   "solved B"],
                  [[_task_link(by_id, c.run_a, t.task_id), t.family, t.greedy_a, t.greedy_b, t.sampled_a,
                    t.sampled_b, t.solved_a, t.solved_b] for t in c.tasks]),
            tag("h2", "Files"), tag("p", join([a(n, file_url(x.key, n)) for n in (COMPARE_HTML, COMPARE_MD,
                                                                                     COMPARE_JSON)
                                               if is_plain_file(x.root / n)], " · "))]
    return page(f"{x.key} — validate view", body, crumbs=[(x.key, compare_url(x.key))])


def _task_link(by_id: Mapping[str, EvalEntry], run_id: str, task_id: str) -> object:
    e = by_id.get(run_id)
    return task_id if e is None else a(task_id, eval_task_url(e.key, task_id), class_="nw")
