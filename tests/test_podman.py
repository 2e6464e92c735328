"""The rootless profile (`validate.sandbox.podman`), beyond the conformance suite it also runs
(tests/test_sandbox.py, test_session.py, ... under the ``podman`` marker): it is rootless and
says so, its image is the image store's tarball, agents are the same host uids as under docker
and bwrap, and every limit rootless podman would ignore on this machine is enforced by the
harness — or the profile is refused, naming the limit."""

from __future__ import annotations

import os
import pwd
import uuid
from pathlib import Path

import pytest

from validate.core.errors import ProfileUnavailable
from validate.core.paths import DEFAULT_IMAGE, ImagePaths
from validate.sandbox import Limits, Mount, RunRequest, storage
from validate.sandbox.base import Limits as BaseLimits
from validate.sandbox.image import require_record
from validate.sandbox.podman import USER, idmap

pytestmark = pytest.mark.podman


def request(name: str, argv: tuple[str, ...], **limits) -> RunRequest:
    return RunRequest(argv=argv, name=f"{name}-{uuid.uuid4().hex[:8]}", workdir="/",
                      limits=Limits(timeout_s=30.0, **limits))


def test_the_profile_is_rootless_and_its_image_is_the_stores(sandboxes):
    facts = sandboxes("podman").facts()
    iso = facts.isolation
    assert iso is not None and iso.rootless and iso.root_maps_to == f"uid {pwd.getpwnam(USER).pw_uid}"
    # the single layer's diff_id
    assert facts.image_digest == require_record(ImagePaths(DEFAULT_IMAGE)).digest
    assert set(iso.limit_enforcement) == set(BaseLimits.model_fields)  # every limit says how it holds
    assert "cgroup" in iso.limit_enforcement["memory_mb"] and "cgroup" in iso.limit_enforcement["pids"]
    assert facts.version.startswith("podman ") and facts.seccomp.startswith("sha256:")


def test_memory_and_pids_hold_for_a_run_and_for_each_exec_of_a_session(sandboxes):
    """What rootless podman on cgroup v1 ignores (its --memory, --pids-limit) holds here: a
    300 MiB allocation under 64 MiB is OOM-killed, 40 processes under 16 cannot start, in a
    one-shot run and in a command exec'd into a live session alike."""
    sb = sandboxes("podman")
    bomb = ("python3", "-S", "-c", "b = bytearray(300 << 20); print('survived')")
    forks = ("sh", "-c", "for i in $(seq 40); do sleep 3 & done; wait; echo all-started")
    r = sb.run(request("mem", bomb, memory_mb=64))
    assert r.oom_killed and r.exit_code == 137 and b"survived" not in r.stdout
    r = sb.run(request("pids", forks, pids=16))
    assert b"all-started" not in r.stdout and b"fork" in r.stderr.lower()
    with sb.session(request("limits", ("sleep", "infinity"), memory_mb=64, pids=16)) as s:
        r = s.exec(bomb, timeout_s=20)
        assert r.oom_killed and b"survived" not in r.stdout
        r = s.exec(forks, timeout_s=20)
        assert b"all-started" not in r.stdout
        assert s.exec(("true",), timeout_s=20).exit_code == 0  # the session outlived both


def test_container_root_is_the_unprivileged_user_and_agents_are_their_own_host_uids(sandboxes, tmp_path):
    sb = sandboxes("podman")
    with storage.attempt_storage("pytest-podman", f"own-{uuid.uuid4().hex[:8]}", Limits(), gid=65534) as root:
        ws = root / "workspace"
        ws.mkdir(mode=0o755)
        os.chown(ws, 65534, 65534)
        with sb.session(RunRequest(argv=("sleep", "infinity"), name=f"own-{uuid.uuid4().hex[:8]}",
                                   mounts=(Mount(source=ws, target="/workspace", read_only=False),),
                                   limits=Limits(timeout_s=30.0))) as s:
            assert s.exec(("sh", "-c", "echo hi > /workspace/reply.txt"), timeout_s=20).exit_code == 0
            # the container's user namespace, seen from the host: its root is the service's user
            first = Path(f"/proc/{s.live.pid}/uid_map").read_text().split()[:3]
            assert first == ["0", str(pwd.getpwnam(USER).pw_uid), "1"]
        st = (ws / "reply.txt").stat()
        # as under docker and bwrap: the answer key's 0400 holds
        assert (st.st_uid, st.st_gid) == (65534, 65534)


def test_without_root_or_a_shared_attempt_parent_the_profile_is_refused_naming_the_limits(
    sandboxes, monkeypatch, tmp_path
):
    sb = sandboxes("podman")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ProfileUnavailable, match=r"execution.limits: .*ignore memory_mb, pids, cpus"):
        sb.facts()
    monkeypatch.undo()
    monkeypatch.setattr(storage, "DEFAULT_PARENT", tmp_path)  # a plain directory, not a shared mount
    with pytest.raises(ProfileUnavailable,
                       match=r"execution.limits: storage_mb, storage_inodes: .* not a shared"):
        sb.facts()


def test_idmap_keeps_the_agents_ids_and_gives_every_other_id_a_subordinate_one():
    service = [{"container_id": 0, "host_id": 999, "size": 1},
               {"container_id": 1, "host_id": 65533, "size": 2},
               {"container_id": 3, "host_id": 100000, "size": 65532}]
    m = idmap(service, (65533, 65534))
    assert m[0] == {"container_id": 0, "host_id": 0, "size": 1}
    assert {"container_id": 65533, "host_id": 1, "size": 2} in m  # 65533, 65534 → the host's own
    assert {"container_id": 1, "host_id": 3, "size": 65532} in m  # the rest, in order
    assert sum(e["size"] for e in m) == 65535
    foreign = idmap(service, (65532,))  # not among the user's ids: runs as a subordinate id
    assert sum(e["size"] for e in foreign) == 65535 and foreign[0]["host_id"] == 0


def test_the_service_is_the_tests_own(private_podman):
    """The suite talks to the service it started, never to one at the user's default socket."""
    assert private_podman is not None and os.environ["VALIDATE_PODMAN_HOST"] == private_podman.host
    assert private_podman.proc is not None and private_podman.proc.poll() is None


def test_the_cli_refuses_the_profile_in_one_line_when_no_rootless_service_answers(tmp_path):
    import subprocess

    from tests.conftest import VALIDATE, subprocess_env

    env = subprocess_env(VALIDATE_PODMAN_HOST=f"unix://{tmp_path}/none.sock")
    r = subprocess.run([*VALIDATE, "freeze", "--env", "toy", "--name", "x", "--backend", "podman",
                        "--allow-patch"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "no rootless podman service answers at unix://" in r.stderr and "none.sock" in r.stderr
