"""The eval report: Markdown and one self-contained HTML, a new entry per report.

Built from the evidence alone (eval.json, the Parquet files, both contracts). Its first
line states pass@1 and pass@k with their denominators; the claim is scoped to the model,
the dataset contract, the machine and the sandbox; every count has its denominator; lost
samples are counted, never dropped; the failure classes are shown with the rules that gave
them; and a sample of solved and failed trajectories is rendered message by message. Model
text, tool output and error messages are escaped in both formats. Each report is a new
``reports/<UTC time>/`` entry with ``report.json`` (its headline, the trajectories it shows,
the renderer's version and each file it was rendered from with its sha256). `render` is a
pure function of those files (no clock, nothing else read): `validate eval audit` renders
every report again and demands all three files byte for byte (`validate.audit.reports`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field

from validate.core.errors import EvidenceError
from validate.core.paths import EVAL_CONTRACT, EVAL_INPUTS, REPORT_HTML, REPORT_JSON, REPORT_MD, RunPaths
from validate.core.render import to_html, to_markdown
from validate.eval import trajectories
from validate.eval.classes import rule_table
from validate.eval.contract import EvalContract, load
from validate.eval.evidence import EvalPaths
from validate.eval.metrics import GREEDY_PHASE, SAMPLED_PHASE, Rate
from validate.eval.render import STYLE
from validate.eval.summary import EvalSummary, Operations
from validate.evidence.journal import atomic_write, file_sha256, new_entry, write_checksums

#: Trajectories shown per pass and outcome (solved, failed).
SHOWN = 3


@dataclass
class EvalEvidence:
    paths: EvalPaths
    contract: EvalContract
    summary: EvalSummary
    attempts: pd.DataFrame
    samples: pd.DataFrame
    turns: dict[tuple, list[dict]]
    tasks: pd.DataFrame


def load_eval(root: Path) -> EvalEvidence:
    paths = EvalPaths(RunPaths(Path(root)))
    if not paths.contract.is_file():
        raise EvidenceError(f"{root}: not an eval run directory (no {EVAL_CONTRACT})")
    try:
        return EvalEvidence(paths=paths, contract=load(paths.contract),
                            summary=EvalSummary.model_validate_json(paths.summary.read_bytes()),
                            attempts=pd.read_parquet(paths.run.attempts),
                            samples=pd.read_parquet(paths.samples), turns=_turns(paths),
                            tasks=pd.read_parquet(paths.tasks))
    except (OSError, ValueError) as e:
        raise EvidenceError(f"{root}: unreadable eval evidence ({e})") from None


def _turns(paths: EvalPaths) -> dict[tuple, list[dict]]:
    """Turn rows by attempt key, as plain values (pyarrow's: None stays None)."""
    import pyarrow.parquet as pq

    out: dict[tuple, list[dict]] = {}
    for row in pq.read_table(paths.trajectories).to_pylist():
        out.setdefault(tuple(row[k] for k in ("phase", "task_id", "agent", "sample", "attempt")),
                       []).append(row)
    return {k: sorted(v, key=lambda r: r["turn"]) for k, v in out.items()}


def pct(r: Rate) -> str:
    if r.value is None:
        return "— (0 counted)"
    num = f"{r.numerator:g}" if float(r.numerator).is_integer() else f"{r.numerator:.2f}"
    return f"{100 * r.value:.1f} % ({num}/{r.denominator})"


def mean(r: Rate) -> str:
    """A mean reward with its count."""
    return "— (0 counted)" if r.value is None else f"{r.value:.4f} (over {r.denominator})"


def headline(s: EvalSummary) -> str:
    g, m = s.greedy, s.sampled
    return (f"pass@1 (greedy, temperature 0) {pct(g.pass_at_1)}; pass@{m.k} {pct(m.pass_at_k)}; mean sample "
            f"accuracy {pct(m.mean_accuracy)}; pass^{m.k} {pct(m.pass_hat_k)}; zero-variance groups "
            f"{m.zero_variance}/{m.eligible}" + (" — INTERRUPTED, evidence incomplete" if s.interrupted
                                                 else ""))


def _claim(ev: EvalEvidence) -> str:
    s, c = ev.summary, ev.contract
    mach = s.machine
    return (f"Claim (scoped): model {c.model.id} revision {c.model.revision}, served by {c.model.server} "
            f"({c.model.endpoint_kind}), with agent {c.agent.name} {c.agent.version}, evaluated on the "
            f"{c.parent.task_count} tasks of the frozen dataset {c.parent.manifest_name} "
            f"({c.parent.manifest_sha256}; dataset verdict PASS in pool run {c.parent.pool_run_id}), sandbox "
            f"backend {s.backend} image {s.image_digest}, on {mach.os or mach.system}, Linux {mach.kernel}, "
            f"{mach.architecture}, {mach.cpus} cores. Samples lost to infrastructure are counted apart and "
            "never scored as the model's failures.")


def _contract_rows(c: EvalContract) -> list[list[str]]:
    s, lim, p = c.sampling, c.limits, c.parent
    return [["eval contract", f"{c.name} {c.sha256}"],
            ["dataset", f"{p.manifest_name} {p.manifest_sha256}, {p.task_count} tasks, pool "
                        f"run {p.pool_run_id}"],
            ["model", f"{c.model.id} @ {c.model.revision}"],
            ["endpoint", f"{c.model.endpoint_kind} via {c.model.server} at {c.model.base_url}; key from "
                         f"{'$' + c.model.api_key_env if c.model.api_key_env else 'none (no API key sent)'}"],
            ["agent", f"{c.agent.name} {c.agent.version} ({c.agent.source_sha256})"],
            ["prompts", f"system {c.prompts.system_sha256}; user {c.prompts.user_sha256}"],
            ["tools", f"{', '.join(t['function']['name'] for t in c.tools)} ({c.tools_sha256})"],
            ["sampling", f"temperature {s.temperature} (greedy pass: 0), top_p {s.top_p}, max_tokens "
                         f"{s.max_tokens}, seed {s.seed}, stream {s.stream}"],
            ["limits", ", ".join(f"{k}={v}" for k, v in lim.model_dump().items())],
            ["reward", f"pass threshold {c.reward.pass_threshold}; code {c.reward.code_sha256}; revision "
                       f"{c.reward.revision}"],
            ["k", str(c.k)], ["harness", f"{c.harness_version}, frozen at {c.git_commit}"]]


def _metric_blocks(s: EvalSummary) -> list:
    g, m = s.greedy, s.sampled
    lost = "; ".join(f"{why}: {n}" for why, n in g.lost.items()) or "none"
    rows = [["pass@1 (solved / valid)", pct(g.pass_at_1)], ["pass@1 over all tasks (lost = unsolved)",
                                                            pct(g.pass_at_1_all)],
            ["mean greedy reward", mean(g.mean_reward)], ["tasks lost in the greedy pass", lost]]
    srows = [[f"pass@{m.k} (unbiased, over eligible tasks)", pct(m.pass_at_k)],
             ["mean sample accuracy", pct(m.mean_accuracy)],
             ["exploration headroom (pass@k − accuracy)", "—" if m.headroom is None else f"{m.headroom:.4f}"],
             [f"pass^{m.k} (all {m.k} solved)", pct(m.pass_hat_k)],
             ["mean sampled reward", mean(m.mean_reward)],
             [f"mean best-of-{m.k} reward", mean(m.best_reward)], ["mean within-task reward std (RL signal)",
                                                                   mean(m.reward_std)],
             ["eligible tasks (k valid samples)", f"{m.eligible}/{m.tasks}"],
             ["samples lost", "; ".join(f"{why}: {n}" for why, n in m.samples_lost.items()) or "none"],
             ["zero-variance groups", f"{m.zero_variance}/{m.eligible} (all solved {m.zero_variance_solved}, "
                                      f"all unsolved {m.zero_variance_failed})"]]
    out = [("h2", "Deterministic pass@1 (temperature 0)"), ("table", ["what", "value"], rows),
           ("h2", f"Sampled pass@{m.k}"), ("table", ["what", "value"], srows)]
    if m.excluded:
        out += [("p", [f"{len(m.excluded)} task(s) left out of pass@{m.k} and the zero-variance count:"]),
                ("table", ["task", "reason"], [list(x) for x in m.excluded[:200]])]
    shown = m.zero_variance_tasks[:100]
    out.append(("p", [f"Zero-variance groups ({m.zero_variance}): "
                      + (", ".join(shown) + (" …" if len(m.zero_variance_tasks) > 100 else "") if shown
                         else "none")]))
    return out


def _ops_rows(ops: dict[str, Operations]) -> list[list[str]]:
    def sp(x) -> str:
        if x.mean is None:
            return "—"
        return f"mean {x.mean:.2f}, p50 {x.p50:.2f}, p95 {x.p95:.2f}, max {x.max:.2f}"

    names = [("attempts", lambda o: str(o.attempts)), ("turns", lambda o: sp(o.turns)),
             ("prompt tokens", lambda o: sp(o.prompt_tokens)),
             ("completion tokens", lambda o: sp(o.completion_tokens)),
             ("seconds per attempt", lambda o: sp(o.wall_s)),
             ("seconds in the model", lambda o: sp(o.model_s)), ("tool calls", lambda o: str(o.tool_calls)),
             ("tool-call failures", lambda o: f"{o.tool_failures}/{o.tool_calls - o.malformed_tool_calls}"),
             ("malformed tool calls", lambda o: f"{o.malformed_tool_calls}/{o.tool_calls}"),
             ("tool timeouts", lambda o: str(o.tool_timeouts)),
             ("limit terminations (turns, tokens, context)",
              lambda o: f"{o.limit_terminations}/{o.attempts}"),
             ("timeout terminations", lambda o: f"{o.timeout_terminations}/{o.attempts}"),
             ("environment errors (after retries)",
              lambda o: f"{o.environment_errors}/{o.attempts}"),
             ("verifier errors", lambda o: f"{o.verifier_errors}/{o.attempts}"),
             ("harness errors", lambda o: f"{o.harness_errors}/{o.attempts}"),
             ("terminations", lambda o: ", ".join(f"{k} {v}" for k, v in o.terminations.items()))]
    return [[n, *(f(ops[p]) for p in (GREEDY_PHASE, SAMPLED_PHASE))] for n, f in names]


def _class_blocks(s: EvalSummary, task_dirs: bool = False) -> list:
    table = {r[0]: r for r in rule_table(True)}
    rows = [[c.phase, c.failure_class, c.rule, table.get(c.rule, ("", "", "?"))[2], str(c.attempts)]
            for c in s.failure_classes]
    errs = [[e.phase, e.status, e.error_class, str(e.attempts)] for e in s.errors]
    return [("h2", "Failure classes (unsolved final attempts)"),
            ("table", ["pass", "class", "rule", "the rule says", "attempts"],
             rows or [["—", "—", "—", "none", "0"]]),
            ("p", ["Rules, in the order they are tried (the first that applies gives the class):"]),
            ("table", ["rule", "class", "condition"], [list(r) for r in rule_table(task_dirs)]),
            ("h2", "Errors (every try, superseded included)"),
            ("table", ["pass", "status", "kind", "attempts"], errs or [["—", "—", "none", "0"]])]


def _family_blocks(s: EvalSummary) -> list:
    rows = [[f.family, str(f.tasks), pct(f.greedy_pass_at_1), mean(f.greedy_mean_reward), pct(f.pass_at_k),
             pct(f.mean_accuracy), mean(f.mean_reward)] for f in s.families]
    return [("h2", "Per family"), ("table", ["family", "tasks", "pass@1", "greedy reward",
                                             f"pass@{s.sampled.k}", "sample accuracy", "sampled reward"],
                                   rows)]


def _task_blocks(ev: EvalEvidence) -> list:
    a = ev.attempts[(ev.attempts["phase"] == GREEDY_PHASE) & ~ev.attempts["superseded"]].set_index("task_id")
    rows = []
    for t in ev.tasks.itertuples():
        g = a.loc[t.task_id] if t.task_id in a.index else None
        greedy = "—" if g is None or pd.isna(g["reward"]) else f"{g['reward']:.4f}"
        solved = f"{t.solved}/{t.n_valid}" + (f" ({t.n_lost} lost)" if t.n_lost else "")
        rows.append([t.task_id, t.family, greedy, solved,
                     "—" if pd.isna(t.mean_reward) else f"{t.mean_reward:.4f}",
                     "—" if pd.isna(t.best_reward) else f"{t.best_reward:.4f}",
                     "—" if pd.isna(t.pass_at_k) else f"{t.pass_at_k:.3f}", "yes" if t.zero_variance else ""])
    return [("h2", "Per task"), ("table", ["task", "family", "greedy reward", "solved / valid samples",
                                           "mean sampled reward", "best sampled reward",
                                           f"pass@{ev.summary.sampled.k}", "zero variance"],
                                 rows)]


def pick(ev: EvalEvidence, seed: str) -> list[tuple]:
    """Keys of the trajectories shown: per pass, up to SHOWN solved and SHOWN failed final
    attempts (failed ones spread over their rules first), chosen with a seeded RNG."""
    rng = random.Random(seed)
    final = ev.samples.merge(ev.attempts[["phase", "task_id", "agent", "sample", "attempt", "superseded"]],
                             on=["phase", "task_id", "agent", "sample", "attempt"])
    final = final[~final["superseded"]]
    out = []
    for phase in (GREEDY_PHASE, SAMPLED_PHASE):
        mine = final[final["phase"] == phase]
        key = ["phase", "task_id", "agent", "sample", "attempt"]
        solved = sorted(map(tuple, mine[mine["solved"]][key].values))
        out += rng.sample(solved, min(SHOWN, len(solved)))
        failed = mine[~mine["solved"]]
        by_rule = {r: sorted(map(tuple, g[["phase", "task_id", "agent", "sample", "attempt"]].values))
                   for r, g in failed.groupby("failure_rule")}
        chosen: list = []
        while len(chosen) < SHOWN and any(by_rule.values()):
            for rule in sorted(by_rule):
                if by_rule[rule] and len(chosen) < SHOWN:
                    chosen.append(by_rule[rule].pop(rng.randrange(len(by_rule[rule]))))
        out += chosen
    return out


def blocks(ev: EvalEvidence) -> list:
    s = ev.summary
    doc = [("h1", f"Eval report — {s.model} on {ev.contract.parent.manifest_name}, run {s.run_id}"),
           ("p", [("bold", headline(s))]), ("p", [_claim(ev)]),
           ("h2", "Contract"), ("table", ["field", "value"], _contract_rows(ev.contract))]
    doc += _metric_blocks(s) + _family_blocks(s)
    doc += [("h2", "What the agent did (final attempts)"),
            ("table", ["", GREEDY_PHASE, SAMPLED_PHASE], _ops_rows(s.operations))]
    doc += _class_blocks(s, task_dirs="verifier" in ev.samples and bool(ev.samples["verifier"].notna().any()))
    shown = pick(ev, s.run_id)
    solved = int(ev.samples["solved"].sum())
    doc += [("h2", "Trajectories (a seeded sample of solved and failed attempts)"),
            ("p", [f"Up to {SHOWN} solved and {SHOWN} failed final attempts per pass (failed ones spread "
                   f"over their rules), chosen with a RNG seeded by the run id: {len(shown)} shown. "
                   + ("No attempt solved its task, so none of them is a success." if solved == 0 else
                      f"{solved} attempt(s) solved their task.")])]
    for key in shown:
        doc += trajectories.blocks(ev, key)
    doc += _task_blocks(ev)
    doc += [("h2", "Timing"), ("p", [_timing(ev)])]
    return doc


def _timing(ev: EvalEvidence) -> str:
    """The attempts' own span, as the dataset report does: the summary's started_at is the
    latest session's start, so after a resume it would count the earlier sessions' attempts
    over the last session's time and inflate attempts/s."""
    s, a = ev.summary, ev.attempts
    if not len(a):
        return f"No attempts (the run from {s.started_at} to {s.finished_at})."
    t0, t1 = a["started_at"].min(), a["finished_at"].max()
    span = (t1 - t0).total_seconds()
    return (f"{s.attempts} attempts ({s.superseded} superseded) from {t0} to {t1}: {span:.0f} s of wall "
            f"time, {s.attempts / max(span, 1e-9):.2f} attempts/s.")


#: This renderer's version, recorded in each report.json; the audit knows only this one (bump
#: it whenever a change here, in `validate.eval.render` or `validate.eval.trajectories`
#: changes a byte of a report).
RENDERER = "eval-report/2"

#: The files an eval report is rendered from (`load_eval` reads exactly these): EVAL_INPUTS.


class EvalReportRecord(BaseModel):
    """report.json of an eval report."""

    renderer: str = Field(description="The renderer's version (`RENDERER` when written).")
    headline: str = Field(description="The report's first line.")
    shown: list[list] = Field(description="Keys of the trajectories it renders.")
    ledgers: dict[str, str] = Field(description="Each file it was rendered from (relative to the run "
                                                "directory) → its sha256.")


def render(src: Path) -> dict[str, bytes]:
    """report.md, report.html and report.json of the eval evidence under `src` (the run
    directory, or the copy of a report's inputs kept at a resume)."""
    ev = load_eval(Path(src))
    doc = blocks(ev)
    record = EvalReportRecord(renderer=RENDERER, headline=headline(ev.summary),
                              shown=[list(k) for k in pick(ev, ev.summary.run_id)],
                              ledgers={n: file_sha256(Path(src) / n) for n in EVAL_INPUTS})
    return {REPORT_MD: to_markdown(doc).encode(), REPORT_HTML: to_html(doc, "Eval report", STYLE).encode(),
            REPORT_JSON: record.model_dump_json(indent=2).encode() + b"\n"}


def write_report(root: Path) -> Path:
    paths = EvalPaths(RunPaths(Path(root)))
    if not paths.contract.is_file():
        raise EvidenceError(f"{root}: not an eval run directory (no {EVAL_CONTRACT})")
    files = render(paths.root)
    entry = new_entry(paths.run.reports)
    for name, data in files.items():
        atomic_write(entry / name, data)
    write_checksums(paths.run)
    return entry
