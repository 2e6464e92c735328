"""The docker-gvisor profile beyond the conformance suite (which runs it like every confining
backend, tests/conftest.py): its execution profile records runsc and how each limit holds;
a daemon without runsc, or with one registered without what the profile needs, is refused
naming the fix; a failed start leaves no shim, gofer or sandbox behind; the contract's
`pids` counts the agent's tasks, not the sandbox's host threads."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import make_manifest
from tests.dockerd import BROKEN_GVISOR_RUNTIME
from validate.core.errors import ProfileUnavailable, SandboxError
from validate.core.paths import DEFAULT_IMAGE
from validate.sandbox import Limits, RunRequest
from validate.sandbox.docker.gvisor import GvisorSandbox, leftovers

pytestmark = getattr(pytest.mark, "docker-gvisor")


def test_the_profile_records_runsc_and_how_every_limit_is_enforced(sandboxes):
    facts = sandboxes("docker-gvisor").facts()
    assert facts.backend == "docker-gvisor" and ", runsc 0.0~" in facts.version
    assert facts.isolation is not None and facts.isolation.runtime == "runsc" and not facts.isolation.rootless
    assert set(facts.isolation.limit_enforcement) == set(Limits.model_fields) - {"max_log_bytes"}
    assert "RLIMIT_NPROC" in facts.isolation.limit_enforcement["pids"]
    assert facts.seccomp.startswith("gVisor's Sentry (runsc 0.0~") and facts.seccomp.endswith(
        "no seccomp profile"
    )
    manifest = make_manifest(sandboxes("docker-gvisor"), idx=[0], env_name="toy")  # the contract records it
    assert manifest.execution.backend == "docker-gvisor" and manifest.execution.isolation == facts.isolation


class Unregistered(GvisorSandbox):
    runtime = "runsc-nowhere"


class Misregistered(GvisorSandbox):
    runtime = BROKEN_GVISOR_RUNTIME  # registered without --network=none


def test_a_daemon_without_the_runtime_or_with_it_misregistered_is_refused_naming_the_fix():
    for cls, says in ((Unregistered,
                       "needs the OCI runtime 'runsc-nowhere' registered with the Docker daemon"),
                      (Misregistered, f"registers '{BROKEN_GVISOR_RUNTIME}' without --network=none")):
        sandbox = cls(image=DEFAULT_IMAGE, run_label=f"pytest-refused-{uuid.uuid4().hex[:6]}")
        try:
            with pytest.raises(ProfileUnavailable) as e:
                sandbox.facts()
        finally:
            sandbox.close()
        assert str(e.value).startswith("execution.backend: ") and says in str(e.value)
        assert '"runtimeArgs": ["--network=none"]' in str(e.value)  # the fix, spelled out


def test_a_failed_start_leaves_no_process_behind(monkeypatch):
    """Under runsc registered without --network=none every start fails after the shim, the
    gofer and the sandbox are up, and removing the container leaves them running; the run is
    infrastructure, and none of them outlives it."""
    from validate.sandbox.docker import gvisor

    sandbox = Misregistered(image=DEFAULT_IMAGE, run_label=f"pytest-failed-{uuid.uuid4().hex[:6]}")
    left_by_docker: dict[str, list[int]] = {}
    end = gvisor._end_leftovers

    def observed(cid: str) -> None:  # what the daemon's own removal left, then the profile's cleanup
        left_by_docker[cid] = leftovers(cid)
        end(cid)

    monkeypatch.setattr(gvisor, "_end_leftovers", observed)
    try:
        req = RunRequest(argv=("true",), name=f"nostart-{uuid.uuid4().hex[:8]}", workdir="/")
        with pytest.raises(SandboxError, match="cannot run with network enabled in root network namespace"):
            sandbox.run(req)
        ((cid, left),) = left_by_docker.items()
        assert len(left) >= 3, left  # the shim, the gofer, the sandbox: the runtime's known leak
        # none of them, nor anything else naming the container, is alive (containerd may still
        # be running the shim binary's own `delete` of the task it lost: give that a moment; on a
        # loaded 2-core machine it once took more than 10 s)
        deadline = time.monotonic() + 30
        while leftovers(cid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert leftovers(cid) == [], [Path(f"/proc/{p}/cmdline").read_bytes() for p in leftovers(cid)]
        assert sandbox.client.api.containers(all=True, filters={"id": cid}) == []
    finally:
        sandbox.close()


def test_pids_counts_the_agents_tasks_not_the_sandboxs_host_threads(sandboxes):
    """An idle runsc sandbox holds ~40 host threads: under the host's pids cgroup alone a
    limit of 16 would crash it at start. The agent gets its 16 tasks (the watchdog, itself
    and 14 children), and the fork past them fails with EAGAIN, as under runc."""
    code = ("import os, time\nn = 0\ntry:\n    for _ in range(40):\n        if os.fork() == 0:\n"
            "            time.sleep(2); os._exit(0)\n        n += 1\nexcept OSError as e:\n"
            "    print(n, e.errno)\n")
    result = sandboxes("docker-gvisor").run(RunRequest(argv=("python3", "-c", code), workdir="/",
                                                       name=f"pids-{uuid.uuid4().hex[:8]}",
                                                       limits=Limits(pids=16, timeout_s=30.0)))
    assert (result.exit_code, result.stdout) == (0, b"14 11\n"), result


def test_live_sessions_are_refused_naming_why(sandboxes):
    """Under runsc a session's command past the memory limit would end the whole sandbox
    (the host's OOM killer reaches only the Sentry), so the profile has no live sessions."""
    sandbox = sandboxes("docker-gvisor")
    session = sandbox.session(RunRequest(argv=(), name=f"session-{uuid.uuid4().hex[:8]}"))
    with pytest.raises(ProfileUnavailable, match="execution.backend: docker-gvisor has no live sessions: "
                                                 "under runsc a command past the memory limit ends "
                                                 "the whole sandbox"):
        session.start()
    session.stop()  # safe after a refused start
    assert (
        sandbox.client.api.containers(all=True, filters={"label": f"deshuffle-validate={sandbox.run_label}"})
        == []
    )
