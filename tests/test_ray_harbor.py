"""A task-directory dataset through the ``ray`` executor, on a node that has none of its
images: a real Ray cluster this module starts and stops (a head with no CPUs, so every trial
runs on the worker node) whose one worker node talks to a dockerd of its own, started empty
by this module (no sandbox image, no task image), with an empty image store of its own. The
contract is frozen on the suite's dockerd, the driver's. The node gets the sandbox image by
digest from the driver's store, and each task's frozen image by id from the driver's daemon
(saved there once, loaded on the node); every verdict equals the task's own label, every row
names the node, the run's build logs are the driver's copies, and the audit passes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import docker
import pandas as pd
import pytest
from ray.cluster_utils import Cluster

from tests.conftest import VALIDATE, subprocess_env
from tests.dockerd import SHORT_TMP, PrivateDockerd
from validate.audit.run import audit
from validate.contract.manifest import load_manifest
from validate.core.paths import task_image_store

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
#: A sound task (a config edited) and one whose answer is left in its image. Not c-fix-build:
#: its build here would leave docker's layer cache warm for tests/test_task_images.py, which
#: reads that task's first build log.
PICK = ("answer-in-image", "edit-config")


def label(task_id: str) -> tuple[str, str]:
    meta = tomllib.loads((SAMPLE / task_id / "task.toml").read_text())["metadata"]
    return meta["expected_verdict"], meta["expected_reason"]


@pytest.fixture(scope="module")
def node_dockerd():
    """The worker node's own dockerd: nothing in it until the run fetches it."""
    daemon = PrivateDockerd(Path(tempfile.mkdtemp(prefix="dn", dir=SHORT_TMP)))
    daemon.start()
    yield daemon
    daemon.stop()
    daemon.cleanup()


@pytest.fixture(scope="module")
def cluster(node_dockerd):
    temp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "DOCKER_HOST", "VALIDATE_IMAGE_DIR")}
    os.environ["RAY_TMPDIR"] = temp
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        # The worker node's raylet (and so its Ray workers) starts with the node's own daemon
        # and an empty image store, as `ray start` on a machine of its own would.
        os.environ["DOCKER_HOST"] = node_dockerd.host
        os.environ["VALIDATE_IMAGE_DIR"] = str(Path(temp) / "node-images")
        node = c.add_node(num_cpus=2)
    finally:
        for k, v in saved.items():
            if k == "RAY_TMPDIR":
                continue
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        c.wait_for_nodes()
        yield c, node
    finally:
        c.shutdown()
        if saved["RAY_TMPDIR"] is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved["RAY_TMPDIR"]
        shutil.rmtree(temp, ignore_errors=True)


def _validate(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*VALIDATE, *args], capture_output=True, text=True, env=subprocess_env(), cwd=cwd,
                          timeout=1200)


def _driver_logs(c: Cluster) -> str:
    """The tail of each Ray driver's own log on the cluster (its core worker's: what Ray saw
    when a driver exits without a word on stderr)."""
    logs = sorted(Path(c.head_node.get_logs_dir_path()).glob("python-core-driver-*.log"))
    return "\n".join(f"{p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs)


def test_a_node_without_the_task_images_fetches_each_by_id_and_every_verdict_is_its_label(tmp_path, cluster,
                                                                                            node_dockerd):
    from validate.core import environments

    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(SAMPLE)))
    idx = [i for i in range(ts.size) if ts.task(i).id in PICK]
    per_task = len(env.agents(env.Config(dataset=str(SAMPLE))))  # --agents all: the oracle and every control
    frozen = _validate(tmp_path, "freeze", "--name", "rh", "--env", "harbor", "--dataset", str(SAMPLE),
                       "--idx", ",".join(map(str, idx)), "--min-count", "1", "--out", "m.json",
                       "--allow-patch")
    assert frozen.returncode == 0, frozen.stderr
    images = load_manifest(tmp_path / "m.json").execution.task_images
    ids = sorted(images.tasks[t].image for t in PICK)
    node_daemon = docker.DockerClient(base_url=node_dockerd.host, timeout=60)
    for image_id in ids:
        with pytest.raises(docker.errors.ImageNotFound):
            node_daemon.images.get(image_id)

    c, node = cluster
    r = _validate(tmp_path, "run", "--manifest", "m.json", "--agents", "all", "--run-dir", "ledgers/r",
                  "--allow-patch", "--executor", "ray", "--ray-address", c.address, "-c", "2", "--json")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:], _driver_logs(c))
    run = tmp_path / "ledgers" / "r"
    tasks = pd.read_parquet(run / "tasks.parquet").set_index("task_id")
    att = pd.read_parquet(run / "attempts.parquet")
    assert set(att["status"]) <= {"ok", "exit_nonzero"}, att[["task_id", "agent", "error_message"]].to_dict(
        "records"
    )
    reason = lambda t: tasks.loc[t, "reason"] if isinstance(tasks.loc[t, "reason"], str) else ""  # noqa: E731
    assert {t: (tasks.loc[t, "verdict"], reason(t)) for t in PICK} == {t: label(t) for t in PICK}, \
        tasks[["verdict", "reason", "detail"]].to_dict("index")
    assert len(att) == len(PICK) * per_task
    assert set(att["node"]) == {node.node_id}  # the head has no CPUs: every trial ran on the fetching node
    assert sorted(set(att["image_digest"])) == ids  # each row names its task's frozen image
    # The node's daemon now holds each frozen image under the same id (docker load keeps it),
    # saved once from the driver's daemon into the driver's store.
    assert sorted(node_daemon.images.get(i).id for i in ids) == ids
    saved = task_image_store() / "saved"
    assert sorted(f"sha256:{p.stem}" for p in saved.glob("*.tar") if f"sha256:{p.stem}" in ids) == ids
    # The build logs are the driver's copies of the frozen ones (the node never wrote the run).
    assert len(list((run / "build-logs").glob("*.log"))) == len(PICK)
    report = audit(run)
    assert report.problems == [], report.problems
    assert json.loads(r.stdout)["counts"]["attempts"] == len(PICK) * per_task
