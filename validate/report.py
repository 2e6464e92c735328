"""The audit report of a run directory, for reviewers: Markdown and one self-contained HTML.

Built from the evidence files alone (no corpus, no sandbox). Every count carries its
denominator; the claim is scoped to the machine, architecture, backend and image digest
the run used. `report.json` holds the counts the report states, so `validate audit` can
check them against the ledgers.
"""

from __future__ import annotations

import base64
import html
import io
import json
import statistics
from pathlib import Path

import pandas as pd

from validate.errors import EvidenceError
from validate.evidence import atomic_write, write_checksums
from validate.paths import RunPaths

Block = tuple  # ("h1"|"h2"|"p"|"table"|"img"|"code", ...)


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EvidenceError(f"{path}: not readable JSON ({e})") from None


def load_run(root: Path) -> dict:
    paths = RunPaths(root)
    run = {
        "manifest": _json(paths.manifest),
        "summary": _json(paths.summary),
        "attempts": pd.read_parquet(paths.attempts),
        "tasks": pd.read_parquet(paths.tasks),
        "exclusions": pd.read_parquet(paths.exclusions),
    }
    for name, key in (("frozen-manifest.json", "frozen"), ("probes.json", "probes"), ("smoke/result.json", "smoke")):
        if (root / name).exists():
            run[key] = _json(root / name)
    run["variants"] = [_json(p) for p in sorted(root.glob("*.manifest.json"))]
    return run


def counts(run: dict) -> dict:
    """Every number the report states, from the ledgers."""
    tasks, attempts = run["tasks"], run["attempts"]
    final = attempts[~attempts["superseded"]]
    oracle = final[final["agent"] == "oracle"]
    return {
        "tasks": int(len(tasks)),
        "compatible": int(tasks["compatible"].sum()),
        "excluded": int((~tasks["compatible"]).sum()),
        "excluded_by_reason": {str(k): int(v) for k, v in sorted(tasks["reason"].dropna().value_counts().items())},
        "exclusion_rows": int(len(run["exclusions"])),
        "oracle_attempted": int(oracle.groupby(["phase", "task_id"]).ngroups),
        "oracle_passed": int(oracle["as_expected"].sum()),
        "frozen": len(run["frozen"]["tasks"]) if "frozen" in run else None,
        "attempts": int(len(attempts)),
        "superseded": int(attempts["superseded"].sum()),
        "infrastructure_errors": int((attempts["status"] == "infrastructure_error").sum()),
    }


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return "—"
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def _of(n: int, d: int) -> str:
    return f"{n}/{d}" + (f" ({100 * n / d:.1f} %)" if d else "")


def _agents_in_order(final: pd.DataFrame) -> list[str]:
    """The oracle, then the controls, then the probes; by name within each."""
    rank = {"pass": 0, "reject": 1, "partial": 2}
    expect = final.groupby("agent")["expect"].first()
    return sorted(expect.index, key=lambda a: (rank.get(expect[a], 3), a))


def _plot(final: pd.DataFrame) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = _agents_in_order(final)
    data = [final.loc[final["agent"] == a, "reward"].fillna(0.0).to_numpy() for a in agents]
    fig, ax = plt.subplots(figsize=(9, 4), dpi=100)
    ax.boxplot(data, vert=True, showfliers=True)
    ax.set_xticks(range(1, len(agents) + 1), agents, rotation=20)
    ax.set_ylabel("reward")
    ax.set_ylim(-0.05, 1.05)
    ax.axhline(1.0, color="green", linestyle=":", linewidth=1)
    ax.set_title("Reward per agent (final attempts)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def blocks(run: dict) -> list[Block]:
    m, s, tasks, attempts = run["manifest"], run["summary"], run["tasks"], run["attempts"]
    c = counts(run)
    n = c["tasks"]
    mach = s.get("machine", {})
    ex = m["execution"]
    where = (f"{mach.get('os', '?')}, Linux {mach.get('kernel', '?')}, {mach.get('architecture', '?')}, "
             f"{mach.get('cpus', '?')} cores, {mach.get('memory_gib', '?')} GiB; backend {ex['backend']} "
             f"({ex['backend_version']}), image {ex['image']} {ex['image_digest']}, network {ex['network']}, "
             f"user {ex['user']}")
    cfg = m["environment"]["config"]
    pilot = all(str(p).startswith("pilot") for p in tasks["phase"].unique())
    scope = (f"the pilot sample of contract `{m['name']}` (each sampled task under both include_headers "
             f"variants)" if pilot else f"contract `{m['name']}`")
    out: list[Block] = [
        ("h1", f"Validation report — {m['environment']['name']}, run {s['run_id']}"),
        ("p", f"**Claim (scoped):** {_of(c['compatible'], n)} tasks of {scope} passed — the oracle "
              f"reached reward ≥ {m['expectations']['oracle_min_reward']} and every negative control stayed under "
              f"its ceiling, with no infrastructure exception — on {where}. This is evidence for that execution "
              f"profile only; another backend, image or architecture needs its own run."),
        ("h2", "Contract"),
        ("table", ["field", "value"], [
            ["manifest", f"`{m['name']}` {m['sha256']}"],
            ["parent manifest", _fmt(m.get("parent_sha256"))],
            ["frozen child", f"`{run['frozen']['name']}` {run['frozen']['sha256']} (parent {run['frozen']['parent_sha256']})"
             if "frozen" in run else "—"],
            *[["pilot variant", f"`{v['name']}` {v['sha256']} (parent {v['parent_sha256']}); "
                                f"include_headers={v['environment']['config']['include_headers']}; "
                                f"{len(v['tasks'])} tasks"] for v in run["variants"]],
            ["corpus", f"{m['environment']['corpus']['location']} — revision {m['environment']['corpus']['revision']}"],
            ["config", ", ".join(f"{k}={v}" for k, v in sorted(cfg.items()))],
            ["selection", f"{m['selection']['rule']}; seed {m['selection']['seed']}; {len(m['tasks'])} tasks"],
            ["task list sha256", m["task_list_sha256"]],
            ["expected", f"oracle ≥ {m['expectations']['oracle_min_reward']}; controls "
                         f"{', '.join(m['expectations']['control_max_reward'])} must not pass"],
            ["minimum task count", str(m["min_task_count"])],
            ["limits", ", ".join(f"{k}={v}" for k, v in sorted(ex["limits"].items()))],
            ["harness", f"version {m['harness_version']}, commit {m['git_commit']}"],
        ]),
        ("h2", "Counts"),
        ("table", ["what", "count"], [
            ["tasks judged" + (" (sampled tasks × header variants)" if pilot else " (the contract's tasks)"), str(n)],
            ["oracle attempted", _of(c["oracle_attempted"], n)],
            ["oracle passed (exception-free)", _of(c["oracle_passed"], n)],
            *([["frozen for the controls", _of(c["frozen"], n)]] if c["frozen"] is not None else []),
            ["**compatible**", _of(c["compatible"], n)],
            ["excluded", _of(c["excluded"], n)],
            *[[f"excluded: {r}", _of(k, n)] for r, k in c["excluded_by_reason"].items()],
            ["attempts (all, superseded included)", str(c["attempts"])],
            ["superseded attempts", _of(c["superseded"], c["attempts"])],
            ["infrastructure errors (attempts)", _of(c["infrastructure_errors"], c["attempts"])],
        ]),
    ]
    fam = tasks.groupby(["anchor_source", "n_papers"]).agg(tasks=("task_id", "size"), compatible=("compatible", "sum"))
    out += [("h2", "Per family (anchor paper's source × paper count)"),
            ("table", ["source", "papers", "compatible / tasks"],
             [[src, str(k), _of(int(r.compatible), int(r.tasks))] for (src, k), r in fam.iterrows()])]
    final = attempts[~attempts["superseded"]]
    rows = []
    for agent in _agents_in_order(final):
        g = final[final["agent"] == agent]
        r = g["reward"].fillna(0.0)
        rows.append([agent, str(g["expect"].iloc[0]), _of(int(g["as_expected"].sum()), len(g)),
                     f"{r.min():.4f}", f"{statistics.median(r):.4f}", f"{r.max():.4f}"])
    statuses = final.groupby(["agent", "status"]).size()
    out += [("h2", "Rewards: oracle vs each control"),
            ("table", ["agent", "expected", "as expected", "min", "median", "max"], rows),
            ("img", _plot(final), "Box plot of the final reward of each agent"),
            ("table", ["agent", "status", "attempts"], [[a, st, str(k)] for (a, st), k in statuses.items()])]
    if "probes" in run:
        probes = run["probes"]["probes"]
        ok = sum(p["ok"] for p in probes)
        out += [("h2", "Partial-credit probes (pilot)"),
                ("p", f"{_of(ok, len(probes))} probe attempts scored strictly between the controls' median and "
                      f"the oracle's reward."),
                ("table", ["variant", "task", "probe", "reward", "controls' median", "oracle", "ok"],
                 [[p["variant"], p["task_id"], p["probe"], _fmt(p["reward"]), _fmt(p["control_typical"]),
                   _fmt(p["oracle_reward"]), "yes" if p["ok"] else "**NO**"] for p in probes])]
        if "strata" in s:
            out += [("table", ["stratum", "sampled / pool"],
                     [[st["name"], f"{len(st['sampled'])}/{st['pool_tasks']}"] for st in s["strata"]])]
    excl = run["exclusions"]
    out += [("h2", "Exclusion ledger"),
            ("p", f"{_of(len(excl), n)} tasks excluded, one reason each." if len(excl) else "No task was excluded."),
            ("table", ["task", "reason", "detail"], [[r.task_id, r.reason, r.detail] for r in excl.itertuples()])
            if len(excl) else ("p", ""),
            ("h2", "Patches"),
            ("p", "None: no task, verifier, environment or sandbox patch was applied for this run."),
            ("h2", "Superseded and failed attempts"),
            ]
    sup = attempts[attempts["superseded"] | attempts["status"].isin(["infrastructure_error", "scorer_error"])]
    out.append(("table", ["task", "agent", "attempt", "status", "superseded", "error"],
                [[r.task_id, r.agent, str(r.attempt), r.status, str(r.superseded), _fmt(r.error_message)]
                 for r in sup.itertuples()]) if len(sup) else ("p", "None: every attempt is final and exception-free."))
    if s.get("interrupted"):
        out.append(("p", "**This run was interrupted** and its evidence is partial; resume it before relying on it."))
    if "smoke" in run:
        sm = run["smoke"]
        out += [("h2", "Fresh-materialisation smoke test"),
                ("p", f"{'PASSED' if sm['passed'] else '**FAILED**'}: {sm['summary']}")]
    t0, t1 = attempts["started_at"].min(), attempts["finished_at"].max()
    out += [("h2", "Timing"),
            ("p", f"Attempts from {t0} to {t1} ({(t1 - t0).total_seconds():.0f} s of wall time, "
                  f"{len(attempts) / max((t1 - t0).total_seconds(), 1e-9):.2f} attempts/s).")]
    return out


def to_markdown(doc: list[Block]) -> str:
    lines = []
    for b in doc:
        if b[0] in ("h1", "h2"):
            lines += [("# " if b[0] == "h1" else "## ") + b[1], ""]
        elif b[0] == "p" and b[1]:
            lines += [b[1], ""]
        elif b[0] == "table":
            esc = [[str(c).replace("|", "\\|").replace("\n", " ") for c in row] for row in b[2]]
            lines += ["| " + " | ".join(b[1]) + " |", "|" + "---|" * len(b[1])]
            lines += ["| " + " | ".join(r) + " |" for r in esc] + [""]
        elif b[0] == "img":
            lines += [f"*{b[2]}: see report.html.*", ""]
    return "\n".join(lines)


def _inline(text: str) -> str:
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts)).replace("`", "")


def to_html(doc: list[Block]) -> str:
    body = []
    for b in doc:
        if b[0] in ("h1", "h2"):
            body.append(f"<{b[0]}>{html.escape(b[1])}</{b[0]}>")
        elif b[0] == "p" and b[1]:
            body.append(f"<p>{_inline(b[1])}</p>")
        elif b[0] == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{_inline(str(c))}</td>" for c in r) + "</tr>" for r in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif b[0] == "img":
            body.append(f'<img alt="{html.escape(b[2])}" src="data:image/png;base64,{b[1]}">')
    style = ("body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}"
             "table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem;"
             "text-align:left;vertical-align:top;font-size:.9rem}th{background:#f3f3f3}img{max-width:100%}")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Validation report</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write_report(root: Path) -> dict:
    """Write report.md, report.html and report.json into `root`; return the counts."""
    run = load_run(root)
    doc = blocks(run)
    c = counts(run)
    atomic_write(root / "report.md", to_markdown(doc).encode())
    atomic_write(root / "report.html", to_html(doc).encode())
    atomic_write(root / "report.json", json.dumps(c, indent=2, sort_keys=True).encode() + b"\n")
    write_checksums(RunPaths(root))
    return c
