"""`validate compare RUN_A RUN_B`: two evals of the same dataset contract, task by task.

Two evals compare only when they measured the same thing: the same frozen dataset manifest
(so the same tasks, hashes, execution profile), the same reward code and pass threshold,
and the same k. Any other difference of their eval contracts (the model, its sampling, the
prompts, the limits) is what the comparison is about: it is listed field by field. A
refusal names the first field that differs.

The comparison (``compare.md``, ``compare.html``, ``compare.json`` in a new entry under
``--out``, by default ``ledgers/compare/<A>--<B>/<UTC time>/``, sealed with checksums)
holds the overall deltas (B − A) of pass@1, pass@k, mean accuracy and zero-variance
counts with their denominators, per-family deltas, and per-task deltas of the greedy
reward and the sampled mean reward, largest changes first. compare.json names the
renderer's version and each file of A and B it was computed from (``A/eval.json`` → sha256
…); `comparison` and `render` are pure functions of those files, so the eval audit computes
and renders the entry again and demands all three files byte for byte
(`validate.audit.reports`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field

from validate.core.errors import ValidateError
from validate.core.paths import COMPARE_HTML, COMPARE_JSON, COMPARE_MD, LEDGER_DIR, RunPaths
from validate.core.records import AGENT_STATUSES
from validate.core.render import to_html, to_markdown
from validate.eval.contract import differences
from validate.eval.metrics import GREEDY_PHASE
from validate.eval.render import STYLE
from validate.eval.report import EVAL_INPUTS, EvalEvidence, load_eval, mean, pct
from validate.evidence.journal import atomic_write, file_sha256, new_entry, write_checksums

#: Fields of the eval contract two compared evals must share.
MUST_MATCH = ("parent.manifest_sha256", "parent.task_count", "reward", "k")


class TaskDelta(BaseModel):
    task_id: str = Field(description="The task.")
    family: str = Field(description="Its family.")
    greedy_a: float | None = Field(description="A's greedy reward (None: lost).")
    greedy_b: float | None = Field(description="B's greedy reward.")
    sampled_a: float | None = Field(description="A's mean sampled reward over valid samples.")
    sampled_b: float | None = Field(description="B's.")
    solved_a: str = Field(description="A's solved/valid samples.")
    solved_b: str = Field(description="B's.")

    @property
    def delta(self) -> float:
        d = [y - x for x, y in ((self.greedy_a, self.greedy_b), (self.sampled_a, self.sampled_b))
             if x is not None and y is not None]
        return max(d, key=abs, default=0.0)


class Comparison(BaseModel):
    run_a: str = Field(description="A's run id.")
    run_b: str = Field(description="B's run id.")
    contract_a: str = Field(description="A's eval contract sha256.")
    contract_b: str = Field(description="B's eval contract sha256.")
    dataset: str = Field(description="The shared frozen dataset manifest.")
    varied: list[tuple[str, str, str]] = Field(description="(field, A's value, B's value) of every contract "
                                                           "field that differs.")
    overall: list[tuple[str, str, str, str]] = Field(description="(metric, A, B, B − A).")
    families: list[tuple[str, str, str, str, str]] = Field(description="(family, pass@1 A, B, pass@k A, B).")
    tasks: list[TaskDelta] = Field(description="Per task, largest change first.")
    renderer: str = Field(description="The renderer's version (`RENDERER` when written).")
    ledgers: dict[str, str] = Field(description="Each file of A and B it was computed from (``A/…``, "
                                                "``B/…``) → its sha256.")


#: This renderer's version; the audit knows only this one (bump it whenever a change here
#: changes a byte of a comparison).
RENDERER = "compare/2"


def _check(a: EvalEvidence, b: EvalEvidence) -> list[str]:
    diff = differences(a.contract, b.contract)
    for field in diff:
        if any(field == m or field.startswith(m + ".") for m in MUST_MATCH):
            raise ValidateError(f"compare: the eval contracts differ in {field} (A: {_value(a, field)!r}, B: "
                                f"{_value(b, field)!r}); only evals of the same dataset contract, "
                                "reward and k compare")
    return diff


def _value(ev: EvalEvidence, field: str) -> object:
    value: object = ev.contract.model_dump(mode="json")
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _delta(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None else f"{b - a:+.4f}"


def _greedy(ev: EvalEvidence) -> dict[str, float | None]:
    g = ev.attempts[(ev.attempts["phase"] == GREEDY_PHASE) & ~ev.attempts["superseded"]]
    valid = g["status"].isin(list(AGENT_STATUSES))
    rows = zip(g["task_id"], g["reward"], valid, strict=True)
    return {t: (None if not v or pd.isna(r) else float(r)) for t, r, v in rows}


def compare(run_a: Path, run_b: Path, out: Path | None = None) -> tuple[Comparison, Path]:
    """The comparison of two eval runs, and the entry it was written to."""
    result = comparison(run_a, run_b)
    return result, write(result, out if out is not None
                         else LEDGER_DIR / "compare" / f"{result.run_a}--{result.run_b}")


def comparison(run_a: Path, run_b: Path) -> Comparison:
    """The comparison of two eval runs from their evidence alone."""
    a, b = load_eval(run_a), load_eval(run_b)
    varied = _check(a, b)
    sa, sb = a.summary, b.summary
    shown = lambda name, r: mean(r) if "reward" in name else pct(r)  # noqa: E731 - rewards are means, not rates
    overall = [(name, shown(name, x), shown(name, y), _delta(x.value, y.value)) for name, x, y in (
        ("pass@1 (greedy)", sa.greedy.pass_at_1, sb.greedy.pass_at_1),
        (f"pass@{sa.sampled.k}", sa.sampled.pass_at_k, sb.sampled.pass_at_k),
        ("mean sample accuracy", sa.sampled.mean_accuracy, sb.sampled.mean_accuracy),
        (f"pass^{sa.sampled.k}", sa.sampled.pass_hat_k, sb.sampled.pass_hat_k),
        ("mean sampled reward", sa.sampled.mean_reward, sb.sampled.mean_reward),
        (f"mean best-of-{sa.sampled.k} reward", sa.sampled.best_reward, sb.sampled.best_reward),
        ("mean within-task reward std", sa.sampled.reward_std, sb.sampled.reward_std),
        ("mean greedy reward", sa.greedy.mean_reward, sb.greedy.mean_reward))]
    overall.append(("zero-variance groups", f"{sa.sampled.zero_variance}/{sa.sampled.eligible}",
                    f"{sb.sampled.zero_variance}/{sb.sampled.eligible}",
                    f"{sb.sampled.zero_variance - sa.sampled.zero_variance:+d}"))
    fb = {f.family: f for f in sb.families}
    families = [(f.family, pct(f.greedy_pass_at_1), pct(fb[f.family].greedy_pass_at_1), pct(f.pass_at_k),
                 pct(fb[f.family].pass_at_k)) for f in sa.families if f.family in fb]
    ga, gb = _greedy(a), _greedy(b)
    tb = b.tasks.set_index("task_id")
    tasks = []
    for t in a.tasks.itertuples():
        u = tb.loc[t.task_id]
        tasks.append(TaskDelta(task_id=t.task_id, family=t.family, greedy_a=ga.get(t.task_id),
                               greedy_b=gb.get(t.task_id), sampled_a=None if pd.isna(t.mean_reward)
                               else t.mean_reward, sampled_b=None if pd.isna(u["mean_reward"])
                               else u["mean_reward"], solved_a=f"{t.solved}/{t.n_valid}",
                               solved_b=f"{u['solved']}/{u['n_valid']}"))
    tasks.sort(key=lambda d: (-abs(d.delta), d.task_id))
    ledgers = {f"{side}/{n}": file_sha256(Path(d) / n) for side, d in (("A", run_a), ("B", run_b))
               for n in EVAL_INPUTS}
    return Comparison(run_a=sa.run_id, run_b=sb.run_id, contract_a=a.contract.sha256,
                      contract_b=b.contract.sha256, dataset=a.contract.parent.manifest_sha256,
                      varied=[(f, str(_value(a, f)), str(_value(b, f))) for f in varied],
                      overall=overall, families=families, tasks=tasks, renderer=RENDERER, ledgers=ledgers)


def blocks(c: Comparison) -> list:
    return [("h1", f"Comparison — {c.run_a} (A) vs {c.run_b} (B)"),
            ("p", [f"Same frozen dataset {c.dataset}, reward code and k; contracts {c.contract_a} (A) and "
                   f"{c.contract_b} (B). Deltas are B − A."]),
            ("h2", "What differs between the two contracts"),
            ("table", ["field", "A", "B"], [list(v) for v in c.varied] or [["none", "", ""]]),
            ("h2", "Overall"), ("table", ["metric", "A", "B", "B − A"], [list(r) for r in c.overall]),
            ("h2", "Per family"), ("table", ["family", "pass@1 A", "pass@1 B", "pass@k A", "pass@k B"],
                                   [list(r) for r in c.families]),
            ("h2", "Per task (largest change first)"),
            ("table", ["task", "family", "greedy A", "greedy B", "Δ greedy", "sampled A", "sampled B",
                       "Δ sampled", "solved A", "solved B"],
             [[t.task_id, t.family, _f(t.greedy_a), _f(t.greedy_b), _delta(t.greedy_a, t.greedy_b),
               _f(t.sampled_a), _f(t.sampled_b), _delta(t.sampled_a, t.sampled_b), t.solved_a, t.solved_b]
              for t in c.tasks])]


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.4f}"


def render(c: Comparison) -> dict[str, bytes]:
    """The entry's three files, from the comparison alone."""
    doc = blocks(c)
    return {COMPARE_MD: to_markdown(doc).encode(),
            COMPARE_HTML: to_html(doc, "Eval comparison", STYLE).encode(),
            COMPARE_JSON: c.model_dump_json(indent=2).encode() + b"\n"}


def write(c: Comparison, where: Path) -> Path:
    entry = new_entry(where)
    for name, data in render(c).items():
        atomic_write(entry / name, data)
    write_checksums(RunPaths(entry))  # the entry is sealed as a run directory is
    return entry
