"""No PASS without a negative control: a contract names at least one control (freeze refuses
one that names none, and such a manifest does not load); a task every named control is frozen
out of is excluded as `no_negative_control`, counted and re-derived by the audit; and an eval
refuses a pool whose frozen set holds a task no control tested. A real pool through real
bwrap on twohop-env, where `always-unknown` is frozen out of the broken tasks (whose answer
is `unknown`)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environment.protocol import canonical_json, sha256_tag
from tests.conftest import ROOT, VALIDATE, make_ctx, make_manifest, subprocess_env
from validate.audit.run import audit
from validate.contract.manifest import agent_entries, parse_manifest
from validate.core import environments
from validate.core.errors import ContractError
from validate.core.paths import RunPaths
from validate.eval.freeze import parent_of
from validate.evidence.journal import write_checksums
from validate.evidence.verdicts import Outcome, Rule, decide
from validate.report.run import write_report
from validate.run.phases import PoolPhase, pool

TWOHOP = "twohop-env"
#: Two tasks always-unknown can test (answers a name) and one it cannot (answer `unknown`).
TESTABLE, UNTESTABLE = (1, 5), 6


def cli(*args, cwd):
    return subprocess.run([*VALIDATE, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=subprocess_env())


@pytest.mark.parametrize("controls", ["", " , "])
def test_freeze_refuses_a_contract_naming_no_control(tmp_path, controls):
    r = cli("freeze", "--name", "nc", "--env", TWOHOP, "--idx-stop", "3", "--controls", controls,
            "--backend", "bwrap", "--allow-patch", "--out", str(tmp_path / "nc.json"), cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--controls" in lines[0] and "at least one negative control" in lines[0], (
        r.stderr
    )
    assert "Traceback" not in r.stderr and not (tmp_path / "nc.json").exists()


def test_the_api_refuses_it_too_and_names_the_controls_to_choose_from():
    env = environments.get(TWOHOP)
    with pytest.raises(ContractError, match=r"--controls: .*at least one negative control.*always-unknown"):
        agent_entries(env, env.Config(), [], {})


def test_a_manifest_naming_no_control_does_not_load(tmp_path):
    """A hand-made contract (its sha256 recomputed) without controls is refused on reading."""
    from validate.core.jsonio import loads

    raw = loads((ROOT / "manifests" / "twohop.json").read_bytes())
    raw["expectations"]["agents"] = {n: a for n, a in raw["expectations"]["agents"].items()
                                     if a["role"] != "control"}
    raw.pop("sha256")
    raw["sha256"] = sha256_tag(canonical_json(raw))
    with pytest.raises(ContractError, match="no negative control"):
        parse_manifest(json.dumps(raw).encode(), "hand-made.json")


def test_decide_excludes_a_task_every_control_is_frozen_out_of():
    rules = {"oracle": Rule("oracle", 1.0), "empty": Rule("control", 1.0), "shuffled": Rule("control", 1.0)}
    ok = [Outcome("oracle", 1, "ok", 1.0, None, None)]
    v = decide(ok, ["oracle"], rules, 1.0, "strict", [])
    assert (v.verdict, v.reason) == ("excluded", "no_negative_control") and "empty, shuffled" in v.detail
    # decided by the contract alone: so also before the oracle ran, and after any reason the run found
    assert decide([], ["oracle"], rules, 1.0, "strict", []).reason == "no_negative_control"
    assert decide([Outcome("oracle", 1, "ok", 0.2, None, None)], ["oracle"], rules, 1.0, "strict",
                  []).reason == "oracle_fails_on_valid_task"
    # one control left to test it: the usual verdict
    v = decide([*ok, Outcome("empty", 1, "no_reply", 0.0, None, None)], ["oracle", "empty"], rules, 1.0,
               "strict", [])
    assert v.verdict == "compatible"
    # the oracle-only judgement of the pool's freeze step (no control among the rules) is not
    # a verdict on controls
    assert decide(ok, ["oracle"], {"oracle": rules["oracle"]}, 1.0, "strict", []).verdict == "compatible"


@pytest.fixture(scope="module")
def untestable_pool(tmp_path_factory, sandboxes):
    """A twohop pool whose one control, always-unknown, is frozen out of task 6 (smoke skipped)."""
    base = tmp_path_factory.mktemp("controls")
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[*TESTABLE, UNTESTABLE], env_name=TWOHOP,
                             controls=["always-unknown"], min_task_count=2)
    assert [bool(t.skip) for t in manifest.tasks] == [False, False, True]
    summary = pool(make_ctx(manifest, sandbox, base / "pool"), PoolPhase())
    write_report(base / "pool")
    return base / "pool", summary


@pytest.mark.bwrap
def test_a_pool_task_no_control_can_test_is_excluded_counted_and_audited(untestable_pool):
    root, summary = untestable_pool
    tasks = pq.read_table(root / "tasks.parquet").to_pylist()
    by_idx = {t["idx"]: t for t in tasks}
    assert (
        by_idx[UNTESTABLE]["verdict"] == "excluded" and by_idx[UNTESTABLE]["reason"] == "no_negative_control"
    )
    assert by_idx[UNTESTABLE]["oracle_reward"] == 1.0  # the oracle passed: that alone is not compatible
    assert all(by_idx[i]["verdict"] == "compatible" for i in TESTABLE)
    attempts = pq.read_table(root / "attempts.parquet").to_pylist()
    assert not [a for a in attempts if a["role"] == "control" and a["idx"] == UNTESTABLE]
    frozen = json.loads((root / "frozen-manifest.json").read_text())
    # the oracle passed it, yet a task no control tests is not frozen
    assert frozen["selection"]["idx"] == list(TESTABLE)
    assert summary.counts.compatible == 2 and summary.counts.excluded == 1
    assert summary.counts.excluded_by_reason == {"no_negative_control": 1}
    on_disk = json.loads((root / "run.json").read_text())
    assert on_disk["counts"]["excluded_by_reason"] == {"no_negative_control": 1}
    ledger = pq.read_table(root / "exclusions.parquet").to_pylist()
    assert [(x["idx"], x["reason"]) for x in ledger] == [(UNTESTABLE, "no_negative_control")]
    report = sorted((root / "reports").iterdir())[-1] / "report.md"
    assert "excluded: no\\_negative\\_control | 1/3" in report.read_text()  # markdown-escaped
    result = audit(root)
    assert (
        result.problems == []
        and "3 task rows and 1 exclusion rows re-derived from their attempts and the environment"
        in result.checked
    )


@pytest.mark.bwrap
def test_the_audit_catches_an_untestable_task_forged_compatible(untestable_pool, tmp_path):
    root = tmp_path / "pool"
    shutil.copytree(untestable_pool[0], root)

    def forge(rows):
        for r in rows:
            if r["idx"] == UNTESTABLE:
                r.update(verdict="compatible", reason=None)
        return rows

    table = pq.read_table(root / "tasks.parquet")
    pq.write_table(pa.Table.from_pylist(forge(table.to_pylist()), schema=table.schema),
                   root / "tasks.parquet")
    write_checksums(RunPaths(root))
    problems = " ".join(audit(root).problems)
    assert "no_negative_control" in problems, problems


@pytest.mark.bwrap
def test_eval_freeze_refuses_a_pool_with_an_untested_frozen_task(untestable_pool, tmp_path):
    """A pool never freezes such a task; a frozen contract forged to hold one is refused all the same."""
    root = tmp_path / "pool"
    shutil.copytree(untestable_pool[0], root)
    _frozen_as(root, lambda t: True)
    with pytest.raises(ContractError,
                       match=rf"--pool-run: {root}: no negative control can test 1 frozen task"):
        parent_of(root, audit=_not_reached)
    r = cli("eval", "freeze", "--name", "e", "--pool-run", str(root), "--model", "m", "--model-revision", "r",
            "--base-url", "http://127.0.0.1:9/v1", "--allow-patch", cwd=tmp_path)
    assert r.returncode == 2 and "no negative control can test" in r.stderr and str(root) in r.stderr, (
        r.stderr
    )
    assert "Traceback" not in r.stderr


@pytest.mark.bwrap
def test_eval_freeze_refuses_a_frozen_task_without_a_control_attempt(untestable_pool, tmp_path):
    """The evidence, not only the contract: a testable task whose control attempt is gone."""
    root = tmp_path / "pool"
    shutil.copytree(untestable_pool[0], root)
    path = root / "attempts.parquet"
    table = pq.read_table(path)
    rows = [r for r in table.to_pylist() if not (r["role"] == "control" and r["idx"] == TESTABLE[0])]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    with pytest.raises(ContractError,
                       match=r"1 frozen task\(s\) have no final, exception-free control attempt"):
        parent_of(root, audit=_not_reached)


def _not_reached(root):
    """The audit handed to `parent_of`: these refusals come before it (they need no trust in the evidence)."""
    raise AssertionError(f"{root}: audited, though the refusal needs no audit")


def _frozen_as(root, keep):
    """The copy's frozen contract re-made (re-sealed) over the pool's tasks that `keep` accepts."""
    from validate.contract.manifest import load_manifest, task_list_sha256, write_manifest

    m = load_manifest(root / "frozen-manifest.json")
    tasks = [t for t in load_manifest(root / "manifest.json").tasks if keep(t)]
    m = m.model_copy(
        update={
            "tasks": tasks,
            "task_list_sha256": task_list_sha256(tasks),
            "selection": m.selection.model_copy(update={"idx": [t.idx for t in tasks]}),
        }
    ).sealed()
    write_manifest(m, root / "frozen-manifest.json")
    return root


@pytest.mark.bwrap
def test_eval_freeze_refuses_a_pool_whose_contract_names_no_control(untestable_pool, tmp_path):
    root = tmp_path / "pool"
    shutil.copytree(untestable_pool[0], root)
    for name in ("manifest.json", "frozen-manifest.json"):
        raw = json.loads((root / name).read_text())
        raw["expectations"]["agents"] = {n: a for n, a in raw["expectations"]["agents"].items()
                                         if a["role"] != "control"}
        (root / name).write_text(json.dumps(raw))
    with pytest.raises(ContractError,
                       match=rf"--pool-run: {root}: its manifest.json names no negative control"):
        parent_of(root, audit=_not_reached)
