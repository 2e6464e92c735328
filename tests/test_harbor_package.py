"""Task images frozen in the contract, and the validated subset packaged (protocol step 5),
for real: `validate.api.freeze` of six sample tasks on the suite's own dockerd (every task's
image built or taken from the cache, the base map frozen), one pool over them through docker
(its smoke test rerun from a package of its sample by an installed wheel), then
`validate package` of that pool. Nothing is mocked; `CountingImages` only counts the real
backend's builds.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import make_ctx
from tests.test_task_images import CountingImages
from validate import api
from validate.audit.run import audit
from validate.cli.main import main
from validate.core import environments
from validate.core.paths import RunPaths, task_image_store
from validate.evidence.journal import write_checksums
from validate.run.phases import PoolPhase, pool
from validate.taskdir.images.docker import DockerImages
from validate.taskdir.images.frozen import (
    BUILD_LOGS,
    TaskImageMismatch,
    freeze_images,
    keep_run_log,
    log_dir_of,
    routed,
)
from validate.taskdir.package import CARD, EXCLUSIONS, HASH_MANIFEST, verify_package

pytestmark = pytest.mark.docker

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
#: Three sound tasks (one with non-ASCII file names), a leak a control catches, a base the
#: map does not serve, a Dockerfile whose COPY leaves the context.
PICK = ("csv-to-json", "edit-config", "unicode-names", "nop-passes", "unmapped-base", "copy-outside-context")
SOUND = ("csv-to-json", "edit-config", "unicode-names")


def _idx() -> list[int]:
    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(SAMPLE)))
    return [i for i in range(ts.size) if ts.task(i).id in PICK]


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    base = tmp_path_factory.mktemp("harbor-package")
    path = base / "manifests" / "hp.json"
    path.parent.mkdir()
    manifest = api.freeze("hp", env="harbor", config={"dataset": str(SAMPLE)}, idx=_idx(), backend="docker",
                          min_count=1, allow_patch=True, out=path)
    return path, manifest


@pytest.fixture(scope="module")
def pooled(frozen, sandboxes):
    path, manifest = frozen
    run_dir = path.parent.parent / "pool"
    summary = pool(make_ctx(manifest, sandboxes("docker"), run_dir, concurrency=2),
                   PoolPhase(manifest_dir=path.parent, smoke_sample=2), log=lambda m: None)
    return run_dir, summary


def test_freeze_records_the_base_map_and_each_tasks_image_or_refusal(frozen):
    path, m = frozen
    ti = m.execution.task_images
    assert ti is not None and ti.build_policy.network == "host"
    assert json.loads(path.read_bytes())["execution"]["task_images"]["tasks"].keys() == set(PICK)
    sub = next(s for s in ti.base_map.substitutions if s.upstream == "python:3.12-slim*")
    assert any("Python 3.11 is served" in d for d in sub.differences)
    assert all(b.image_id.startswith("sha256:") and b.layer.startswith("sha256:")
               for b in ti.base_map.bases.values())
    docker = DockerImages()
    for tid in SOUND:
        entry = ti.tasks[tid]
        assert entry.refusal is None and entry.image.startswith("sha256:")
        assert docker.image_labels(entry.image) is not None  # the daemon holds exactly that image
        log = log_dir_of(path) / f"{entry.log_sha256.removeprefix('sha256:')}.log"
        assert log.is_file() and f"sha256:{__import__('hashlib').sha256(log.read_bytes()).hexdigest()}" == \
            entry.log_sha256
    assert ti.tasks["unmapped-base"].refusal == "unsupported_execution_contract"
    assert "ubuntu:24.04 is not available on this profile" in ti.tasks["unmapped-base"].detail
    bad = ti.tasks["copy-outside-context"]
    assert bad.refusal == "invalid_task_or_verifier" and bad.image is None and bad.log_tail


def test_a_second_freeze_builds_no_image(frozen, tmp_path):
    _, m = frozen
    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(SAMPLE)))
    counting = CountingImages()
    again = freeze_images(ts, _idx(), "docker", tmp_path, task_image_store(), builder=counting,
                          policy=m.execution.task_images.build_policy)
    # Only the Dockerfile that fails is tried again (a failure is never cached as a verdict).
    assert counting.builds == 1
    first = m.execution.task_images.tasks
    assert {t: e for t, e in again.tasks.items() if t != "copy-outside-context"} == \
        {t: e for t, e in first.items() if t != "copy-outside-context"}
    retried, before = again.tasks["copy-outside-context"], first["copy-outside-context"]
    assert (retried.refusal, retried.detail) == (before.refusal, before.detail)  # its log names its own time
    assert again.base_map == m.execution.task_images.base_map


def test_an_image_other_than_the_frozen_one_is_refused(frozen, tmp_path):
    _, m = frozen
    ti = m.execution.task_images
    real = ti.tasks["csv-to-json"]
    other = ti.model_copy(
        update={"tasks": {**ti.tasks, "csv-to-json": real.model_copy(update={"image": "sha256:" + "0" * 64})}}
    )

    class Built:  # what the cache answers: the image this daemon really holds for the task
        image_id, log = real.image, "/nonexistent"

    docker, store = DockerImages(), task_image_store()
    with pytest.raises(TaskImageMismatch, match="the contract froze sha256:0000"):
        routed(other, "csv-to-json", lambda: Built(), docker)
    assert routed(ti, "unmapped-base", lambda: pytest.fail("a frozen refusal builds nothing"),
                  docker).reason == "unsupported_execution_contract"
    held = routed(ti, "csv-to-json", lambda: pytest.fail("the daemon holds the frozen image"), docker,
                  lambda _id: pytest.fail("an image the daemon holds is not fetched"))
    assert held.image_id == real.image
    keep_run_log(ti, "csv-to-json", store, tmp_path)  # the driver's copy into the run
    assert sorted(p.name for p in (tmp_path / BUILD_LOGS).iterdir()) == sorted(
        [f"{real.log_sha256[7:]}.log", f"{real.content[7:]}.content.json"])  # its log and its content listing
    # A machine without the frozen image gets it from `fetch` (a cluster's driver), and only that image.
    asked = []
    with pytest.raises(TaskImageMismatch, match="fetched from the run's driver is not sha256:0000"):
        routed(other, "csv-to-json", lambda: pytest.fail("a fetch, not a build"), docker, asked.append)
    assert asked == ["sha256:" + "0" * 64]


def test_the_pool_runs_every_task_in_its_frozen_image_and_audits(frozen, pooled):
    _, m = frozen
    run_dir, summary = pooled
    att = pd.read_parquet(run_dir / "attempts.parquet")
    for tid in SOUND:
        rows = att[att["task_id"] == tid]
        assert len(rows) >= 5 and (rows["image_digest"] == m.execution.task_images.tasks[tid].image).all()
        reply = rows.iloc[0]["reply_sha256"].removeprefix("sha256:")
        assert json.loads((run_dir / "replies" / reply).read_bytes())["image"] == rows.iloc[0]["image_digest"]
    assert (att.loc[att["task_id"] == "unmapped-base", "image_digest"] == m.execution.image_digest).all()
    assert len(list((run_dir / BUILD_LOGS).glob("*.log"))) == len(SOUND) + 1  # nop-passes: its own image
    result = audit(run_dir)
    assert result.problems == []
    assert any("frozen task images" in line for line in result.checked), result.checked


def test_a_tampered_image_digest_in_an_attempt_is_caught(pooled, tmp_path):
    run_dir, _ = pooled
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    att = pd.read_parquet(copy / "attempts.parquet")
    row = att.index[(att["task_id"] == "csv-to-json") & (att["agent"] == "nop")][0]
    att.loc[row, "image_digest"] = att.loc[att["task_id"] == "edit-config", "image_digest"].iloc[0]
    att.to_parquet(copy / "attempts.parquet", index=False)
    write_checksums(RunPaths(copy))  # resealed: only the routing can tell
    problems = audit(copy).problems
    assert any("image_digest" in p and "csv-to-json nop" in p for p in problems), problems


def test_the_smoke_reran_a_package_of_its_sample(pooled):
    run_dir, summary = pooled
    assert summary.facts.smoke == "passed", summary
    (entry,) = sorted((run_dir / "smoke").iterdir())
    result = json.loads((entry / "result.json").read_bytes())
    assert result["passed"] and result["compared"] >= 2 * 5, result
    (package,) = sorted((entry / "package").iterdir())
    assert package.name.startswith("package-") and verify_package(package) == []
    child = json.loads((entry / "manifest.json").read_bytes())
    assert child["environment"]["config"]["dataset"] == package.name
    assert sorted(p.name for p in package.iterdir() if p.is_dir()) == sorted(t["id"] for t in child["tasks"])


def test_package_holds_the_compatible_tasks_byte_for_byte_with_a_card_from_the_evidence(pooled, tmp_path):
    run_dir, _ = pooled
    out = tmp_path / "pkg"
    assert main(["package", str(run_dir), "--out", str(out)]) == 0
    tasks = pd.read_parquet(run_dir / "tasks.parquet")
    kept = sorted(tasks.loc[tasks["verdict"] == "compatible", "task_id"])
    assert kept == sorted(SOUND)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == kept
    for tid in kept:
        src = sorted(p.relative_to(SAMPLE / tid) for p in (SAMPLE / tid).rglob("*") if p.is_file())
        dst = sorted(p.relative_to(out / tid) for p in (out / tid).rglob("*") if p.is_file())
        assert src == dst and all(filecmp.cmp(SAMPLE / tid / f, out / tid / f, shallow=False) for f in src)
    assert verify_package(out) == []
    said = json.loads((out / HASH_MANIFEST).read_bytes())
    assert said["source"]["run_id"] == run_dir.name and len(said["files"]) == sum(
        1 for p in out.rglob("*") if p.is_file()) - 1
    excluded = json.loads((out / EXCLUSIONS).read_bytes())["exclusions"]
    assert sorted(e["task_id"] for e in excluded) == sorted(set(PICK) - set(SOUND))
    card = (out / CARD).read_text()
    assert f"{len(kept)} of {len(tasks)} tasks retained" in card
    for reason, n in tasks.loc[tasks["verdict"] != "compatible", "reason"].value_counts().items():
        assert f"| excluded: {reason} | {n} |" in card
    assert "python:3.12-slim*" in card and "Python 3.11 is served" in card
    env = environments.get("harbor")
    loaded = env.load(env.Config(dataset=str(out)))
    assert sorted(loaded.task(i).id for i in range(loaded.size)) == kept
    (out / "csv-to-json" / "instruction.md").write_text("changed")
    assert any(p.startswith("csv-to-json/instruction.md") for p in verify_package(out))


def test_package_in_the_published_shape_loads_as_the_same_tasks(pooled, tmp_path):
    run_dir, _ = pooled
    out = tmp_path / "pub"
    assert main(["package", str(run_dir), "--out", str(out), "--format", "parquet"]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == sorted(
        [CARD, EXCLUSIONS, HASH_MANIFEST, "data/train-00000-of-00001.parquet"])
    assert verify_package(out) == []
    table = pd.read_parquet(out / "data/train-00000-of-00001.parquet")
    assert list(table["path"]) == sorted(SOUND) and {"task_binary", "task_id",
                                                     "instruction"} <= set(table.columns)
    env = environments.get("harbor")
    loaded = env.load(env.Config(dataset=str(out)))
    directory = env.load(env.Config(dataset=str(SAMPLE)))
    want = {directory.task(i).id: directory.task(i).hash for i in range(directory.size)
            if directory.task(i).id in SOUND}
    assert {loaded.task(i).id: loaded.task(i).hash for i in range(loaded.size)} == want
    assert json.loads((out / HASH_MANIFEST).read_bytes())["revision"] == loaded.revision


def test_package_refuses_what_it_cannot_certify(pooled, tmp_path, capsys):
    run_dir, _ = pooled
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert main(["package", str(run_dir), "--out", str(full)]) == 2
    assert "--out" in capsys.readouterr().err
    unsealed = tmp_path / "unsealed"
    shutil.copytree(run_dir, unsealed)
    (unsealed / "checksums").unlink()
    assert main(["package", str(unsealed), "--out", str(tmp_path / "a")]) == 2
    assert "not sealed" in capsys.readouterr().err
    tampered = tmp_path / "tampered"
    shutil.copytree(run_dir, tampered)
    att = pd.read_parquet(tampered / "attempts.parquet")
    att.loc[att.index[0], "image_digest"] = "sha256:" + "1" * 64
    att.to_parquet(tampered / "attempts.parquet", index=False)
    write_checksums(RunPaths(tampered))
    assert main(["package", str(tampered), "--out", str(tmp_path / "b")]) == 2
    assert "fails its audit" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
