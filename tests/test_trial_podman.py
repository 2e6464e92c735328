"""Harbor trials on the rootless podman profile (`validate.taskdir.trial.run` over the suite's own
rootless service, `tests/podmand.py`): the task image built in that service.

What is shown: a trivial task's oracle passes and nop fails, the reward read by the harness
from the verifier's files; an agent that leaves a background process holding its output
pipe ends when its command ends (podman 4.3 never reports a detached exec as ended: the
harness attaches); an agent that does not end is timed out by the harness's clock; the
memory limit podman itself would ignore holds (the harness's own cgroup); the task image
outlives the trial's snapshot (podman's Docker API prunes untagged parents with it); the
reward forger's planted files stay out of the verifier's fresh volume; and
nothing of the trial — container, snapshot, volume, cgroup — is left.
"""

from __future__ import annotations

import io
import os
import tarfile
import textwrap
from pathlib import Path

import pytest

from environment.harbor.taskdir import HarborTask, load_dataset, load_task
from validate.core.paths import DEFAULT_IMAGE, task_image_store
from validate.core.records import ORACLE
from validate.sandbox.docker.wire import LABEL
from validate.sandbox.podman import PodmanSandbox
from validate.taskdir.images.bases import build_base_map
from validate.taskdir.images.build import TaskImage, build_task_image
from validate.taskdir.images.docker import BASE_REPOSITORY, PodmanImages
from validate.taskdir.trial import docker as dk
from validate.taskdir.trial.agents import NOP, REWARD_FORGER
from validate.taskdir.trial.result import TrialLimits
from validate.taskdir.trial.run import run_trial

pytestmark = pytest.mark.podman

SAMPLE = Path(__file__).resolve().parents[1] / "examples/harbor-sample"

LIMITS = TrialLimits(cpus=1, memory_mb=128, pids=64, max_agent_timeout_s=60, max_verifier_timeout_s=60)

TOML = """\
schema_version = "1.4"

[task]
name = "podman/{name}"

[verifier]
timeout_sec = 60

[agent]
timeout_sec = {agent_timeout}

[environment]
build_timeout_sec = 300
cpus = 1
memory_mb = 128
"""

#: The answer, and a background process that keeps the agent's output pipe open for 10 min.
SOLVE = {
    "answer": "#!/bin/bash\necho 42 > /app/answer\n(sleep 600 &)\nnohup sleep 600 &\n",
    "hang": "#!/bin/bash\nsleep 600\n",
    "hog": "#!/bin/bash\n"
           "python3 -c 'b = bytearray(400 * 2**20); open(\"/app/answer\", \"w\").write(\"42\\n\")'\n",
}

TEST_SH = textwrap.dedent("""\
    #!/bin/bash
    if [ "$(cat /app/answer 2>/dev/null)" = 42 ]; then echo 1 > /logs/verifier/reward.txt
    else echo 0 > /logs/verifier/reward.txt; fi
    """)


def _task(root: Path, name: str, agent_timeout: int = 30) -> HarborTask:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "tests").mkdir()
    (d / "task.toml").write_text(TOML.format(name=name, agent_timeout=agent_timeout))
    (d / "instruction.md").write_text("Write 42 to /app/answer.\n")
    (d / "environment/Dockerfile").write_text(f"FROM {DEFAULT_IMAGE}\nWORKDIR /app\n")
    (d / "solution/solve.sh").write_text(SOLVE[name])
    (d / "tests/test.sh").write_text(TEST_SH)
    task = load_task(root, name)
    assert isinstance(task, HarborTask), task
    return task


@pytest.fixture(scope="module")
def podman():
    sb = PodmanSandbox(image=DEFAULT_IMAGE, run_label=f"pytest-trial-{os.getpid()}")
    yield sb
    dk.sweep(sb.client.api, f"{LABEL}={sb.run_label}")
    sb.close()


def _image(sb: PodmanSandbox, task_dir: Path) -> str:
    stream = sb.client.api.build(path=str(task_dir / "environment"), rm=True, forcerm=True, pull=False,
                                 decode=True, labels={LABEL: sb.run_label})
    ids = [c["aux"]["ID"] for c in stream if isinstance(c.get("aux"), dict) and c["aux"].get("ID")]
    assert ids, "the build named no image"
    return ids[-1]


def _left(sb: PodmanSandbox, trial_run: str) -> list:
    api = sb.client.api
    f = {"label": f"{LABEL}={trial_run}"}
    return api.containers(all=True, quiet=True, filters=f) + (api.volumes(filters=f)
                                                              or {}).get("Volumes", []) \
        + [i for i in api.images(all=True, quiet=True, filters=f)]


def _trial(sb, task, root, image, agent, label):
    return run_trial(sb.client, task, root / task.id.split("/")[-1], image, agent, LIMITS, run_label=label,
                     resolver_image=DEFAULT_IMAGE)


def test_oracle_passes_nop_fails_and_a_background_process_does_not_hold_the_wait(podman, tmp_path):
    task = _task(tmp_path, "answer")
    image = _image(podman, tmp_path / "answer")
    label = f"{podman.run_label}-a"
    oracle = _trial(podman, task, tmp_path, image, ORACLE, label)
    assert oracle.status == "ok", (oracle.infrastructure_error, oracle.task_error, oracle.verifier_error)
    assert oracle.reward == 1.0 and oracle.reward_source == "reward.txt"
    # solve.sh left two sleeps of 600 s holding its pipe; the 30 s agent timeout never came
    assert oracle.agent_run.exit_code == 0 and not oracle.agent_run.timed_out
    assert oracle.verifier_run.exit_code == 0
    nop = _trial(podman, task, tmp_path, image, NOP, label)
    # (before libpod's noprune: the oracle's cleanup took the task image, so nop could not start)
    assert nop.status == "ok" and nop.reward == 0.0, nop.infrastructure_error
    for r in (oracle, nop):
        assert r.cleanup_errors == []
    # the snapshot's removal took neither the task image (an untagged build) nor anything else
    assert podman.client.api.inspect_image(image)["Id"] == image
    assert _left(podman, label) == []
    assert not [p for p in Path("/sys/fs/cgroup/pids").glob(f"*/{label}-*")]


def test_the_reward_forgers_files_do_not_reach_the_verifier(podman, tmp_path):
    """It plants both reward files in /logs/verifier (and a rewriter): the verifier's fresh
    volume there starts empty (podman's Docker API would have copied the snapshot's files into
    it), so the reward is the verifier's own 0."""
    task = _task(tmp_path, "answer")
    r = _trial(podman, task, tmp_path, _image(podman, tmp_path / "answer"), REWARD_FORGER,
               f"{podman.run_label}-f")
    assert {f.path for f in r.left_in_verifier_dir} >= {"reward.json", "reward.txt"}
    assert r.status == "ok" and r.reward == 0.0 and r.reward_source == "reward.txt", (
        r.reward,
        r.reward_source,
    )
    assert r.cleanup_errors == []


def test_an_agent_that_does_not_end_is_timed_out_by_the_harness(podman, tmp_path):
    task = _task(tmp_path, "hang", agent_timeout=3)
    r = _trial(podman, task, tmp_path, _image(podman, tmp_path / "hang"), ORACLE, f"{podman.run_label}-h")
    assert r.status == "agent_timeout" and r.agent_run.timed_out and r.agent_run.exit_code is None
    assert r.reward == 0.0 and r.cleanup_errors == []


def test_the_memory_limit_podman_ignores_holds(podman, tmp_path):
    """400 MiB under a 128 MiB limit: rootless podman on cgroup v1 would let it through."""
    task = _task(tmp_path, "hog")
    r = _trial(podman, task, tmp_path, _image(podman, tmp_path / "hog"), ORACLE, f"{podman.run_label}-m")
    assert r.agent_run.oom_killed and r.status == "agent_oom", (r.status, r.agent_run)
    assert r.reward == 0.0 and r.cleanup_errors == []


def test_a_sample_task_image_is_built_in_the_rootless_service_and_its_oracle_passes(podman, tmp_path):
    """The task images' podman backend: the bases imported under the harness's own name
    (podman's Docker API import would drop the tag), the task built by the rootless service,
    its cache key podman's own; the oracle of the sample's csv-to-json passes in it."""
    images = PodmanImages(podman.host)
    try:
        bases = build_base_map(images, task_image_store() / "bases", log=lambda _msg: None)
        for base in bases.bases.values():
            tags = images.client.api.inspect_image(base.image_id)["RepoTags"]
            assert all(t.startswith(f"localhost/{BASE_REPOSITORY}:") for t in tags) and tags, tags
        built = build_task_image(SAMPLE / "csv-to-json", bases, images, tmp_path / "store",
                                 build_timeout_s=600)
        assert isinstance(built, TaskImage) and built.backend == "podman", built
        task = next(t for t in load_dataset(SAMPLE).tasks if t.id == "csv-to-json")
        r = run_trial(podman.client, task, SAMPLE / "csv-to-json", built.image_id, ORACLE, LIMITS,
                      run_label=f"{podman.run_label}-s", resolver_image=DEFAULT_IMAGE)
        assert r.status == "ok" and r.reward == 1.0, (r.infrastructure_error, r.verifier_error)
        assert images.image_labels(built.image_id) is not None  # still there after the trial
        # podman's builder, too, reads the rewrite and copies the task's Dockerfile as written
        copying = build_task_image(
            SAMPLE / "answer-in-image", bases, images, tmp_path / "store", build_timeout_s=600
        )
        assert isinstance(copying, TaskImage), copying
        # read from a created, never started container (running one through podman's Docker API
        # can leave the client waiting on the logs of a container that has already exited)
        api = images.client.api
        cid = api.create_container(copying.image_id, command=["true"], network_disabled=True)["Id"]
        try:
            chunks, _ = api.get_archive(cid, "/app")
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                names = sorted(m.name for m in tar.getmembers())
                member = tar.extractfile("app/Dockerfile")
                copied = member.read() if member is not None else b""
        finally:
            api.remove_container(cid, force=True)
        written = (SAMPLE / "answer-in-image/environment/Dockerfile").read_bytes()
        assert copied == written, copied
        assert "app/.validate-build.Dockerfile" not in names and "app/.dockerignore" not in names, names
    finally:
        images.client.close()
