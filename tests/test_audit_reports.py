"""The audit renders every report, smoke result, eval report and comparison again from the
sealed evidence and demands it byte for byte: each forgery below is re-sealed with fresh
checksums (as a forger would) and must fail. Runs made for real through bwrap, or copies of
committed ledgers (their reports rewritten first, so only the forgery differs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import CORPUS_PATH, make_ctx, make_manifest
from validate.audit.run import audit
from validate.core.paths import RunPaths
from validate.evidence.journal import write_checksums
from validate.report.run import write_report
from validate.run.phases import RunPhase, run_agents

DATA = (CORPUS_PATH,)
LEDGERS = Path(__file__).resolve().parents[1] / "ledgers"


def latest(prefix: str) -> Path:
    """The newest committed run whose directory name starts with `prefix` (re-recording renames them)."""
    found = sorted(LEDGERS.glob(f"{prefix}*"))
    assert found, f"no committed run {prefix}* under {LEDGERS}"
    return found[-1]


def reseal(root: Path) -> None:
    write_checksums(RunPaths(root))


def fails(root: Path, *words: str) -> list[str]:
    problems = audit(root, data=DATA).problems
    assert problems, "the audit passed a forged run"
    text = " ".join(problems)
    assert all(w in text for w in words), problems
    return problems


def passes(root: Path) -> list[str]:
    r = audit(root, data=DATA)
    assert r.problems == [], r.problems
    return r.checked


def report_dir(root: Path) -> Path:
    return sorted((root / "reports").iterdir())[-1]


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, count), encoding="utf-8")


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory, sandboxes):
    """A real run whose dataset verdict is FAIL (4 tasks, a minimum of 10), with a report."""
    base = tmp_path_factory.mktemp("rerender")
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[0, 1, 2, 3], max_papers=2, min_task_count=10)
    run_agents(make_ctx(manifest, sandbox, base / "run"), RunPhase())
    _, verdict = write_report(base / "run")
    assert verdict.verdict == "FAIL"
    return base / "run"


@pytest.fixture
def run(failed_run, tmp_path):
    dst = tmp_path / failed_run.name
    shutil.copytree(failed_run, dst)
    return dst


# --- positive ---------------------------------------------------------------------------

@pytest.mark.bwrap
def test_a_fresh_report_audits_clean_and_is_counted(run):
    write_report(run)  # a second report of the same ledgers
    assert "2 reports re-rendered and equal" in passes(run)


@pytest.mark.bwrap
def test_a_report_renders_the_same_wherever_the_run_lies_and_whatever_lies_beside_it(run, tmp_path):
    from validate.report.run import render, report_inputs

    elsewhere = tmp_path / "moved" / "another-name"
    shutil.copytree(run, elsewhere)
    shutil.copytree(run, elsewhere.parent / "a-sibling-of-the-same-contract")
    assert render(elsewhere, report_inputs(elsewhere)) == render(run, report_inputs(run))
    assert (report_dir(run) / "report.md").read_bytes() == render(run, report_inputs(run))["report.md"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, sandboxes):
    """A run, a report, then the same run resumed (which folds attempts.parquet again and
    rewrites tasks.parquet and run.json: its finish time at least), then a second report.
    (A first session of the oracle alone would be a stronger resume, but an incomplete
    verdict does not audit today: its `missing` agents come in contract order from the run
    and in another order from the audit's re-derivation.)"""
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[0, 1], max_papers=2)
    root = tmp_path_factory.mktemp("resumed") / "run"
    run_agents(make_ctx(manifest, sandbox, root), RunPhase())
    write_report(root)
    before = (root / "run.json").read_bytes()
    run_agents(make_ctx(manifest, sandbox, root), RunPhase())
    assert (root / "run.json").read_bytes() != before
    kept = list((root / "earlier").iterdir())
    assert len(kept) == 1 and (kept[0] / "run.json").read_bytes() == before
    write_report(root)
    return root


@pytest.fixture
def resumed_copy(resumed, tmp_path):
    dst = tmp_path / resumed.name
    shutil.copytree(resumed, dst)
    return dst


@pytest.mark.bwrap
def test_a_resumed_run_keeps_the_ledgers_of_its_earlier_report(resumed_copy):
    """The earlier report is rendered again from the copy kept in earlier/ (itself audited);
    without that copy the audit fails, naming the report."""
    assert "2 reports re-rendered and equal" in passes(resumed_copy)
    first = sorted((resumed_copy / "reports").iterdir())[0]
    shutil.rmtree(resumed_copy / "earlier")
    reseal(resumed_copy)
    fails(resumed_copy, str(first / "report.json"), "cannot be rendered again")


def _forge_earlier(root: Path, change) -> Path:
    """Forged 'earlier' ledgers: the run's own, changed by `change(dir)`, placed where a resume
    keeps them, with a report rendered from them and everything re-sealed."""
    from validate.evidence.journal import atomic_write, file_sha256, ledger_key, new_entry
    from validate.report.run import render, report_inputs

    names = report_inputs(root)
    stage = root.parent / "stage"
    for n in names:
        (stage / n).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / n, stage / n)
    change(stage)
    key = ledger_key({n: file_sha256(stage / n) for n in names})
    (root / "earlier").mkdir(exist_ok=True)
    stage.rename(root / "earlier" / key)
    entry = new_entry(root / "reports")
    for name, data in render(root / "earlier" / key, names).items():
        atomic_write(entry / name, data)
    reseal(root)
    return root / "earlier" / key


def _edit_rows(path: Path, fn) -> None:
    table = pq.read_table(path)
    pq.write_table(pa.Table.from_pylist(fn(table.to_pylist()), schema=table.schema), path)


@pytest.mark.bwrap
def test_forged_earlier_ledgers_with_a_verdict_flipped(run):
    def change(stage):
        def flip(rows):
            rows[0].update(verdict="excluded", reason="oracle_fails_on_valid_task")
            return rows
        _edit_rows(stage / "tasks.parquet", flip)

    kept = _forge_earlier(run, change)
    fails(run, f"{kept} (the ledgers of an earlier report)", "verdict excluded")


@pytest.mark.bwrap
def test_forged_earlier_ledgers_with_an_attempt_the_run_never_made(run):
    def change(stage):
        def add(rows):
            return [*rows, {**rows[0], "attempt": 7}]
        _edit_rows(stage / "attempts.parquet", add)

    kept = _forge_earlier(run, change)
    fails(run, str(kept / "attempts.parquet"), "not among the run's own")


# --- forged reports ---------------------------------------------------------------------

@pytest.mark.bwrap
def test_verdict_flipped_in_md_and_html_with_the_ledger_hashes_zeroed(run):
    entry = report_dir(run)
    for name in ("report.md", "report.html"):
        text = (entry / name).read_text()
        start = text.index("Dataset verdict: FAIL")
        end = text.index("</strong>" if name == "report.html" else "**", start)
        (entry / name).write_text(text[:start] + "Dataset verdict: PASS" + text[end:])
    record = json.loads((entry / "report.json").read_text())
    record["dataset_verdict"]["verdict"] = "PASS"
    record["ledgers"] = {k: "0" * 64 for k in record["ledgers"]}
    (entry / "report.json").write_text(json.dumps(record, indent=2) + "\n")
    reseal(run)
    fails(run, "report.json", "cannot be rendered again")


@pytest.mark.bwrap
def test_verdict_flipped_in_md_and_html_alone(run):
    entry = report_dir(run)
    edit(entry / "report.md", "**Dataset verdict: FAIL", "**Dataset verdict: PASS")
    edit(entry / "report.html", "<strong>Dataset verdict: FAIL", "<strong>Dataset verdict: PASS")
    reseal(run)
    fails(run, "report.md: is not what its evidence renders", "report.html: is not what its evidence renders")


@pytest.mark.bwrap
def test_the_ledgers_edited_after_the_report(run):
    """Before: any edit to attempts.parquet sent every report down an unchecked path."""
    table = pq.read_table(run / "attempts.parquet")
    rows = table.to_pylist()
    rows[0]["runtime_s"] = (rows[0]["runtime_s"] or 0) + 1
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), run / "attempts.parquet")
    reseal(run)
    fails(run, str(report_dir(run) / "report.json"), "cannot be rendered again")


@pytest.mark.bwrap
def test_claim_prose_edited(run):
    edit(report_dir(run) / "report.md", "This is evidence for that execution profile only.",
         "This is evidence for every machine.")
    reseal(run)
    fails(run, "report.md", "first difference")


@pytest.mark.bwrap
def test_a_second_dataset_verdict_heading(run):
    md = report_dir(run) / "report.md"
    md.write_text("# Dataset verdict: PASS\n\n" + md.read_text())
    reseal(run)
    fails(run, "report.md: is not what its evidence renders", "first difference at byte 2")


@pytest.mark.bwrap
def test_a_second_counts_table(run):
    md = report_dir(run) / "report.md"
    md.write_text(md.read_text() + "\n## Counts\n\n| what | count |\n|---|---|\n| compatible | 1000/1000 |\n")
    reseal(run)
    fails(run, "report.md")


@pytest.mark.bwrap
def test_a_style_that_hides_the_verdict_and_shows_a_forged_one(run):
    edit(report_dir(run) / "report.html", "</style>",
         "p:nth-of-type(1) strong{display:none}p:nth-of-type(1)::after{content:'Dataset "
         "verdict: PASS'}</style>")
    reseal(run)
    fails(run, "report.html", "first difference")


@pytest.mark.bwrap
def test_an_injected_script(run):
    edit(report_dir(run) / "report.html", "</body>", "<script>document.body.innerHTML='PASS'</script></body>")
    reseal(run)
    fails(run, "report.html")


@pytest.mark.bwrap
def test_an_extra_file_in_a_report_entry(run):
    (report_dir(run) / "index.html").write_text("<p>Dataset verdict: PASS</p>")
    reseal(run)
    fails(run, "index.html", "which its renderer does not write")


@pytest.mark.bwrap
def test_a_stray_page_beside_the_report_entries(run):
    (run / "reports" / "latest.html").write_text("<p>Dataset verdict: PASS</p>")
    reseal(run)
    fails(run, "latest.html: not an entry")


@pytest.mark.bwrap
def test_an_unknown_renderer_version(run):
    entry = report_dir(run)
    edit(entry / "report.json", '"renderer": "run-report/2"', '"renderer": "run-report/99"')
    reseal(run)
    fails(run, "renderer 'run-report/99'", "write a new one")


# --- smoke results, eval reports, comparisons: copies of committed ledgers ----------------

def _pool_with_a_fresh_report(tmp_path: Path) -> Path:
    src = latest("twohop-pool-")
    root = tmp_path / src.name
    shutil.copytree(src, root)
    shutil.rmtree(root / "reports")  # written by an earlier renderer: replaced, so only the forgery differs
    write_report(root)
    passes(root)
    return root


def test_an_edited_smoke_result(tmp_path):
    root = _pool_with_a_fresh_report(tmp_path)
    result = next((root / "smoke").glob("*/result.json"))
    edit(result, "attempts of the installed wheel",
         "attempts (every task of the pool) of the installed wheel")
    reseal(root)
    fails(root, str(result), "does not derive again from the two ledgers")


def _eval_copy(tmp_path: Path, name: str) -> Path:
    from validate.eval.report import write_report as write_eval_report

    root = tmp_path / "ledgers" / name
    shutil.copytree(LEDGERS / name, root)
    shutil.rmtree(root / "reports")
    write_eval_report(root)
    return root


EVALS = tuple(latest(f"eval-baseline-t{t}-eval-").name for t in ("0.7", "1.0"))


def test_an_edited_eval_report(tmp_path):
    from validate.audit.eval import audit as eval_audit

    root = _eval_copy(tmp_path, EVALS[0])
    r = eval_audit(root)
    assert r.problems == [] and "1 eval reports re-rendered and equal" in r.checked, r.problems
    entry = report_dir(root)
    edit(entry / "report.html", "</h1>", "</h1><p>Reviewed and approved.</p>")
    reseal(root)
    problems = eval_audit(root).problems
    assert any(str(entry / "report.html") in p for p in problems), problems


def test_an_edited_comparison(tmp_path):
    from validate.audit.eval import audit as eval_audit
    from validate.audit.reports import audit_compare
    from validate.eval.compare import compare

    a, b = (_eval_copy(tmp_path, n) for n in EVALS)
    _, entry = compare(a, b, out=tmp_path / "ledgers" / "compare" / f"{a.name}--{b.name}")
    r = audit_compare(entry)
    assert r.problems == [] and "1 comparisons re-rendered and equal" in r.checked, r.problems
    assert "1 comparisons re-rendered and equal" in eval_audit(a).checked
    md = entry / "compare.md"
    text = md.read_text()
    line = next(x for x in text.splitlines() if x.startswith("| pass@1 (greedy)"))
    md.write_text(text.replace(line, "| pass@1 (greedy) | 10.0 % (1/10) | 90.0 % (9/10) | +0.8000 |"))
    write_checksums(RunPaths(entry))
    assert any(str(md) in p and "Overall table" in p for p in audit_compare(entry).problems)
    assert any(str(md) in p for p in eval_audit(a).problems)


def test_a_comparison_whose_runs_changed_since(tmp_path):
    from validate.audit.reports import audit_compare
    from validate.eval.compare import compare

    a, b = (_eval_copy(tmp_path, n) for n in EVALS)
    _, entry = compare(a, b, out=tmp_path / "ledgers" / "compare" / f"{a.name}--{b.name}")
    summary = json.loads((b / "eval.json").read_text())
    (b / "eval.json").write_text(json.dumps(summary, indent=1))
    problems = audit_compare(entry).problems
    assert any("eval.json" in p and "cannot be computed again" in p for p in problems), problems


def test_forged_earlier_eval_ledgers(tmp_path):
    """An eval report rendered from a made-up 'earlier' eval.json (a resume would have kept
    the real one there) fails: the copy does not pass the eval audit."""
    from validate.audit.eval import audit as eval_audit
    from validate.eval.report import EVAL_INPUTS, render
    from validate.evidence.journal import atomic_write, file_sha256, ledger_key, new_entry

    root = _eval_copy(tmp_path, EVALS[0])
    stage = tmp_path / "stage"
    stage.mkdir()
    for n in EVAL_INPUTS:
        shutil.copyfile(root / n, stage / n)
    summary = json.loads((stage / "eval.json").read_text())
    summary["greedy"]["pass_at_1"]["numerator"] = summary["greedy"]["pass_at_1"]["denominator"]
    summary["greedy"]["pass_at_1"]["value"] = 1.0
    (stage / "eval.json").write_text(json.dumps(summary, indent=2) + "\n")
    kept = root / "earlier" / ledger_key({n: file_sha256(stage / n) for n in EVAL_INPUTS})
    kept.parent.mkdir()
    stage.rename(kept)
    entry = new_entry(root / "reports")
    for name, data in render(kept).items():
        atomic_write(entry / name, data)
    assert "pass@1 (greedy, temperature 0) 100.0 %" in (entry / "report.md").read_text()
    reseal(root)
    problems = eval_audit(root).problems
    assert any(p.startswith(f"{kept} (the ledgers of an earlier report)") and "eval.json" in p
               for p in problems), \
        problems
