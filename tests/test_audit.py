"""`validate audit` re-derives everything: each edit below is re-sealed with fresh checksums
(as a forger would) and must still fail the audit. A run through real bwrap, real Parquet."""

from __future__ import annotations

import json
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import CORPUS_PATH, make_ctx
from validate.audit.run import audit
from validate.contract.manifest import load_manifest
from validate.core.paths import RunPaths
from validate.evidence.journal import write_checksums
from validate.report.run import write_report
from validate.run.phases import RunPhase, run_agents

pytestmark = pytest.mark.bwrap
DATA = (CORPUS_PATH,)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sandboxes, reported_pool):
    """A run (oracle and every control) and a pool (smoke skipped, a copy of the session's
    reported pool: tests/conftest.py) of one contract, each with a report."""
    base = tmp_path_factory.mktemp("audit")
    sandbox = sandboxes("bwrap")
    shutil.copytree(reported_pool, base / "pool")
    manifest = load_manifest(base / "pool" / "manifest.json")
    run_agents(make_ctx(manifest, sandbox, base / "run"), RunPhase())
    write_report(base / "run")
    for name in ("run", "pool"):
        assert audit(base / name, data=DATA).problems == []
    return base


@pytest.fixture
def run(runs, tmp_path):
    return _copy(runs / "run", tmp_path)


@pytest.fixture
def pooled(runs, tmp_path):
    return _copy(runs / "pool", tmp_path)


def _copy(src, tmp_path):
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    assert audit(dst, data=DATA).problems == [], "a plain copy must pass"
    return dst


def edit_table(path, fn):
    table = pq.read_table(path)
    rows = fn(table.to_pylist())
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)


def reseal(root):
    write_checksums(RunPaths(root))


def fails(root, *words):
    problems = audit(root, data=DATA).problems
    assert problems, "the audit passed a forged run"
    text = " ".join(problems)
    assert all(w in text for w in words), problems
    return problems


def report_dir(root):
    return sorted((root / "reports").iterdir())[-1]


# --- the six forgeries ----------------------------------------------------------

def test_a_control_reward_raised_to_one_while_the_task_stays_compatible(run):
    def edit(rows):
        row = next(r for r in rows if r["agent"] == "shuffled")
        row.update(reward=1.0, as_expected=True)
        return rows

    edit_table(run / "attempts.parquet", edit)
    reseal(run)
    fails(run, "verdict compatible", "invalid_task_or_verifier")


def test_a_control_row_deleted_and_the_report_regenerated(run):
    edit_table(run / "attempts.parquet",
               lambda rows: [r for r in rows if not (r["agent"] == "reversed" and r["idx"] == 1)])
    reseal(run)
    write_report(run)
    fails(run, "incomplete")


def test_one_task_removed_with_its_verdict_and_attempts(run):
    gone = pq.read_table(run / "tasks.parquet").to_pylist()[2]["task_id"]
    edit_table(run / "attempts.parquet", lambda rows: [r for r in rows if r["task_id"] != gone])
    edit_table(run / "tasks.parquet", lambda rows: [r for r in rows if r["task_id"] != gone])
    reseal(run)
    fails(run, "exactly once")


def test_a_verdict_flipped(run):
    def edit(rows):
        rows[0].update(verdict="excluded", reason="oracle_fails_on_valid_task")
        return rows

    edit_table(run / "tasks.parquet", edit)
    reseal(run)
    fails(run, "verdict excluded")


def test_an_attempt_pointed_at_another_tasks_hash(run):
    def edit(rows):
        other = next(r["task_hash"] for r in rows if r["idx"] == 1)
        next(r for r in rows if r["idx"] == 0 and r["agent"] == "empty")["task_hash"] = other
        return rows

    edit_table(run / "attempts.parquet", edit)
    reseal(run)
    fails(run, "task hash that is not the contract's")


def test_the_reports_claim_changed(run):
    md = report_dir(run) / "report.md"
    md.write_text(md.read_text().replace("| compatible | 4/4", "| compatible | 973/1000"))
    reseal(run)
    fails(run, "report.md", "Counts table")


# --- more forgeries ---------------------------------------------------------------------

def test_the_dataset_verdict_in_run_json_edited(pooled):
    summary = json.loads((pooled / "run.json").read_text())
    assert summary["dataset_verdict"]["verdict"] == "INCOMPLETE"  # the smoke test was skipped
    summary["dataset_verdict"]["verdict"] = "PASS"
    summary["dataset_verdict"]["evidence"] = "complete"
    (pooled / "run.json").write_text(json.dumps(summary))
    reseal(pooled)
    fails(pooled, "does not follow from its facts")


def test_a_verdict_of_a_phase_no_group_covers(run):
    """A verdict row under a phase run.json never judged is not re-derived, so it is refused."""
    def edit(rows):
        return [*rows, {**rows[0], "phase": "elsewhere"}]

    edit_table(run / "tasks.parquet", edit)
    reseal(run)
    fails(run, "which no verdict group of run.json covers")


def test_a_smoke_pass_claimed_in_run_json_without_its_smoke_evidence(pooled):
    """run.json says the smoke test passed (its verdict recomputed to match) while smoke/ holds
    no entry: the report must not print PASS from run.json's word, and the audit names it."""
    from validate.evidence.run import current_verdict
    from validate.evidence.summary import RunSummary
    from validate.evidence.verdicts import dataset_verdict

    s = RunSummary.model_validate_json((pooled / "run.json").read_bytes())
    assert not (pooled / "smoke").exists() and s.facts.smoke == "not run"
    facts = s.facts.model_copy(update={"smoke": "passed"})
    forged = s.model_copy(update={"facts": facts, "dataset_verdict": dataset_verdict(facts, s.required)})
    assert forged.dataset_verdict.verdict == "PASS"
    (pooled / "run.json").write_text(forged.model_dump_json())
    assert current_verdict(forged, {}).verdict == "INCOMPLETE"  # from the entries that exist
    reseal(pooled)
    fails(pooled, "facts.smoke is 'passed' but the smoke entries say 'not run'")


def test_run_json_counts_edited(run):
    summary = json.loads((run / "run.json").read_text())
    summary["counts"]["compatible"] += 1
    summary["facts"]["compatible"] += 1
    (run / "run.json").write_text(json.dumps(summary))
    reseal(run)
    fails(run, "counts")


def test_an_exclusion_added_to_the_ledger_alone(run):
    """tasks.parquet untouched: only the exclusion ledger names a compatible task."""
    task = pq.read_table(run / "tasks.parquet").to_pylist()[1]
    assert task["verdict"] == "compatible"
    table = pq.read_table(run / "exclusions.parquet")
    row = {name: task.get(name) for name in table.schema.names}
    row.update(reason="invalid_task_or_verifier", detail="forged")
    pq.write_table(pa.Table.from_pylist([*table.to_pylist(), row], schema=table.schema),
                   run / "exclusions.parquet")
    reseal(run)
    problems = fails(run, "exclusions.parquet")
    assert not any("tasks.parquet" in p for p in problems), problems


def test_as_expected_flipped_on_a_control(run):
    def edit(rows):
        next(r for r in rows if r["agent"] == "identity")["as_expected"] = False
        return rows

    edit_table(run / "attempts.parquet", edit)
    reseal(run)
    fails(run, "as_expected")


def test_a_superseded_flag_flipped(run):
    def edit(rows):
        rows[0]["superseded"] = True
        return rows

    edit_table(run / "attempts.parquet", edit)
    reseal(run)
    fails(run, "superseded flags")


def test_the_frozen_set_narrowed_and_resealed(pooled):
    from validate.contract.manifest import load_manifest, task_list_sha256

    frozen = load_manifest(pooled / "frozen-manifest.json")
    fake = frozen.model_copy(update={"tasks": frozen.tasks[:-1]})
    (pooled / "frozen-manifest.json").write_bytes(
        fake.model_copy(
            update={
                "task_list_sha256": task_list_sha256(fake.tasks),
                "selection": fake.selection.model_copy(update={"idx": [t.idx for t in fake.tasks]}),
            }
        )
        .sealed()
        .to_json()
    )
    summary = json.loads((pooled / "run.json").read_text())
    summary["frozen_manifest_sha256"] = json.loads((pooled / "frozen-manifest.json").read_text())["sha256"]
    (pooled / "run.json").write_text(json.dumps(summary))
    reseal(pooled)
    fails(pooled, "frozen set is not exactly the oracle's exception-free passes")


def test_a_blocking_finding_removed_from_a_verdict(run):
    def edit(rows):
        rows[0]["findings"] = [{"kind": "made_up", "blocking": False, "detail": "forged"}]
        return rows

    edit_table(run / "tasks.parquet", edit)
    reseal(run)
    fails(run, "stored findings differ")


def test_the_html_report_edited(run):
    page = report_dir(run) / "report.html"
    page.write_text(page.read_text().replace("<td>compatible</td><td>4/4", "<td>compatible</td><td>5/4"))
    reseal(run)
    fails(run, "report.html")


def test_a_change_without_resealing_names_the_file(run):
    (run / "tasks.parquet").write_bytes((run / "tasks.parquet").read_bytes() + b"x")
    fails(run, "tasks.parquet", "sha256 does not match")


# --- signatures -------------------------------------------------------------------------

def test_signed_checksums_verify_and_a_later_edit_breaks_them(run, tmp_path):
    from validate.evidence.signing import sign

    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "reviewer", "-f", str(key)],
                   check=True)
    signers = tmp_path / "allowed_signers"
    signers.write_text("validate " + (tmp_path / "key.pub").read_text())
    sign(run, key)
    assert audit(run, signature=signers, data=DATA).problems == []
    assert audit(run, signature=signers, identity="someone-else", data=DATA).problems
    checksums = run / "checksums"
    checksums.write_text(checksums.read_text().replace("a", "b", 1))
    problems = audit(run, signature=signers, data=DATA).problems
    assert any("checksums.sig" in p and "does not verify" in p for p in problems)
