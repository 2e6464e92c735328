"""Evidence that holds for task directories a hostile verifier and a varied dataset bring, on
real docker: a reward a hair under the threshold fails (its decimal text compared exactly,
the float kept for the column), a verifier's lone-surrogate reward key and an agent's
non-UTF-8 file name are stored as data and never stop the run, and [metadata] tables that
differ in keys and TOML types are kept per row, losslessly, and re-derived by the audit.

The tasks are written here, in a temporary dataset, beside two of the sample's; each carries
its expected verdict in its own [metadata], as the sample's tasks do."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tests.conftest import make_ctx
from tests.test_audit_forgery import edit_row, reseal
from validate.audit.run import audit
from validate.run.phases import RunPhase, run_agents

pytestmark = pytest.mark.docker

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
FROM_SAMPLE = ("csv-to-json", "garbage-reward-txt")
#: A verifier that checks the agent's answer and writes `good` or `bad` to its reward file.
CHECKED = (
    'if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then cat <<\'EOF\'\n{good}\nEOF\nelse cat <<\'EOF\'\n'
    '{bad}\nEOF\nfi > /logs/verifier/{file}\n'
)
SOLVE = "echo 42 > /app/answer.txt\n"
RICH_META = """expert_time_estimate_min = 60.0
tags = ["text", "shell"]
difficulty = "easy"
attempts = 3
released = 1979-05-27T07:32:00-08:00
day = 1979-05-27
deadline = 1979-05-27T07:32:00
alarm = 07:32:00
[metadata.author]
name = "Ada"
weights = [1, 2.5, true]
"""


def _label(verdict: str, reason: str = "") -> str:
    return f'expected_verdict = "{verdict}"\nexpected_reason = "{reason}"\n'


#: task id → (its [metadata] body, solve.sh, test.sh)
TASKS = {
    "exact-below-one-txt": (_label("excluded", "oracle_fails_on_valid_task") + 'category = "exact"\n', SOLVE,
                            CHECKED.format(good="0.99999999999999999999", bad="0", file="reward.txt")),
    "exact-below-one-json": (_label("excluded", "oracle_fails_on_valid_task") + "weight = 2\n", SOLVE,
                             CHECKED.format(good='{"reward": 0.99999999999999999999}', bad='{"reward": 0}',
                                            file="reward.json")),
    "surrogate-reward-key": (_label("excluded", "invalid_task_or_verifier") + "flag = true\n", SOLVE,
                             CHECKED.format(good='{"\\ud800": 1}', bad='{"\\ud800": 0}', file="reward.json")),
    # The oracle leaves a file whose name is not UTF-8 where the verifier writes (recorded, removed).
    "odd-file-names": (_label("compatible") + "score = -0.5\n",
                       SOLVE + "touch /logs/verifier/$'\\xff\\xfe-left'\n",
                       CHECKED.format(good="1", bad="0", file="reward.txt")),
    "rich-metadata": (_label("compatible") + RICH_META, SOLVE,
                      CHECKED.format(good="1", bad="0", file="reward.txt")),
}
TOML = """version = "1.0"

[metadata]
{meta}
[verifier]
timeout_sec = 60

[agent]
timeout_sec = 60

[environment]
cpus = 1
memory = "1G"
allow_internet = false
"""


def _write(root: Path, tid: str, meta: str, solve: str, test: str) -> None:
    d = root / tid
    for sub in ("environment", "solution", "tests"):
        (d / sub).mkdir(parents=True)
    (d / "task.toml").write_text(TOML.format(meta=meta))
    (d / "instruction.md").write_text("Write the number 42 to /app/answer.txt.\n")
    (d / "environment" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nWORKDIR /app\n")
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\nset -eu\n" + solve)
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    for script in (d / "solution" / "solve.sh", d / "tests" / "test.sh"):
        script.chmod(0o755)


def metadata(root: Path, tid: str) -> dict:
    return tomllib.loads((root / tid / "task.toml").read_text())["metadata"]


@pytest.fixture(scope="module")
def played(tmp_path_factory, sandboxes):
    base = tmp_path_factory.mktemp("harbor-evidence")
    dataset = base / "dataset"
    for tid, (meta, solve, test) in TASKS.items():
        _write(dataset, tid, meta, solve, test)
    for tid in FROM_SAMPLE:
        shutil.copytree(SAMPLE / tid, dataset / tid)
    sandbox = sandboxes("docker")
    from validate import api

    # Frozen as `validate freeze` freezes it: every task's image built and frozen in the contract.
    manifest = api.freeze("harbor-evidence", env="harbor", config={"dataset": str(dataset)}, backend="docker",
                          controls=["nop"], allow_patch=True, out=base / "harbor-evidence.json")
    assert manifest.execution.task_images is not None
    run_dir = base / "run"
    run_agents(make_ctx(manifest, sandbox, run_dir, concurrency=2), RunPhase())
    return dataset, run_dir


def test_every_task_gets_its_own_label_and_the_run_ends(played):
    dataset, run_dir = played
    tasks = pd.read_parquet(run_dir / "tasks.parquet").set_index("task_id")
    got = {t: (tasks.loc[t, "verdict"], tasks.loc[t, "reason"] if isinstance(tasks.loc[t, "reason"], str)
               else "")
           for t in tasks.index}
    want = {t: (metadata(dataset, t)["expected_verdict"], metadata(dataset, t)["expected_reason"])
            for t in [*TASKS, *FROM_SAMPLE]}
    assert got == want, tasks[["verdict", "reason", "detail"]].to_dict("index")


@pytest.mark.parametrize("tid", ["exact-below-one-txt", "exact-below-one-json"])
def test_a_reward_a_hair_under_the_threshold_fails_and_keeps_its_float_and_its_text(played, tid):
    _, run_dir = played
    att = pd.read_parquet(run_dir / "attempts.parquet")
    oracle = att[(att["task_id"] == tid) & (att["agent"] == "oracle")].iloc[0]
    assert oracle["status"] == "ok" and oracle["reward"] == 1.0  # the float, for the columns
    assert oracle["reward_decimal"] == "0.99999999999999999999" and not oracle["as_expected"]
    tasks = pd.read_parquet(run_dir / "tasks.parquet").set_index("task_id")
    assert "reward 0.99999999999999999999 < 1.0" in tasks.loc[tid, "detail"]


def test_a_lone_surrogate_reward_key_is_a_verifier_error_stored_escaped(played):
    _, run_dir = played
    att = pd.read_parquet(run_dir / "attempts.parquet")
    rows = att[att["task_id"] == "surrogate-reward-key"]
    assert (rows["status"] == "scorer_error").all() and rows["reward"].isna().all()
    assert all("\\ud800" in m for m in rows["error_message"]), list(rows["error_message"])


def test_a_file_name_that_is_not_utf8_is_recorded_escaped(played):
    _, run_dir = played
    att = pd.read_parquet(run_dir / "attempts.parquet")
    oracle = att[(att["task_id"] == "odd-file-names") & (att["agent"] == "oracle")].iloc[0]
    assert oracle["reward"] == 1.0 and "-left" in oracle["stderr"]
    oracle["stderr"].encode("utf-8")  # strict: no lone surrogate stored


def test_metadata_of_every_toml_type_is_kept_per_row_losslessly(played):
    dataset, run_dir = played
    rows = {r["task_id"]: r for r in pq.read_table(run_dir / "tasks.parquet").to_pylist()}
    rich = json.loads(rows["rich-metadata"]["meta"])
    assert rich == {**{k: v for k, v in metadata(dataset, "rich-metadata").items()
                       if k not in ("released", "day", "deadline", "alarm")},
                    "released": "1979-05-27T07:32:00-08:00", "day": "1979-05-27",
                    "deadline": "1979-05-27T07:32:00", "alarm": "07:32:00"}
    assert isinstance(rich["expert_time_estimate_min"], float) and isinstance(rich["attempts"], int)
    for tid in [*TASKS, *FROM_SAMPLE]:
        if tid != "rich-metadata":
            assert json.loads(rows[tid]["meta"]) == metadata(dataset, tid), tid


def test_the_audit_re_derives_the_untouched_run(played):
    _, run_dir = played
    result = audit(run_dir)
    assert result.problems == []


def test_a_reward_decimal_raised_to_one_fails_the_audit(played, tmp_path):
    _, run_dir = played
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    edit_row(copy / "attempts.parquet",
             lambda r: r["task_id"] == "exact-below-one-txt" and r["agent"] == "oracle", reward_decimal=None,
             as_expected=True)
    reseal(copy)
    problems = audit(copy).problems
    assert any("attempts.parquet" in p and "reward_decimal" in p for p in problems), problems


@pytest.mark.parametrize("forge", [lambda m: {**m, "expert_time_estimate_min": 60},  # a float made an integer
                                   # true → 1
                                   lambda m: {**m, "author": {**m["author"], "weights": [1, 2.5, 1]}},
                                   lambda m: {k: v for k, v in m.items() if k != "tags"}])
def test_a_tasks_metadata_edited_fails_the_audit(played, tmp_path, forge):
    _, run_dir = played
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    row = edit_row(copy / "tasks.parquet", lambda r: r["task_id"] == "rich-metadata")
    edit_row(copy / "tasks.parquet", lambda r: r["task_id"] == "rich-metadata",
             meta=json.dumps(forge(json.loads(row["meta"]))))
    reseal(copy)
    problems = audit(copy).problems
    assert any("tasks.parquet: rich-metadata: meta differ" in p for p in problems), problems


def test_a_reward_decimal_that_is_no_number_is_named_not_a_crash(played, tmp_path):
    _, run_dir = played
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    edit_row(copy / "attempts.parquet",
             lambda r: r["task_id"] == "exact-below-one-txt" and r["agent"] == "oracle", reward_decimal="NaN")
    reseal(copy)
    problems = audit(copy).problems
    assert any("exact-below-one-txt/oracle" in p and "reward_decimal 'NaN'" in p for p in problems), problems


# --- forgeries of a re-sealed run the audit must catch, each naming the field -------------

@pytest.fixture
def forged(played, tmp_path):
    """A copy of the run to forge; its contract has no committed twin (the anchor of
    manifests/ cannot catch a re-hashed manifest), so the audit's own checks must."""
    _, run_dir = played
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    assert audit(copy).problems == []
    return copy


def _frozen(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())["execution"]["task_images"]


def test_a_reply_records_image_set_to_another_tasks_image(forged):
    from environment.protocol import canonical_json, sha256_tag

    images = {t: e["image"] for t, e in _frozen(forged)["tasks"].items()}
    row = edit_row(forged / "attempts.parquet",
                   lambda r: r["task_id"] == "csv-to-json" and r["agent"] == "oracle")
    record = json.loads((forged / "replies" / row["reply_sha256"].removeprefix("sha256:")).read_bytes())
    assert record["image"] == images["csv-to-json"] != images["rich-metadata"]
    record["image"] = images["rich-metadata"]
    reply = canonical_json(record)
    (forged / "replies" / sha256_tag(reply).removeprefix("sha256:")).write_bytes(reply)
    edit_row(forged / "attempts.parquet", lambda r: r["task_id"] == "csv-to-json" and r["agent"] == "oracle",
             reply_sha256=sha256_tag(reply), reply_bytes=len(reply), reply_text=reply.decode()[:65536])
    reseal(forged)
    problems = audit(forged).problems
    assert any("csv-to-json/oracle" in p and "image" in p and images["rich-metadata"] in p
               for p in problems), problems


def test_a_base_images_packages_and_apt_sources_replaced_and_the_manifest_rehashed(forged):
    from tests.test_audit_forgery import rehash_manifest

    def forge(m):
        base = m["execution"]["task_images"]["base_map"]["bases"]["python-3.11-slim-bookworm"]
        base["packages"] = [p for p in base["packages"]
                            if not p.startswith("python3.11=")] + ["python3.11=3.11.9-1"]
        base["apt_sources"] = ["deb http://mirror.example/debian bookworm main"]

    rehash_manifest(forged, forge)
    reseal(forged)
    problems = audit(forged).problems
    assert any("manifest.json" in p and "python-3.11-slim-bookworm" in p and "packages" in p
               and "apt_sources" in p
               for p in problems), problems


def test_a_base_map_without_a_stored_base_of_its_layer_is_named_sealed_only(forged, tmp_path, monkeypatch):
    monkeypatch.setenv("VALIDATE_IMAGE_DIR", str(tmp_path / "another-machine"))
    result = audit(forged)
    assert result.problems == []
    assert any(s.startswith("manifest.json: execution.task_images.base_map") and "no stored base" in s
               for s in result.sealed_only), result.sealed_only


def test_a_tasks_dockerfile_patch_sha256_zeroed_and_the_manifest_rehashed(forged):
    from tests.test_audit_forgery import rehash_manifest

    rehash_manifest(forged, lambda m: m["execution"]["task_images"]["tasks"]["csv-to-json"].update(
        patch_sha256="sha256:" + "0" * 64))
    reseal(forged)
    problems = audit(forged).problems
    assert any("manifest.json" in p and "csv-to-json" in p and "patch_sha256" in p
               for p in problems), problems
