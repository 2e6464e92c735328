"""A hostile reviewer's forgeries: each edits a copy of a run, re-seals it with the project's
own `write_checksums` (as a forger would), and must fail `validate audit`, the problem naming
the file and the field. Runs through real bwrap on real deshuffle tasks, and copies of the
committed curator (judged) and eval ledgers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import CORPUS_PATH, make_ctx, make_manifest, subprocess_env
from validate.audit.eval import audit as eval_audit
from validate.audit.run import audit
from validate.core.paths import RunPaths
from validate.evidence.journal import write_checksums
from validate.run.phases import RunPhase, run_agents

pytestmark = pytest.mark.bwrap
DATA = (CORPUS_PATH,)
LEDGERS = Path(__file__).resolve().parents[1] / "ledgers"
#: Small enough that every deshuffle reply outgrows reply_text: the audit must re-score from replies/.
TEXT_CAP = 64


@pytest.fixture(scope="module")
def built(tmp_path_factory, sandboxes):
    """A run of every agent on three tasks (reply_text capped at TEXT_CAP bytes), and a run
    whose one control has ceiling 0, so its tasks are excluded."""
    base = tmp_path_factory.mktemp("forgery")
    sandbox = sandboxes("bwrap")
    m = make_manifest(sandbox, idx=[0, 1, 2], max_papers=2)
    m = m.model_copy(
        update={"execution": m.execution.model_copy(update={"max_reply_text_bytes": TEXT_CAP})}
    ).sealed()
    run_agents(make_ctx(m, sandbox, base / "run"), RunPhase())
    ex = make_manifest(sandbox, idx=[0, 1], max_papers=2, controls=["identity"], ceilings={"identity": 0.0})
    run_agents(make_ctx(ex, sandbox, base / "excluded"), RunPhase())
    for name in ("run", "excluded"):
        assert audit(base / name, data=DATA).problems == []
    return base


def _copy(src: Path, tmp_path: Path, check=lambda d: audit(d, data=DATA)) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    assert check(dst).problems == [], "a plain copy must pass"
    return dst


@pytest.fixture
def run(built, tmp_path):
    return _copy(built / "run", tmp_path)


@pytest.fixture
def excluded(built, tmp_path):
    return _copy(built / "excluded", tmp_path)


def edit_table(path: Path, fn) -> None:
    table = pq.read_table(path)
    pq.write_table(pa.Table.from_pylist(fn(table.to_pylist()), schema=table.schema), path)


def edit_row(path: Path, pick, **update) -> dict:
    """Update the first row `pick` selects; return it as it was."""
    before = {}

    def fn(rows):
        row = next(r for r in rows if pick(r))
        before.update(row)
        row.update(update)
        return rows

    edit_table(path, fn)
    return before


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def reseal(root: Path) -> None:
    write_checksums(RunPaths(root))


def fails(root: Path, *words: str, check=None) -> list[str]:
    reseal(root)
    problems = (check or (lambda d: audit(d, data=DATA)))(root).problems
    assert problems, "the audit passed a forged run"
    assert any(all(w in p for w in words) for p in problems), problems
    return problems


def rehash_manifest(root: Path, fn) -> None:
    """Edit manifest.json, seal it again with a fresh sha256 and point run.json at it."""
    from validate.contract.manifest import Manifest

    data = json.loads((root / "manifest.json").read_text())
    fn(data)
    m = Manifest.model_validate(data).sealed()
    (root / "manifest.json").write_bytes(m.to_json())
    edit_json(root / "run.json", lambda s: s.update(manifest_sha256=m.sha256))


# --- what used to pass as "NOT CHECKED" ------------------------------------------------

def test_a_controls_program_sha256_replaced_and_the_manifest_rehashed(run):
    rehash_manifest(run, lambda d: d["expectations"]["agents"]["identity"].update(program_sha256="0" * 64))
    fails(run, "manifest.json", "program_sha256")


def test_the_content_revision_replaced_and_the_manifest_rehashed(run):
    rehash_manifest(run, lambda d: d["environment"].update(revision="sha256:" + "1" * 64))
    fails(run, "manifest.json", "revision")


def test_an_environment_not_at_hand_is_a_problem_naming_the_fix(run, monkeypatch):
    from environment.protocol import ConfigError

    def missing(*_a, **_k):
        raise ConfigError("corpus: no file with this revision was found")

    monkeypatch.setattr("validate.audit.env.check_environment", missing)
    problems = fails(run, "manifest.json", "not at hand", "--data")
    assert any("no reward re-scored" in p for p in problems)


# --- rewards re-scored from the stored replies ------------------------------------------

def test_every_reply_is_kept_whole_beyond_the_reply_text_cap(run):
    rows = pq.read_table(run / "attempts.parquet").to_pylist()
    assert any(r["reply_truncated"] for r in rows)
    for r in rows:
        if r["reply_sha256"]:
            stored = run / "replies" / r["reply_sha256"].removeprefix("sha256:")
            assert len(stored.read_bytes()) == r["reply_bytes"]
    checked = " ".join(audit(run, data=DATA).checked)
    assert f"{len(rows)} rewards re-scored" in checked and "0 from a reply_text" in checked


def test_the_replies_store_removed(run):
    shutil.rmtree(run / "replies")
    fails(run, "attempts.parquet", "is not stored", "cannot be re-scored")


def test_the_oracles_reply_text_replaced_with_garbage_reward_kept(run):
    before = edit_row(run / "attempts.parquet", lambda r: r["agent"] == "oracle", reply_text="garbage")
    assert before["reward"] == 1.0
    fails(run, "attempts.parquet", "oracle", "reply_text")


def test_the_oracles_whole_reply_replaced_with_garbage_reward_kept(run):
    from environment.protocol import sha256_tag

    garbage = b"garbage"
    tag = sha256_tag(garbage)
    before = edit_row(run / "attempts.parquet", lambda r: r["agent"] == "oracle", reply_sha256=tag,
                      reply_bytes=len(garbage), reply_text="garbage", reply_truncated=False)
    (run / "replies" / tag.removeprefix("sha256:")).write_bytes(garbage)
    (run / "replies" / before["reply_sha256"].removeprefix("sha256:")).unlink()
    fails(run, "attempts.parquet", "oracle", "reward 1.0 but its stored reply re-scores to 0")


def test_a_controls_reward_raised_from_0_to_0_9_reply_unchanged(run):
    before = edit_row(run / "attempts.parquet", lambda r: r["role"] == "control" and r["reward"] == 0.0,
                      reward=0.9)
    fails(run, "attempts.parquet", before["agent"], "reward 0.9 but its stored reply re-scores to 0.0")


def test_the_reply_sha256_zeroed(run):
    edit_row(run / "attempts.parquet", lambda r: r["reply_sha256"] is not None,
             reply_sha256="sha256:" + "0" * 64)
    fails(run, "attempts.parquet", "is not stored")


def test_the_workspace_sha256_zeroed(run):
    edit_row(run / "attempts.parquet", lambda r: True, workspace_sha256="sha256:" + "0" * 64)
    fails(run, "attempts.parquet", "workspace_sha256")


@pytest.mark.parametrize("field,value", [("backend", "docker"), ("image_digest", "sha256:" + "2" * 64)])
def test_an_attempts_backend_or_image_digest_changed(run, field, value):
    edit_row(run / "attempts.parquet", lambda r: True, **{field: value})
    fails(run, "attempts.parquet", "backend or image_digest", value)


def test_a_status_that_does_not_follow_from_the_exit_code(run):
    edit_row(run / "attempts.parquet", lambda r: r["status"] == "ok", status="timeout")
    fails(run, "attempts.parquet", "status timeout does not follow")


# --- run.json against the attempts and the contract -------------------------------------

def test_run_json_backend_changed(run):
    edit_json(run / "run.json", lambda s: s.update(backend="docker"))
    fails(run, "run.json", "backend")


def test_run_json_finished_before_its_attempts(run):
    first = min(r["started_at"] for r in pq.read_table(run / "attempts.parquet").to_pylist())
    edit_json(run / "run.json", lambda s: s.update(finished_at=first.isoformat()))
    fails(run, "run.json", "finished_at")


def test_run_json_agents_changed(run):
    edit_json(run / "run.json", lambda s: s.update(agents=s["agents"][1:]))
    fails(run, "run.json", "agents")


# --- tasks.parquet and exclusions.parquet rows, whole -----------------------------------

@pytest.mark.parametrize("field,value", [("detail", "forged"), ("family", "forged"), ("n_attempts", 99)])
def test_a_verdict_rows_field_changed(run, field, value):
    edit_row(run / "tasks.parquet", lambda r: r[field] != value, **{field: value})
    fails(run, "tasks.parquet", field, "differ from the row re-derived")


def test_a_verdict_rows_max_control_agent_named_another_control(run):
    """A plausible forgery: the row names another of the contract's controls. Which control
    scored highest depends on the contract's salt, so the forged name is chosen per row."""
    rows = pq.read_table(run / "tasks.parquet").to_pylist()
    controls = sorted({r["max_control_agent"] for r in rows} | {"identity", "reversed"})
    row = rows[0]
    other = next(c for c in controls if c != row["max_control_agent"])
    edit_row(run / "tasks.parquet", lambda r: r["task_id"] == row["task_id"], max_control_agent=other)
    fails(run, "tasks.parquet", "max_control_agent", "differ from the row re-derived")


def test_an_exclusions_detail_changed(excluded):
    rows = pq.read_table(excluded / "exclusions.parquet").to_pylist()
    assert rows and all(r["reason"] == "invalid_task_or_verifier" for r in rows)
    edit_row(excluded / "exclusions.parquet", lambda r: True, detail="the task was fine, really")
    fails(excluded, "exclusions.parquet", "detail")


# --- the manifest's anchor: the committed manifests/<name>.json ------------------------

def _committed(run: Path, tmp_path: Path) -> Path:
    """A project's manifests/ holding the run's contract as committed."""
    d = tmp_path / "manifests"
    d.mkdir()
    name = json.loads((run / "manifest.json").read_text())["name"]
    shutil.copy(run / "manifest.json", d / f"{name}.json")
    return d


@pytest.mark.parametrize("edit", [
    lambda d: d["expectations"]["agents"]["identity"].update(ceiling=1.01),
    lambda d: d["execution"]["limits"].update(timeout_s=d["execution"]["limits"]["timeout_s"] * 10),
    lambda d: d["expectations"].update(pass_threshold=0.5),
], ids=["a control's ceiling raised to 1.01", "the timeout raised", "the pass threshold lowered"])
def test_a_manifest_rehashed_with_other_limits_is_not_the_committed_one(run, tmp_path, edit):
    committed = _committed(run, tmp_path)
    assert audit(run, data=DATA, manifests=committed).problems == []
    rehash_manifest(run, edit)
    fails(run, "manifest.json", "is not the committed",
          check=lambda d: audit(d, data=DATA, manifests=committed))


def test_without_a_committed_manifest_its_limits_are_named_sealed_only(run):
    result = audit(run, data=DATA)
    assert result.problems == []
    assert any(s.startswith("manifest.json: no committed") for s in result.sealed_only)


# --- what cannot be derived: bound by the signature -------------------------------------

def test_a_sealed_only_field_changed_fails_the_signature(run, tmp_path):
    from validate.evidence.signing import sign

    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "reviewer", "-f", str(key)],
                   check=True)
    signers = tmp_path / "allowed_signers"
    signers.write_text("validate " + (tmp_path / "key.pub").read_text())
    sign(run, key)
    assert audit(run, signature=signers, data=DATA).problems == []
    edit_row(run / "attempts.parquet", lambda r: True, stdout="a different story")
    reseal(run)
    result = audit(run, data=DATA)
    # nothing re-derives stdout
    assert result.problems == [] and any("stdout" in s for s in result.sealed_only)
    problems = audit(run, signature=signers, data=DATA).problems
    assert any("checksums.sig" in p for p in problems), problems


def test_the_cli_exits_1_on_a_forgery_and_prints_what_is_sealed_only(run):
    cmd = [sys.executable, "-m", "validate.cli", "audit", str(run), "--data", str(CORPUS_PATH)]
    ok = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env())
    assert ok.returncode == 0, ok.stderr
    assert "sealed only — bound by a signature: attempts.parquet: started_at" in ok.stderr
    assert "rewards re-scored" in ok.stdout and "NOT CHECKED" not in ok.stdout + ok.stderr
    rehash_manifest(run, lambda d: d["environment"].update(revision="sha256:" + "1" * 64))
    reseal(run)
    bad = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env())
    assert bad.returncode == 1 and "FAIL " in bad.stdout and "manifest.json" in bad.stdout, bad.stdout


# --- copies of committed ledgers ---------------------------------------------------------

def _ledger(prefix: str) -> Path:
    return next(p for p in sorted(LEDGERS.iterdir()) if p.name.startswith(prefix))


def _flip(value):
    """Every grade C in a judge cache record (the grade and the judge's raw answer) made A."""
    if isinstance(value, dict):
        return {k: _flip(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_flip(v) for v in value]
    if isinstance(value, str) and value.strip() == "C":
        return value.replace("C", "A")
    if isinstance(value, str) and value.startswith("{"):
        try:
            return json.dumps(_flip(json.loads(value)))
        except ValueError:
            return value
    return value


def test_a_cached_judge_grade_flipped_c_to_a(tmp_path):
    run = _copy(_ledger("curator-judged-pool-"), tmp_path)
    flipped = 0
    for path in sorted((run / "scorer-cache" / "judge").glob("*.json")):
        record = json.loads(path.read_text())
        new = _flip(record)
        if new != record:
            path.write_text(json.dumps(new))
            flipped += 1
    assert flipped
    fails(run, "attempts.parquet", "but its stored reply re-scores to")


@pytest.fixture
def evaluated(tmp_path):
    return _copy(_ledger("eval-baseline-t1.0-"), tmp_path, check=lambda d: eval_audit(d, data=DATA))


def _eval_fails(root, *words):
    return fails(root, *words, check=lambda d: eval_audit(d, data=DATA))


@pytest.mark.parametrize("field,value", [("model", "another-model@main"), ("backend", "bwrap")])
def test_eval_json_model_or_backend_changed(evaluated, field, value):
    edit_json(evaluated / "eval.json", lambda s: s.update({field: value}))
    _eval_fails(evaluated, "eval.json", "model, environment, backend or image_digest", value)


def test_an_eval_reward_raised_reply_unchanged(evaluated):
    before = edit_row(evaluated / "attempts.parquet", lambda r: r["reward"] is not None and r["reward"] < 0.9,
                      reward=1.0)
    _eval_fails(evaluated, "attempts.parquet", before["task_id"],
                f"reward 1.0 but its stored reply re-scores to {before['reward']}")


def test_an_eval_reply_replaced(evaluated):
    edit_row(evaluated / "attempts.parquet", lambda r: r["reply_text"], reply_text="a better answer")
    _eval_fails(evaluated, "attempts.parquet", "reply_text or reply_truncated are not its stored reply's")


def test_an_eval_attempts_backend_changed(evaluated):
    edit_row(evaluated / "attempts.parquet", lambda r: True, backend="subprocess")
    _eval_fails(evaluated, "attempts.parquet", "backend or image_digest")


def test_a_frozen_manifest_rehashed_with_a_control_ceiling_raised(tmp_path):
    """The frozen child (controls run under it) keeps its parent's expectations: a ceiling
    raised in it alone, re-hashed and named in run.json, is refused."""
    from validate.contract.manifest import Manifest

    pool = _copy(_ledger("twohop-pool-"), tmp_path)
    data = json.loads((pool / "frozen-manifest.json").read_text())
    control = next(n for n, a in data["expectations"]["agents"].items() if a["role"] == "control")
    data["expectations"]["agents"][control]["ceiling"] = 1.01
    m = Manifest.model_validate(data).sealed()
    (pool / "frozen-manifest.json").write_bytes(m.to_json())
    edit_json(pool / "run.json", lambda s: s.update(frozen_manifest_sha256=m.sha256))
    fails(pool, "frozen-manifest.json", "its expectations is not its parent's")


def test_a_judge_answer_missing_from_the_cache_is_a_problem_and_no_judge_is_asked(tmp_path, monkeypatch):
    """The judge's key set: the audit still asks nothing (the key is hidden while re-scoring),
    writes nothing into the evidence, and names the attempts it could not re-score."""
    import urllib.request

    run = _copy(_ledger("curator-judged-pool-"), tmp_path)
    asked = []

    def urlopen(request, *args, **kwargs):
        asked.append(getattr(request, "full_url", request))
        raise OSError("no judge here")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    scorer = json.loads((run / "manifest.json").read_text())["environment"]["scorer"]
    assert scorer["env_vars"]
    for var in scorer["env_vars"]:
        monkeypatch.setenv(var, "a-key")
    shutil.rmtree(run / "scorer-cache")
    fails(run, "attempts.parquet", "cannot be re-scored offline", "asks no judge")
    assert asked == []
    assert not (run / "scorer-cache").exists(), "the audit wrote into the evidence"


def test_a_smoke_reruns_reward_changed_reply_unchanged(tmp_path):
    pool = _copy(_ledger("twohop-pool-"), tmp_path)
    rerun = next((pool / "smoke").iterdir()) / "run"
    before = edit_row(rerun / "attempts.parquet", lambda r: r["reward"] is not None and r["reward"] < 0.5,
                      reward=0.75)
    fails(pool, "smoke/", "attempts.parquet",
          f"reward 0.75 but its stored reply re-scores to {before['reward']}")


def test_a_pilots_strata_edited(tmp_path):
    pilot = _copy(_ledger("pool-1k-pilot-"), tmp_path)
    edit_json(pilot / "run.json",
              lambda s: s["strata"][0].update(pool_tasks=s["strata"][0]["pool_tasks"] + 1))
    fails(pilot, "run.json", "strata")


def test_an_attempt_pointed_at_another_idx(run):
    edit_row(run / "attempts.parquet", lambda r: r["idx"] == 0, idx=1)
    fails(run, "attempts.parquet", "or another idx")


def test_a_pilots_variant_sha256_edited(tmp_path):
    pilot = _copy(_ledger("pool-1k-pilot-"), tmp_path)
    edit_json(pilot / "run.json", lambda s: s["variant_manifest_sha256"].update(
        {k: "sha256:" + "3" * 64 for k in s["variant_manifest_sha256"]}))
    fails(pilot, "run.json", "variant_manifest_sha256")


def test_eval_json_finished_before_its_attempts(evaluated):
    edit_json(evaluated / "eval.json", lambda s: s.update(finished_at=s["started_at"]))
    _eval_fails(evaluated, "eval.json", "finished_at")


def test_a_reply_sha256_naming_a_path_outside_replies(run):
    edit_row(run / "attempts.parquet", lambda r: r["reply_sha256"] is not None,
             reply_sha256="sha256:../../run.json")
    fails(run, "attempts.parquet", "is not a sha256 tag")
