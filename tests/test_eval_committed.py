"""The committed eval evidence checks out: every eval run under ledgers/ passes `validate eval
audit` (classes, metrics and reports re-derived), on a pool that passed; the required evals
(greedy pass@1 and pass@8 over at least 200 tasks, through docker) and a comparison of two
sampling settings are there; and a touched file fails the audit, naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from validate.audit.eval import audit
from validate.contract.manifest import load_manifest
from validate.core.errors import ContractError
from validate.eval.contract import load
from validate.evidence.run import current_verdict, load_run

LEDGERS = Path(__file__).resolve().parents[1] / "ledgers"
EVALS = sorted(p for p in LEDGERS.iterdir() if (p / "eval-contract.json").is_file())


@pytest.mark.parametrize("run_dir", EVALS, ids=[p.name for p in EVALS])
def test_committed_eval_passes_audit(run_dir):
    result = audit(run_dir)
    stale = [p for p in result.problems if "names no renderer version" in p]
    assert not stale, (f"{run_dir.name}: its report or a comparison naming it was written before the audit "
                       "rendered them again byte for byte; re-record them (`validate eval report`, `validate "
                       "compare`) and commit the new entries", stale)
    assert result.problems == [], result.problems


def test_the_required_evals_and_their_pool_are_committed():
    big = []
    for run_dir in EVALS:
        contract = load(run_dir / "eval-contract.json")
        summary = json.loads((run_dir / "eval.json").read_text())
        pool = LEDGERS / contract.parent.pool_run_id
        ev = load_run(pool)
        assert current_verdict(ev.summary, ev.smokes).verdict == "PASS"
        assert load_manifest(pool / "frozen-manifest.json").sha256 == contract.parent.manifest_sha256
        if summary["greedy"]["tasks"] >= 200 and contract.k == 8 and summary["backend"] == "docker":
            big.append(summary)
    assert len(big) >= 2
    for s in big:
        assert s["greedy"]["valid"] + sum(s["greedy"]["lost"].values()) == s["greedy"]["tasks"]
        assert s["sampled"]["eligible"] + len(s["sampled"]["excluded"]) == s["sampled"]["tasks"]
        assert s["attempts"] >= s["greedy"]["tasks"] * 9


def test_a_comparison_of_two_sampling_settings_is_committed():
    entries = sorted((LEDGERS / "compare").glob("*/*/compare.json"))
    assert entries
    compares = [json.loads(e.read_text()) for e in entries]  # every entry, not only the last in name order
    for c in compares:
        assert (LEDGERS / c["run_a"]).is_dir() and (LEDGERS / c["run_b"]).is_dir()
        assert [v[0] for v in c["varied"]] == ["sampling.temperature"]
    assert any(len(c["tasks"]) >= 200 for c in compares)


@pytest.mark.parametrize("name", ["samples.parquet", "eval.json", "trajectories.parquet"])
def test_one_changed_byte_fails_the_audit_naming_the_file(tmp_path, name):
    copy = tmp_path / EVALS[0].name
    shutil.copytree(EVALS[0], copy)
    data = bytearray((copy / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / name).write_bytes(bytes(data))
    problems = audit(copy).problems
    assert any(name in p for p in problems), problems


def test_an_edited_contract_is_refused_by_its_own_hash(tmp_path):
    raw = json.loads((EVALS[0] / "eval-contract.json").read_text())
    raw["sampling"]["temperature"] = 0.1
    (tmp_path / "c.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="field 'sha256'"):
        load(tmp_path / "c.json")


def test_a_malformed_or_non_utf8_checksums_line_is_a_finding_not_a_crash(tmp_path):
    # The eval audit runs the dataset audit's seal check (`validate.audit.run.check_seal`); its own
    # copy skipped lines without a digest and raised UnicodeDecodeError on a non-UTF-8 file.
    copy = tmp_path / EVALS[0].name
    shutil.copytree(EVALS[0], copy)
    with (copy / "checksums").open("ab") as f:
        f.write(b"not-a-digest  eval.json\n\xff\xfe  x\n")
    problems = audit(copy).problems
    assert any("checksums line" in p and "malformed" in p for p in problems), problems
