"""Faults caused for real: the suite's own dockerd dies mid-run (tests/dockerd.py; never the
machine's daemon), the harness is SIGKILLed mid-run, the image's content changes under a
contract, the run directory's disk fills up. Infrastructure faults must never masquerade as
task or agent failures, and a crash must lose nothing."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import docker
import pandas as pd
import pytest

from tests.conftest import (
    CORPUS_PATH,
    HINTS,
    VALIDATE,
    make_ctx,
    make_manifest,
    subprocess_env,
)
from tests.dockerd import SHORT_TMP, PrivateDockerd
from validate.contract.manifest import verify
from validate.core.errors import ContractError, ProfileUnavailable
from validate.core.paths import DEFAULT_IMAGE, ImagePaths, RunPaths
from validate.evidence.journal import Journal, file_sha256, read_attempts
from validate.run.phases import RunPhase, run_agents
from validate.sandbox import open_sandbox
from validate.sandbox.cgroups import open_cgroups
from validate.sandbox.storage import DEFAULT_PARENT


def cli(*args, cwd, **kw):
    return subprocess.run([*VALIDATE, *args, *(["--allow-patch"] if args[0] in ("freeze", "run") else [])],
                          cwd=cwd, capture_output=True, text=True, timeout=900, env=subprocess_env(), **kw)


def verdict_view(root) -> list[tuple]:
    t = pd.read_parquet(root / "tasks.parquet").sort_values("task_id")
    return list(zip(t["task_id"], t["verdict"], t["reason"].fillna(""), t["oracle_reward"],
                    t["max_control_reward"], strict=True))


@pytest.mark.docker
@pytest.mark.slow
def test_dockerd_stopped_mid_run_is_infrastructure_and_resume_completes(tmp_path, private_dockerd):
    sandbox = open_sandbox("docker", image=DEFAULT_IMAGE, run_label="fault-dockerd")
    # The retry rule: a passing retry after an outage counts (strict would exclude the task).
    manifest = make_manifest(sandbox, idx=list(range(8)), infra_retries=1, controls=["empty", "shuffled"],
                             exception_rule="retry")
    agents = "all"
    run_agents(make_ctx(manifest, sandbox, tmp_path / "reference"), RunPhase(agents=agents))
    ctx = make_ctx(manifest, sandbox, tmp_path / "outage")
    outage = threading.Event()

    def stop_then_restart():
        journal = RunPaths(tmp_path / "outage").journal
        while not journal.exists() or len(journal.read_bytes().splitlines()) < 4:
            time.sleep(0.05)
        outage.set()
        private_dockerd.stop()  # the suite's own daemon, by its pidfile; never the machine's
        time.sleep(1)
        private_dockerd.start()

    t = threading.Thread(target=stop_then_restart)
    t.start()
    run_agents(ctx, RunPhase(agents=agents))
    attempts = read_attempts(ctx.paths)
    t.join()
    assert outage.is_set()
    infra = [a for a in attempts if a.status == "infrastructure_error"]
    assert infra, "the outage produced no infrastructure error"
    assert all(a.error_class == "SandboxError" for a in infra)
    tasks = pd.read_parquet(tmp_path / "outage/tasks.parquet")
    # never a task's
    assert set(tasks.loc[tasks["verdict"] == "excluded", "reason"]) <= {"infrastructure_failure"}
    resumed_ctx = make_ctx(manifest, open_sandbox("docker", image=DEFAULT_IMAGE, run_label="fault-dockerd"),
                           tmp_path / "outage")
    summary = run_agents(resumed_ctx, RunPhase(agents=agents))
    attempts = read_attempts(resumed_ctx.paths)
    assert verdict_view(tmp_path / "outage") == verdict_view(tmp_path / "reference")
    final = [a for a in attempts if not a.superseded]
    assert len(final) == 8 * 3 and all(a.status in ("ok", "no_reply") for a in final)
    assert any(a.superseded and a.status == "infrastructure_error" for a in attempts)  # kept, not hidden
    assert summary.counts.retried_passes >= 1  # and the claim says how many passed only after a retry


@pytest.mark.parametrize("backend", [pytest.param("bwrap", marks=pytest.mark.bwrap),
                                     pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.slow])])
def test_harness_sigkilled_mid_run_then_resume(tmp_path, backend):
    n = 12 if backend == "docker" else 30
    r = cli("freeze", "--name", "kill", "--corpus", str(CORPUS_PATH), "--max-papers", "2", "--idx-stop",
            str(n), "--backend", backend, "--controls",
            "empty,shuffled,identity,reversed,singletons,malformed", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert cli("run", "--manifest", "manifests/kill.json", "--run-dir", "ledgers/ref",
               cwd=tmp_path).returncode == 0
    proc = subprocess.Popen([*VALIDATE, "run", "--manifest", "manifests/kill.json", "--run-dir", "ledgers/k",
                             "--allow-patch"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=subprocess_env())
    journal = tmp_path / "ledgers/k/journal.jsonl"
    while not journal.exists() or len(journal.read_bytes().splitlines()) < n:
        assert proc.poll() is None, "the run finished before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    recorded = Journal(RunPaths(tmp_path / "ledgers/k"), ()).existing()
    assert len(recorded) >= n and not (tmp_path / "ledgers/k/attempts.parquet").exists()
    # Whatever the killed run left mounted is under its sandbox's label (the one a resume
    # sweeps), never under the bare run id, which nothing sweeps and runs elsewhere share.
    assert _storage_of("k") == [], "attempt storage under the bare run id: no resume ever sweeps it"
    r = cli("run", "--manifest", "manifests/kill.json", "--resume", "ledgers/k", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    attempts = pd.read_parquet(tmp_path / "ledgers/k/attempts.parquet")
    keys = list(zip(attempts["task_id"], attempts["agent"], attempts["attempt"], strict=True))
    assert len(keys) == len(set(keys)) == n * 7  # none lost, none duplicated, none rerun needlessly
    assert set(zip(attempts["task_id"], attempts["agent"], strict=True)) >= {(a.task_id, a.agent)
                                                                             for a in recorded}
    assert verdict_view(tmp_path / "ledgers/k") == verdict_view(tmp_path / "ledgers/ref")
    assert not list((tmp_path / "ledgers/k").glob(".*"))  # no temp file left behind
    if backend == "docker":
        client = docker.from_env()
        assert client.containers.list(all=True, filters={"label": "deshuffle-validate=k"}) == []
    else:  # the resumed run swept the cgroups its killed predecessor left
        assert open_cgroups().names("k") == []
    assert set(attempts["run_id"]) == {"k"}  # one run id before and after the resume
    # the resume swept the tmpfs its killed predecessor left
    assert _storage_of(RunPaths(tmp_path / "ledgers/k").sandbox_label) == []


def _storage_of(label: str) -> list[str]:
    """Attempt storage mounted under `label` on this machine."""
    with open("/proc/self/mountinfo") as f:
        targets = [line.split()[4] for line in f]
    return sorted(t for t in targets if os.path.dirname(t) == str(DEFAULT_PARENT / label))


@pytest.mark.docker
def test_the_suite_talks_only_to_its_own_dockerd(private_dockerd):
    assert os.environ["DOCKER_HOST"] == private_dockerd.host
    assert docker.from_env().info()["DockerRootDir"] == str(private_dockerd.data_root)
    listeners = subprocess.run(["ss", "-xlpn"], capture_output=True, text=True, check=True).stdout
    [line] = [line for line in listeners.splitlines() if f" {private_dockerd.socket} " in line]
    assert f"pid={int(private_dockerd.pidfile.read_text())}," in line  # the daemon this session started
    probe = "import docker; print(docker.from_env().info()['DockerRootDir'])"  # a subprocess inherits it
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == str(private_dockerd.data_root)


@pytest.mark.docker
def test_a_dockerd_whose_directory_name_containerd_would_refuse_still_starts_containers():
    """The suite's dockerd lives in a mkdtemp directory, whose random name may end in "_" or
    hold "__": containerd refuses such a name as a namespace, and once every container start
    of a CI run failed so. Its namespaces and cgroup parent are a digest of the path instead."""
    daemon = PrivateDockerd(Path(tempfile.mkdtemp(prefix="dv", suffix="__x_", dir=SHORT_TMP)))
    try:
        daemon.start()
        client = docker.DockerClient(base_url=daemon.host, timeout=120)
        client.api.import_image_from_file(str(ImagePaths(DEFAULT_IMAGE).tarball), repository="dv-ns", tag="t")
        out = client.containers.run("dv-ns:t", ["sh", "-c", "echo ran"], remove=True, network_mode="none")
        assert out == b"ran\n"
    finally:
        daemon.stop()
        daemon.cleanup()
    assert not daemon.root.exists()


@pytest.mark.docker
def test_image_changed_under_the_contract_is_refused(tmp_path):
    client = docker.from_env()
    repo, tag = "deshuffle-validate-test", "digest"
    name = f"{repo}:{tag}"
    tarball = ImagePaths(DEFAULT_IMAGE).tarball
    changed = tmp_path / "changed.tar"  # the same packages and one more file: other content
    shutil.copyfile(tarball, changed)
    with tarfile.open(changed, "a") as tar:
        extra = tarfile.TarInfo("etc/generation")
        extra.size, extra.mode, extra.mtime = 2, 0o644, 1686355200
        tar.addfile(extra, io.BytesIO(b"2\n"))
    client.api.import_image_from_file(str(tarball), repository=repo, tag=tag, changes=["LABEL generation=1"])
    try:
        sandbox = open_sandbox("docker", image=name)
        manifest = make_manifest(sandbox, idx=[0])
        assert manifest.execution.image_digest == "sha256:" + file_sha256(tarball)
        verify(manifest, sandbox, HINTS)
        client.api.import_image_from_file(str(tarball), repository=repo, tag=tag,
                                          changes=["LABEL generation=2"])
        verify(manifest, sandbox, HINTS)  # a new image id, the same content: the digest is the content's
        client.api.import_image_from_file(str(changed), repository=repo, tag=tag)  # same name, new content
        with pytest.raises(ContractError, match="execution.(image_digest|packages)"):
            verify(manifest, sandbox, HINTS)
        client.images.remove(name, force=True)
        with pytest.raises(ProfileUnavailable, match="execution.image.*validate image build"):
            verify(manifest, sandbox, HINTS)
    finally:
        try:
            client.images.remove(name, force=True)
        except docker.errors.ImageNotFound:
            pass


@pytest.mark.bwrap
def test_disk_full_in_the_run_directory(tmp_path):
    assert cli("freeze", "--name", "full", "--corpus", str(CORPUS_PATH), "--idx-stop", "40", "--backend",
               "bwrap", cwd=tmp_path).returncode == 0
    ledger = tmp_path / "ledgers"
    ledger.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(ledger)], check=True)
    try:
        r = cli("run", "--manifest", "manifests/full.json", "--run-dir", "ledgers/run", cwd=tmp_path)
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert "No space left on device" in r.stderr and "Traceback" not in r.stderr
        assert "ledgers/run/" in r.stderr  # the file is named
        readable = Journal(RunPaths(ledger / "run"), ()).existing()
        assert readable, "nothing that finished was kept"
        assert not list((ledger / "run").glob(".*"))  # no half-written temp file left
    finally:
        subprocess.run(["umount", str(ledger)], check=True)
