"""The gVisor profile: the docker backend with every container under the ``runsc`` runtime.

The agent's system calls are served by gVisor's user-space kernel (the Sentry, on its ptrace
platform: systrap is unknown to the packaged build and kvm needs VT-x), not the host's; the
rest (container, watchdog, judging, limits but `pids`) is the docker backend's, unchanged.
The host's pids cgroup counts the sandbox's host threads under runsc, so the contract's
`pids` is set as the Sentry's RLIMIT_NPROC instead, with the cgroup a backstop above it
(`LIMIT_ENFORCEMENT` says how each limit holds; the execution profile records it).

What this profile needs of the daemon, checked by `facts` (`ProfileUnavailable` naming the
fix otherwise): a runtime named ``runsc`` registered in that daemon's own configuration, with
``--network=none`` among its runtime arguments. Without it this build of runsc cannot start a
container with the network disabled ("cannot run with network enabled in root network
namespace"); with it the sandbox has only its loopback, whatever the container asks for.

runsc does not load the container's seccomp profile (docker's default) unless registered
with ``--oci-seccomp``, and in this build that breaks threads (the profile's ENOSYS for
clone3 comes back as EPERM, so glibc does not fall back to clone): the system calls are the
Sentry's alone, and the profile says so. The Sentry grants some that docker's profile
refuses, inside its own kernel (``unshare(CLONE_NEWUSER)`` makes a namespace of gVisor's,
never of the host's), and implements others not at all (bpf, i386 system calls).

One-shot runs only: live sessions are refused (`GvisorSandbox.start_session` says why).

A start that fails under runsc leaves the shim, the gofer and the sandbox behind, which
removing the container does not end. `_remove` therefore also ends every host process whose
command line names the container's full id (ours: the id came back from our own create),
through ``runsc delete --force`` first, then a signal sent through a pidfd.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import NoReturn

import requests
from docker.errors import DockerException
from docker.types import Ulimit

from validate.core.errors import ProfileUnavailable
from validate.sandbox.base import BackendFacts, Capabilities, Isolation, RunRequest
from validate.sandbox.docker.backend import DockerSandbox
from validate.sandbox.docker.wire import unreachable

#: The daemon's runtime this profile runs under, and the arguments it must be registered with.
RUNTIME = "runsc"
REQUIRED_ARGS = ("--network=none",)
#: Seconds a leftover process of a failed start is given to go after its kill.
REAP_S = 5.0
#: The host's pids cgroup under runsc counts host threads, not the agent's tasks: an idle
#: sandbox holds about 40, each agent process about 6 more (its stub and the Sentry's
#: tracer threads), each extra thread of one process almost none; past the cgroup's limit
#: the whole sandbox crashes. So the contract's `pids` is the Sentry's RLIMIT_NPROC (which
#: it counts per sandbox, threads included, like the pids cgroup under runc), and the host's
#: cgroup is only a backstop this far above it.
PIDS_BACKSTOP_BASE, PIDS_BACKSTOP_PER_TASK = 64, 8

#: How each limit of the contract holds under runsc (measured on runsc 2022-12-19, ptrace).
LIMIT_ENFORCEMENT = {
    "memory_mb": "the container's memory cgroup on the host (no swap) holds the whole sandbox, "
                 "the Sentry's own memory included; past it the host's OOM killer ends the agent",
    "pids": "RLIMIT_NPROC of the agent's uid, enforced by the Sentry per sandbox over every task "
            "(processes and threads; every task of the sandbox runs as that uid), so a fork past "
            "it fails with EAGAIN as under runc; the host's pids cgroup, which counts the "
            "sandbox's host threads, is a backstop at 64 + 8 per allowed task",
    "cpus": "the container's cpu quota on the host (CFS), over the whole sandbox",
    "storage_mb": "the attempt's own size-capped tmpfs on the host, reached through the gofer",
    "storage_inodes": "the attempt's own tmpfs's nr_inodes on the host, reached through the gofer; "
                      "a request without its own /tmp gets the Sentry's tmpfs, which ignores nr_inodes: "
                      "there its files are bounded by memory_mb only",
    "tmpfs_mb": "the size of the Sentry's own tmpfs (a request without its own /tmp), whose pages "
                "also count against memory_mb",
    "max_file_mb": "RLIMIT_FSIZE, enforced by the Sentry",
    "timeout_s": "the harness's clock, then the watchdog inside the sandbox (unchanged)",
}


class GvisorSandbox(DockerSandbox):
    backend = "docker-gvisor"
    #: runsc runs the harness's programs only: a task's trial would run under runc
    capabilities = Capabilities()
    #: One-shot runs only (`start_session`).
    live_sessions = False
    #: The daemon's name of the runtime (a test points it at a misregistered one).
    runtime = RUNTIME

    def facts(self) -> BackendFacts:
        facts = super().facts()
        path = self._registered_runtime()
        version = _runsc_version(path)
        return facts.model_copy(update={
            "version": f"{facts.version}, runsc {version}",
            "seccomp": f"gVisor's Sentry (runsc {version}) serves every system call; no seccomp profile",
            "isolation": Isolation(runtime=self.runtime, limit_enforcement=LIMIT_ENFORCEMENT),
        })

    def host_config(self, req: RunRequest) -> dict:
        lim = req.limits
        fsize = lim.max_file_mb * 1024 * 1024
        return {"runtime": self.runtime, "pids_limit": PIDS_BACKSTOP_BASE + PIDS_BACKSTOP_PER_TASK * lim.pids,
                "ulimits": [Ulimit(name="fsize", soft=fsize, hard=fsize),
                            Ulimit(name="nproc", soft=lim.pids, hard=lim.pids)]}

    def _registered_runtime(self) -> str:
        """The path of the daemon's runsc; `ProfileUnavailable` naming the fix when the daemon
        has none, or one registered without the arguments this profile needs."""
        try:
            runtimes = self.client.info().get("Runtimes") or {}
        except (DockerException, requests.RequestException) as e:
            raise ProfileUnavailable(unreachable(e)) from None
        host = os.environ.get("DOCKER_HOST") or "the default socket"
        args = ", ".join(f'"{a}"' for a in REQUIRED_ARGS)
        config = (
            f'{{"runtimes": {{"{self.runtime}": {{"path": "/usr/bin/runsc", "runtimeArgs": [{args}]}}}}}}'
        )
        if self.runtime not in runtimes:
            raise ProfileUnavailable(
                f"execution.backend: {self.backend} needs the OCI runtime '{self.runtime}' registered with "
                f"the Docker daemon at {host}, which has only {', '.join(sorted(runtimes)) or 'none'}; "
                "install runsc (Debian package runsc) and register it in that daemon's own config file: "
                f"{config} (or dockerd --add-runtime), then restart that daemon")
        registered = runtimes[self.runtime].get("runtimeArgs") or []
        missing = [a for a in REQUIRED_ARGS if a not in registered]
        if missing:
            raise ProfileUnavailable(
                f"execution.backend: the Docker daemon at {host} registers '{self.runtime}' without "
                f"{' and '.join(missing)} (runtimeArgs {registered}): under it a container would have the "
                f"network or the system calls this profile refuses; register it as {config}")
        return runtimes[self.runtime].get("path") or RUNTIME

    def start_session(self, request: RunRequest, deadline: float) -> NoReturn:
        # Refused, not run differently: a session's command that blows its memory must end
        # the command, not the session, and under runsc the host's OOM killer can only end
        # the whole sandbox (the agent's processes are not host processes, and the Sentry,
        # running as the sandbox's uid in its own user namespace, cannot be shielded); the
        # exec stream of a sandbox that died that way is then never closed by the daemon.
        raise ProfileUnavailable(
            f"execution.backend: {self.backend} has no live sessions: under runsc a command past the memory "
            "limit ends the whole sandbox, where a session must lose only the command; run model "
            "evaluations on docker or bwrap")

    def _remove(self, container_id: str) -> None:
        super()._remove(container_id)
        _end_leftovers(container_id)


def _runsc_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ProfileUnavailable(f"execution.backend: cannot run the daemon's runsc ({path}): {e}") from None
    first = out.split("\n", 1)[0].strip()
    return first.removeprefix("runsc version ") or "unknown"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def leftovers(container_id: str) -> list[int]:
    """Host processes whose command line names `container_id` (the full 64-hex id): the
    shim, gofer and sandbox of that container. Zombies are left to their parent."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and any(container_id in arg for arg in _cmdline(int(entry.name))):
            if _state(int(entry.name)) not in ("Z", ""):
                found.append(int(entry.name))
    return sorted(found)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return ""


def _end_leftovers(container_id: str) -> None:
    """End what a failed start of `container_id` left: ``runsc delete --force`` with the state
    root its sandbox or gofer names (it stops both and removes the runtime's state), then
    SIGTERM and at last SIGKILL to whatever still names the id (the shim). A removed
    container that started normally has none; this costs one /proc scan."""
    pids = leftovers(container_id)
    if not pids:
        return
    for pid in pids:
        args = _cmdline(pid)
        if args and args[0] in ("runsc-sandbox", "runsc-gofer"):
            roots = [a.removeprefix("--root=") for a in args if a.startswith("--root=")]
            try:
                runsc = os.readlink(f"/proc/{pid}/exe")  # the daemon's runsc binary, renamed in argv
            except OSError:
                continue
            if roots and Path(runsc).is_file():
                try:
                    subprocess.run([runsc, f"--root={roots[0]}", "delete", "--force", container_id],
                                   capture_output=True, timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    pass  # the signals below end them anyway
                break
    # The shim is asked to go (SIGTERM: killed outright, containerd runs its `delete` again),
    # then whatever still names the id is killed.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in leftovers(container_id):
            _signal(pid, container_id, sig)
        deadline = time.monotonic() + REAP_S
        while leftovers(container_id) and time.monotonic() < deadline:
            time.sleep(0.05)


def _signal(pid: int, container_id: str, sig: int) -> None:
    """Send `sig` to `pid` through a pidfd, once its command line (read after the pidfd is
    open) still names `container_id`: never to a process that reused the number."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone meanwhile
    try:
        if any(container_id in arg for arg in _cmdline(pid)):
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)
