"""The index of runs, the page of one task, and what the pages share (links between runs).

Every value taken from the evidence goes through `validate.view.markup.h` (escaped); the
run page itself is `validate.view.runpage`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from datetime import datetime

from validate.core.paths import SMOKE
from validate.core.records import POOL, meta_of
from validate.eval.report import pct
from validate.view import tables
from validate.view.catalog import CompareEntry, EvalEntry, Listing, RunEntry
from validate.view.markup import Html, a, badge, h, join, num, page, pre, table, tag, text, tone, url


def when(value: datetime | None) -> str:
    return "—" if value is None else value.strftime("%Y-%m-%d %H:%M:%S") + "Z"


def short(sha: str | None, n: int = 12) -> str:
    """``sha256:`` and the first `n` hex digits."""
    if not sha:
        return "—"
    kind, _, digest = sha.partition(":")
    return f"{kind}:{digest[:n]}" if digest else sha[:n]


def run_url(key: str, **query: object) -> str:
    return url(["run", key], query)


def task_url(key: str, phase: str, task_id: str) -> str:
    return url(["run", key, "task"], {"phase": phase, "id": task_id})


def file_url(key: str, *parts: str) -> str:
    """``/file/KEY/PATH``: the run directory's own layout under ``/file/``, so a report's relative
    link to a sibling run (``../../../<run>/reports/…``) lands on that run's file."""
    return url(["file", key, *parts])


def run_link(e: RunEntry) -> Html:
    return a(e.key, run_url(e.key))


def verdict_badge(e: RunEntry) -> Html:
    return badge(e.verdict.verdict) if e.verdict else tag("span", "unreadable", class_="warn")


# --- relations between runs --------------------------------------------------------------

def _relation(me: RunEntry, other: RunEntry) -> str | None:
    """How `other` relates to `me` through their contracts' hashes (None: unrelated)."""
    if not (me.contract and other.contract):
        return None
    mine, theirs = me.contract, other.contract
    my_frozen = me.frozen.sha256 if me.frozen else None
    their_frozen = other.frozen.sha256 if other.frozen else None
    my_variants = {c.sha256 for c in me.variants.values()}
    their_variants = {c.sha256 for c in other.variants.values()}
    rules = [
        (theirs.sha256 == mine.sha256, f"same contract ({other.summary.kind})"),
        (my_frozen is not None and theirs.sha256 == my_frozen, "runs this pool's frozen set"),
        (their_frozen is not None and mine.sha256 == their_frozen, "the pool whose frozen set this run runs"),
        (my_frozen is not None and theirs.parent_sha256 == my_frozen,
         "runs a sample of this pool's frozen set"),
        (their_frozen is not None and mine.parent_sha256 == their_frozen,
         "the pool whose frozen set this samples"),
        (theirs.sha256 in my_variants, "runs one of this pilot's config variants"),
        (mine.sha256 in their_variants, "the pilot one of whose variants this run runs"),
        (theirs.parent_sha256 == mine.sha256, "runs a contract derived from this one"),
        (mine.parent_sha256 is not None and mine.parent_sha256 == theirs.sha256,
         "runs the parent of this contract"),
    ]
    return next((label for ok, label in rules if ok), None)


def related(me: RunEntry, runs: Mapping[str, RunEntry]) -> list[tuple[RunEntry, str]]:
    """Other runs sharing a contract with `me` (its own smoke reruns are listed apart), oldest first."""
    out = []
    for other in runs.values():
        if other.key == me.key or other.summary is None or other.parent_key == me.key:
            continue
        label = _relation(me, other)
        if label is not None:
            out.append((other, label))
    return sorted(out, key=lambda x: (x[0].summary.started_at, x[0].key))


# --- index -------------------------------------------------------------------------------

def _smoke_cell(e: RunEntry) -> Html:
    if e.summary is None or e.summary.kind != POOL:
        return Html("")
    latest = e.latest_smoke
    if latest is None:
        return badge("not run")
    word = badge("passed" if latest.result.get("passed") else "failed")
    return a(word, run_url(latest.run_key), title=f"{SMOKE}/{latest.entry}") if latest.run_key else word


def _counts_cell(e: RunEntry) -> Html:
    c = e.summary.counts
    return Html(f'<span class="n-pass">{c.compatible}</span> / <span class="n-fail">{c.excluded}</span> / '
                f'<span class="n-inc">{c.incomplete}</span> of {c.tasks}')


def _evals_table(evals: list[EvalEntry]) -> Html:
    rows = []
    for e in evals:
        s, c = e.summary, e.contract
        g, m = s.greedy, s.sampled
        revision = short(c.model.revision) if c.model.revision.startswith("sha256:") else c.model.revision
        rows.append([a(e.key, url(["eval", e.key])), s.environment,
                     join([c.model.id, Html("<br>"), tag("code", revision)]),
                     join([c.parent.manifest_name, Html("<br>"), tag("code", short(s.manifest_sha256))]),
                     pct(g.pass_at_1), pct(m.pass_at_k), pct(m.pass_hat_k), f"{m.zero_variance}/{m.eligible}",
                     join([str(s.attempts)] + ([Html("<br>"), tag("span", "interrupted", class_="warn")]
                                               if s.interrupted else [])), when(s.started_at)])
    return table(["evaluation", "environment", "model", "dataset", "pass@1 (greedy)", "pass@k", "pass^k",
                  "zero-variance groups", "attempts", "started (UTC)"], rows, cls="runs")


def _compares_table(compares: list[CompareEntry], evals: Mapping[str, EvalEntry]) -> Html:
    by_id = {e.summary.run_id: e for e in evals.values() if e.summary is not None}

    def run(run_id: str) -> object:
        return a(run_id, url(["eval", by_id[run_id].key])) if run_id in by_id else run_id

    rows = [[a(x.key, url(["compare", x.key])), run(x.comparison.run_a), run(x.comparison.run_b),
             ", ".join(v[0] for v in x.comparison.varied) or "nothing",
             *(next((r[3] for r in x.comparison.overall if re.fullmatch(p, r[0])), "—")
               for p in (r"pass@1 \(greedy\)", r"pass@\d+"))] for x in compares]
    return table(["comparison", "A", "B", "what varied", "Δ pass@1", "Δ pass@k"], rows)


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def index_page(listing: Listing, dirs: list[str]) -> bytes:
    runs = listing.runs
    ok = sorted((e for e in runs.values() if e.summary is not None and e.parent_key is None),
                key=lambda e: (-e.summary.started_at.timestamp(), e.key))
    evals = sorted((e for e in listing.evals.values() if e.summary is not None),
                   key=lambda e: (-e.summary.started_at.timestamp(), e.key))
    compares = sorted((x for x in listing.compares.values() if x.comparison is not None), key=lambda x: x.key)
    bad = [e for e in [*runs.values(), *listing.evals.values()] if e.summary is None]
    bad += [x for x in listing.compares.values() if x.comparison is None]
    rows = []
    for e in ok:
        s, c = e.summary, e.summary.counts
        rows.append([run_link(e), s.kind, s.environment,
                     join([e.contract.name if e.contract else "—", Html("<br>"),
                           tag("code", short(s.manifest_sha256))]),
                     join([verdict_badge(e), Html("<br>") if s.interrupted else "",
                           tag("span", "interrupted", class_="warn") if s.interrupted else ""]),
                     _counts_cell(e), Html(str(c.attempts)), when(s.started_at), _smoke_cell(e)])
    body: list[object] = [tag("h1", "Validation runs"),
                          tag("p", f"{_n(len(ok), 'dataset run')}, {_n(len(evals), 'model evaluation')} and "
                                   f"{_n(len(compares), 'comparison')} under {', '.join(dirs)}",
                              class_="sub")]
    body.append(table(["run", "kind", "environment", "contract", "dataset verdict",
                       "compatible / excluded / incomplete of tasks", "attempts", "started (UTC)", "smoke"],
                      rows, cls="runs")
                if rows else tag("p", "No run directory found (a run directory holds run.json).",
                                 class_="muted"))
    body += [tag("h2", "Model evaluations", id="evals"),
             _evals_table(evals) if evals else tag("p", "No evaluation found (an eval run directory holds "
                                                        "eval-contract.json).", class_="muted")]
    if compares:
        body += [tag("h2", "Comparisons of evaluations", id="compares"),
                 _compares_table(compares, listing.evals)]
    if bad:
        body += [tag("h2", "Not readable"),
                 table(["directory", "why"], [[e.key, e.error] for e in sorted(bad, key=lambda e: e.key)])]
    return page("Validation runs", body)


# --- task --------------------------------------------------------------------------------

def kv(pairs: list[tuple[str, object]]) -> Html:
    """A two-column table of names and values."""
    return Html('<table class="kv"><tbody>' + "".join(f"<tr><th>{text(k)}</th><td>{h(v)}</td></tr>"
                                                       for k, v in pairs) + "</tbody></table>")


def _kv2(pairs: list[tuple[str, object]]) -> Html:
    """`kv` in two halves side by side (one under the other on a narrow window)."""
    half = (len(pairs) + 1) // 2
    return tag("div", tag("div", kv(pairs[:half])), tag("div", kv(pairs[half:])), class_="grid")


def _verdict_block(t: dict) -> list[object]:
    meta = meta_of(t.get("meta"))
    pairs = [("verdict", badge(t["verdict"])), ("reason", t["reason"]), ("detail", t["detail"]),
             ("missing", ", ".join(t["missing"] or []) or None), ("idx", Html(str(t["idx"]))),
             ("family", t["family"]), ("task hash", tag("code", t["task_hash"])),
             ("public facts", ", ".join(f"{k}={v}" for k, v in sorted(meta.items())) or None),
             ("oracle reward", t["oracle_reward"]),
             ("best control", None if t["max_control_agent"] is None else
              join([t["max_control_agent"], ": ", num(t["max_control_reward"])])),
             ("margin", t["margin"]), ("passed only after a retry", "yes" if t["retried"] else "no"),
             ("attempts", Html(str(t["n_attempts"])))]
    out: list[object] = [_kv2(pairs)]
    if t.get("findings"):
        out += [tag("h3", "Findings"), table(["finding", "blocking", "detail"],
                                             [[f["kind"], "yes" if f["blocking"] else "no", f["detail"]]
                                              for f in t["findings"]])]
    return out


def _attempt_summary(attempts: list[dict]) -> Html:
    rows = [[a(str(i + 1), f"#attempt-{i + 1}"), x["agent"], x["role"], x["phase"], Html(str(x["sample"])),
             Html(str(x["attempt"])), x["status"], x["reward"], badge("yes" if x["as_expected"] else "no"),
             "superseded" if x["superseded"] else "", num(x["runtime_s"], 2), x["exit_code"],
             x["error_class"]]
            for i, x in enumerate(attempts)]
    return table(["#", "agent", "role", "phase", "sample", "try", "status", "reward", "as expected", "",
                  "runtime s", "exit", "error"], rows)


def _attempt_section(i: int, x: dict) -> Html:
    metrics = ", ".join(f"{k[len('metric_'):]}={num(v)}" for k, v in sorted(x.items())
                        if k.startswith("metric_") and v is not None)
    pairs = [("status", x["status"]), ("reward", x["reward"]), ("metrics", metrics or None),
             ("as expected", badge("yes" if x["as_expected"] else "no")), ("phase", x["phase"]),
             ("started", when(x["started_at"])), ("finished", when(x["finished_at"])),
             ("runtime s", num(x["runtime_s"], 3)), ("exit code", x["exit_code"]),
             ("killed", ", ".join(w for w, on in (("out of memory", x["oom_killed"]),
                                                  ("timed out", x["timed_out"]))
                                  if on) or "no"),
             ("reply", f"{x['reply_bytes']} bytes, {x['reply_sha256']}" + (" (shown: its head only)"
                                                                            if x["reply_truncated"] else "")
              if x["reply_bytes"] is not None else None),
             ("workspace", tag("code", x["workspace_sha256"])), ("backend", x["backend"]),
             ("image", tag("code", x["image_digest"]))]
    if x.get("node"):  # a cluster ran it (a local run's evidence has no such column)
        pairs.append(("ran on", join([x.get("host") or "unknown host", " · node ", tag("code", x["node"])])))
    title = f"{x['agent']} ({x['role']}) · sample {x['sample']} · try {x['attempt']} · {x['status']}"
    parts = [tag("h3", title), _kv2(pairs)]
    if x["error_class"] or x["error_message"]:
        parts += [tag("h3", f"Error: {x['error_class'] or ''}"), pre(x["error_message"])]
    files = reward_files(x["reply_text"])
    if files:  # a trial's: its reply is the harness's record of the reward files, shown decoded
        parts += [*files, tag("h3", "stdout: the agent phase's output"), pre(x["stdout"]),
                  tag("h3", "stderr: what the harness noted, then the verifier's exit code and output"),
                  pre(x["stderr"]), tag("h3", "Reply (the record as kept)"), pre(x["reply_text"])]
    else:
        parts += [tag("h3", "Reply"), pre(x["reply_text"], "(no reply)"), tag("h3", "stdout"),
                  pre(x["stdout"]), tag("h3", "stderr"), pre(x["stderr"])]
    cls = "attempt superseded" if x["superseded"] else "attempt"
    return Html(f'<section class="{cls}" id="attempt-{i}">{join(parts)}</section>')


def reward_files(reply: str | None) -> list[object]:
    """A verifier record's reward files, decoded (nothing for any other reply: shown as it is above)."""
    try:
        record = json.loads(reply or "")
        files = record["files"] if isinstance(record, dict) and isinstance(record.get("files"),
                                                                           dict) else None
        decoded = {str(n): base64.b64decode(str(v), validate=True) for n, v in sorted((files or {}).items())}
    except (ValueError, binascii.Error):
        return []
    if files is None:
        return []
    facts = [("reward key", record.get("key")), ("range", f"[{record.get('low')}, {record.get('high')}]"),
             ("nothing read because", record.get("failed")), ("task image", record.get("image"))]
    out: list[object] = [tag("h2", "Reward files, as the harness read them from the verifier's "
                                   "fresh /logs/verifier"),
                         kv(facts)]
    for name, data in decoded.items():
        out += [tag("h3", f"{name} ({len(data)} bytes)"), pre(data.decode("utf-8", "replace"))]
    return out


def task_page(e: RunEntry, t: dict) -> bytes:
    """Everything about one task of a run: its verdict and each attempt, replies and output."""
    phases = [p for p, v in tables.attempt_to_verdict_phase(e.summary).items()
              if v == t["phase"]] or [t["phase"]]
    attempts = tables.task_attempts(e.root, sorted(phases), t["task_id"])
    body: list[object] = [
        tag("h1", t["task_id"]),
        tag("p", f"phase {t['phase']} · idx {t['idx']} · family {t['family']} · run {e.key}", class_="sub"),
        tag("div", badge(t["verdict"]), " ", t["detail"], class_=f"headline v-{tone(t['verdict'])}"),
        tag("h2", "Verdict"), *_verdict_block(t),
        tag("h2", f"Attempts ({len(attempts)}, superseded included)"), _attempt_summary(attempts),
        *(_attempt_section(i + 1, x) for i, x in enumerate(attempts))]
    return page(f"{t['task_id']} — {e.key}", body,
                crumbs=[(e.key, run_url(e.key)), (t["task_id"], task_url(e.key, t["phase"], t["task_id"]))])


def message_page(status: int, title: str, detail: str) -> bytes:
    return page(f"{status} {title}", [tag("h1", f"{status} {title}"), tag("p", detail)])
