"""Tasks that name their image (``[environment].docker_image``, no Dockerfile), for real: one
served by the profile's base-image map is built as that base (its substitution recorded as a
``FROM`` of it is) and frozen per task like a built image; one the map does not serve is
``unsupported_execution_contract`` naming the image, nothing built; the served one's oracle
passes through docker in its frozen image, and the audit passes. The dataset is made in a
temporary directory from the sample's prebuilt-image task (the sample itself is not edited).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from environment.harbor.taskdir import load_dataset
from tests import test_eval_shell
from tests.conftest import make_ctx, make_manifest
from tests.test_eval_shell import NOTHING, evaluate_with
from tests.test_task_images import CountingImages
from validate import api
from validate.audit.eval import _attempts as eval_attempts
from validate.audit.run import audit
from validate.audit.seal import AuditResult
from validate.cli.main import main
from validate.contract.manifest import Manifest, write_manifest
from validate.core import environments
from validate.core.paths import task_image_store
from validate.run.phases import RunPhase, run_agents
from validate.sandbox import storage
from validate.taskdir.images.bases import build_base_map
from validate.taskdir.images.build import TaskImage, TaskImageRefusal, build_task_image
from validate.taskdir.images.docker import DockerImages
from validate.taskdir.images.frozen import log_dir_of
from validate.taskdir.trial.roots import tree_store
from validate.taskdir.trial.support import unsupported

#: test_eval_shell's server fixture, shared: pytest finds it by this module-level name (bound by
#: assignment: ruff reads a test's parameter named like an imported fixture as a redefinition).
server = test_eval_shell.server

pytestmark = pytest.mark.docker

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
PYTHON = "python-3.11-slim-bookworm"
#: task id → its [environment].docker_image
IMAGES = {"served": "python:3.12-slim", "unserved": "ubuntu:24.04"}


def _dataset(root: Path) -> Path:
    """The sample's prebuilt-image task twice, naming a served and an unserved image."""
    for tid, image in IMAGES.items():
        shutil.copytree(SAMPLE / "prebuilt-image", root / tid)
        toml = root / tid / "task.toml"
        text = toml.read_text().replace('docker_image = "python:3.11-slim-bookworm"',
                                        f'docker_image = "{image}"')
        assert image in text
        toml.write_text(text.replace('name = "harbor-sample/prebuilt-image"', f'name = "prebuilt/{tid}"'))
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return _dataset(tmp_path_factory.mktemp("prebuilt") / "dataset")


def test_the_support_rule_leaves_a_named_image_to_the_base_map(dataset):
    tasks = {t.id: t for t in load_dataset(dataset).tasks}
    assert {t: (tasks[t].environment, tasks[t].docker_image) for t in IMAGES} == \
        {t: ("image", image) for t, image in IMAGES.items()}
    assert unsupported(tasks["served"], "docker") is None and unsupported(tasks["served"], "bwrap") is None


def test_a_served_image_is_the_mapped_base_with_its_substitution_recorded(dataset, tmp_path):
    images = CountingImages()
    base_map = build_base_map(images, task_image_store() / "bases", log=lambda _m: None)
    got = build_task_image(dataset / "served", base_map, images, tmp_path, docker_image="python:3.12-slim")
    assert isinstance(got, TaskImage), got
    base = base_map.bases[PYTHON]
    assert got.layers == [base.layer]  # the base's one layer, nothing added
    assert [(b.upstream, b.recipe, b.substitution.upstream) for b in got.bases] == \
        [("python:3.12-slim", PYTHON, "python:3.12-slim*")]
    # the same recorded differences a `FROM python:3.12-slim` gets
    from_dockerfile = tmp_path / "fromtask"
    (from_dockerfile / "environment").mkdir(parents=True)
    (from_dockerfile / "environment/Dockerfile").write_text("FROM python:3.12-slim\n")
    built = build_task_image(from_dockerfile, base_map, images, tmp_path)
    assert got.bases[0].differences == built.bases[0].differences
    assert "Python 3.11 is served where the task asks for Python 3.12: code needing 3.12 features fails" in \
        got.bases[0].differences
    assert (
        '-docker_image = "python:3.12-slim"\n' in got.patch
        and f'+docker_image = "{base.image_id}"\n' in got.patch
    )
    builds = images.builds
    again = build_task_image(dataset / "served", base_map, images, tmp_path, docker_image="python:3.12-slim")
    assert again.cached and again.image_id == got.image_id and images.builds == builds
    refused = build_task_image(dataset / "unserved", base_map, images, tmp_path, docker_image="ubuntu:24.04")
    assert refused == TaskImageRefusal(reason="unsupported_execution_contract",
                                       detail="[environment].docker_image ubuntu:24.04 is not "
                                              "available on this profile")
    assert images.builds == builds
    images.client.close()


@pytest.fixture(scope="module")
def frozen(dataset, tmp_path_factory):
    path = tmp_path_factory.mktemp("prebuilt-manifests") / "pb.json"
    m = api.freeze("pb", env="harbor", config={"dataset": str(dataset)}, backend="docker", min_count=1,
                   allow_patch=True, out=path)
    return path, m


def test_freeze_routes_the_served_task_to_its_image_and_refuses_the_other(frozen):
    _, m = frozen
    ti = m.execution.task_images
    served, unserved = ti.tasks["served"], ti.tasks["unserved"]
    assert served.refusal is None and served.image.startswith("sha256:")
    assert served.layers == (ti.base_map.bases[PYTHON].layer,) and served.bases == {
        "python:3.12-slim": PYTHON
    }
    assert served.patch_sha256 and served.log_sha256
    assert DockerImages().image_layers(served.image) == [ti.base_map.bases[PYTHON].layer]
    assert (unserved.refusal, unserved.image) == ("unsupported_execution_contract", None)
    assert unserved.detail == "[environment].docker_image ubuntu:24.04 is not available on this profile"


def test_the_served_tasks_oracle_passes_in_its_frozen_image(frozen, sandboxes, tmp_path):
    _, m = frozen
    run_dir = tmp_path / "run"
    run_agents(make_ctx(m, sandboxes("docker"), run_dir, concurrency=2), RunPhase(agents="oracle"))
    att = pd.read_parquet(run_dir / "attempts.parquet").set_index("task_id")
    served = att.loc[["served"]]
    assert len(served) == 1 and served["status"].iloc[0] == "ok" and served["reward"].iloc[0] == 1.0, \
        served[["status", "error_class", "error_message", "stderr"]].to_dict("records")
    assert att.loc["served", "image_digest"] == m.execution.task_images.tasks["served"].image
    assert att.loc["unserved", "status"] == "unsupported_execution_contract"
    assert "ubuntu:24.04" in att.loc["unserved", "error_message"]
    assert audit(run_dir).problems == []


def test_the_environment_loads_both(dataset):
    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(dataset)))
    assert sorted(ts.task(i).id for i in range(ts.size)) == sorted(IMAGES)


def _with_image(m, task_id: str, image: str):
    """The manifest `m` with `task_id`'s frozen image id and content replaced (sealed again): an
    image this machine can have neither by id nor by content."""
    ti = m.execution.task_images
    entry = ti.tasks[task_id].model_copy(update={"image": image, "content": "sha256:" + "2" * 64})
    ti = ti.model_copy(update={"tasks": {**ti.tasks, task_id: entry}})
    return m.model_copy(update={"execution": m.execution.model_copy(update={"task_images": ti})}).sealed()


def test_verify_holds_every_frozen_task_image(frozen, tmp_path, capsys):
    path, m = frozen
    assert main(["verify", "--manifest", str(path)]) == 0
    assert "1 task images held" in capsys.readouterr().out
    other = tmp_path / "other.json"
    write_manifest(_with_image(m, "served", "sha256:" + "0" * 64), other)
    assert main(["verify", "--manifest", str(other)]) == 2
    said = capsys.readouterr().err
    assert "execution.task_images.tasks['served'].image" in said and "sha256:" + "0" * 64 in said, said
    assert m.execution.task_images.tasks["served"].image in said  # what the cache built here


def test_a_run_refuses_a_frozen_task_image_this_machine_cannot_have_before_anything_plays(frozen, tmp_path,
                                                                                          capsys):
    _, m = frozen
    other = write_manifest(_with_image(m, "served", "sha256:" + "0" * 64), tmp_path / "other.json")
    run_dir = tmp_path / "run"
    assert main(["run", "--manifest", str(other), "--agents", "oracle", "--run-dir", str(run_dir),
                 "--allow-patch"]) == 2
    said = capsys.readouterr().err
    assert "execution.task_images.tasks['served'].image" in said and "sha256:" + "0" * 64 in said, said
    assert not run_dir.exists()  # refused before the run began: no trial played as an infrastructure error


def test_verify_refuses_a_daemon_image_with_other_layers(frozen, tmp_path, capsys):
    _, m = frozen
    ti = m.execution.task_images
    entry = ti.tasks["served"].model_copy(update={"layers": ("sha256:" + "1" * 64,)})
    bad = m.model_copy(update={"execution": m.execution.model_copy(update={"task_images": ti.model_copy(
        update={"tasks": {**ti.tasks, "served": entry}})})}).sealed()
    path = write_manifest(bad, tmp_path / "layers.json")
    assert main(["verify", "--manifest", str(path)]) == 2
    assert "the manifest froze ['sha256:1111" in capsys.readouterr().err


def test_freeze_like_freezes_the_task_images_on_its_profile(frozen, tmp_path):
    path, m = frozen
    like = tmp_path / "pb-like.json"
    assert main(["freeze", "--like", str(path), "--name", "pb-like", "--backend", "docker", "--allow-patch",
                 "--out", str(like)]) == 0
    again = Manifest.load(like)
    # the same daemon: every task's image (or refusal) as the contract froze it, from the cache
    assert again.execution.task_images.tasks == m.execution.task_images.tasks
    assert again.execution.task_images.base_map == m.execution.task_images.base_map
    log = again.execution.task_images.tasks["served"].log_sha256.removeprefix("sha256:")
    assert (log_dir_of(like) / f"{log}.log").is_file()
    assert main(["verify", "--manifest", str(like)]) == 0


def test_a_model_eval_records_each_tasks_routed_image_and_its_audit_holds_it(frozen, sandboxes, server,
                                                                             tmp_path):
    _, m = frozen
    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=m.environment.config["dataset"]))
    _, _, run_dir, _, _, attempts = evaluate_with((sandboxes("docker"), m, ts), server, tmp_path, NOTHING)
    assert attempts["served"]["status"] == "ok" and attempts["served"]["reward"] == 0.0
    assert attempts["served"]["image_digest"] == m.execution.task_images.tasks["served"].image
    assert attempts["unserved"]["image_digest"] == m.execution.image_digest  # refused: no image of its own
    assert api.eval_audit(run_dir).problems == []
    # the audit's rule: a row naming the sandbox image for a task routed to its own is off
    rows = pd.read_parquet(run_dir / "attempts.parquet")
    rows.loc[rows["task_id"] == "served", "image_digest"] = m.execution.image_digest
    r = AuditResult()
    eval_attempts(rows, m, 1, r, run_dir)
    assert any("1 attempt(s) on a backend or image_digest" in p and "task served" in p for p in r.problems), \
        r.problems


@pytest.mark.bwrap
def test_on_bwrap_the_served_tasks_oracle_passes_in_the_unpacked_base(dataset, sandboxes, tmp_path):
    """No frozen images on bwrap: the trial kind builds the task's image at run time, the same
    way, and the bwrap trial unpacks it (its tree removed afterwards)."""
    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(dataset)))
    sandbox = sandboxes("bwrap")
    m = make_manifest(sandbox, idx=list(range(ts.size)), env_name="harbor", dataset=str(dataset),
                      min_task_count=1)
    run_dir = tmp_path / "run"
    run_agents(make_ctx(m, sandbox, run_dir, concurrency=2), RunPhase(agents="oracle"))
    att = pd.read_parquet(run_dir / "attempts.parquet").set_index("task_id")
    served = att.loc[["served"]]
    record = json.loads(
        (run_dir / "replies" / served["reply_sha256"].iloc[0].removeprefix("sha256:")).read_bytes()
    )
    storage.remove_tree(tree_store() / record["image"].removeprefix("sha256:"))
    assert len(served) == 1 and served["status"].iloc[0] == "ok" and served["reward"].iloc[0] == 1.0, \
        served[["status", "error_class", "error_message", "stderr"]].to_dict("records")
    assert att.loc["unserved", "status"] == "unsupported_execution_contract"
    assert "ubuntu:24.04" in att.loc["unserved", "error_message"]
