"""Sandbox backends are an open registry (``validate.backends``): a backend that lives in
tests/ (`tests.toybackend`, one module and one entry point, no edit under validate/) runs a
real pool end to end and its run passes the audit; a name nobody registered is refused
wherever it is given (a manifest, ``--backend``, the image build), naming the installed ones."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.conftest import VALIDATE, make_ctx, make_manifest, subprocess_env
from validate.audit.run import audit
from validate.contract.manifest import parse_manifest
from validate.core.errors import ContractError, ProfileUnavailable
from validate.core.records import EXCEPTION_STATUSES
from validate.report.run import write_report
from validate.run.phases import PoolPhase, pool
from validate.sandbox import backend_class, backend_names, open_sandbox


def test_the_registry_lists_the_projects_backends_and_the_tests_without_importing_them():
    assert backend_names() == ["bwrap", "docker", "docker-gvisor", "podman", "subprocess", "toy"]
    assert backend_class("toy").__module__ == "tests.toybackend"


@pytest.mark.bwrap  # the toy wraps real bubblewrap, as root
def test_a_backend_from_tests_runs_a_real_pool_that_passes_the_audit(tmp_path):
    sandbox = open_sandbox("toy", image="host", run_label="pytest-toy")
    manifest = make_manifest(sandbox, idx=[0, 1, 2, 3], env_name="toy", broken=[2], min_task_count=3)
    assert manifest.execution.backend == "toy" and manifest.execution.backend_version.startswith(
        "toy over bubblewrap"
    )
    summary = pool(make_ctx(manifest, sandbox, tmp_path / "pool"), PoolPhase())
    write_report(tmp_path / "pool")
    rows = pq.read_table(tmp_path / "pool" / "attempts.parquet").to_pylist()
    assert {r["backend"] for r in rows} == {"toy"} and not {r["status"]
                                                            for r in rows} & set(EXCEPTION_STATUSES)
    oracle = {r["idx"]: r["reward"] for r in rows if r["role"] == "oracle"}
    # the exact sums, read in the sandbox
    assert {idx: oracle[idx] for idx in (0, 1, 3)} == {0: 1.0, 1: 1.0, 3: 1.0}
    controls = [r for r in rows if r["role"] == "control"]
    # all rejected
    assert {r["idx"] for r in controls} == {0, 1, 3} and all(r["reward"] < 1.0 for r in controls)
    assert (summary.counts.compatible, summary.counts.excluded) == (3, 1)
    result = audit(tmp_path / "pool")
    assert result.problems == [] and result.checked


def test_an_unknown_backend_in_a_manifest_is_refused_naming_the_installed_ones(tmp_path):
    sandbox = open_sandbox("subprocess", image="host")
    raw = json.loads(make_manifest(sandbox, idx=[0], env_name="toy").to_json())
    raw["execution"]["backend"] = "firecracker"
    with pytest.raises(ContractError) as e:
        parse_manifest(json.dumps(raw).encode(), "manifests/m.json")
    assert str(e.value).startswith("manifests/m.json: field 'execution.backend: ")
    assert (
        "no backend named 'firecracker'; installed: bwrap, docker, docker-gvisor, podman, subprocess, toy"
        in str(e.value)
    )
    path = tmp_path / "m.json"
    path.write_text(json.dumps(raw))
    import subprocess

    r = subprocess.run([*VALIDATE, "verify", "--manifest", str(path)], capture_output=True, text=True,
                       env=subprocess_env(), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "installed: bwrap, docker, docker-gvisor, podman, subprocess, toy" in r.stderr


def test_an_unknown_backend_is_refused_by_open_sandbox_the_image_build_and_freeze(tmp_path):
    from validate.sandbox.image import build

    for refuse in (lambda: open_sandbox("nope", image="host"),
                   lambda: build("never:built", ["bwrap", "nope"])):
        with pytest.raises(ProfileUnavailable, match=r"execution.backend: no backend named 'nope'; "
                                                     r"installed: bwrap, docker, docker-gvisor, "
                                                     r"podman, subprocess, toy"):
            refuse()
    import subprocess

    r = subprocess.run([*VALIDATE, "freeze", "--env", "toy", "--name", "x", "--backend", "nope"],
                       capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path)
    assert (
        r.returncode == 2
        and "invalid choice: 'nope' (choose from 'bwrap', 'docker', 'docker-gvisor', 'podman', 'subprocess', "
        "'toy')"
        in r.stderr
    )


def test_a_backend_without_live_sessions_refuses_one_by_name():
    from validate.sandbox import RunRequest

    session = open_sandbox("toy", image="host").session(RunRequest(argv=(), name="no-session"))
    with pytest.raises(ProfileUnavailable, match="execution.backend: toy has no live sessions"):
        session.start()
    session.stop()  # safe after a failed start
