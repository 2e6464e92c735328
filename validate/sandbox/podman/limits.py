"""The podman backend's limits: the docker SDK's client for the rootless service, which moves
each started container's gate and each exec into the harness's own cgroup for it."""

from __future__ import annotations

import time
from pathlib import Path

import docker
from docker.errors import NotFound

from validate.errors import SandboxError

#: The containers' cgroups (one per controller on v1), beside bwrap's own parent.
PARENT = "deshuffle-validate-podman"
#: PID 1 and every exec start as this: wait until the harness has moved the process into its
#: group ($1 names it, $2 is how many lines of /proc/self/cgroup must show it), then exec the
#: rest. Nothing of the agent runs before its limits hold.
GATE = ('t=$1 n=$2; shift 2; while [ "$(grep -cF -- "$t" /proc/self/cgroup)" != "$n" ]; do sleep 0.001; done; '
        'exec "$@"')
#: How long the harness waits for a started container or exec to report its pid.
PID_WAIT_S = 10.0



class PodmanAPI(docker.APIClient):
    """The docker SDK's client for the rootless service, plus the harness's cgroups: a
    started container's PID 1 and a started exec are moved into the container's group (their
    gate waits for it). `groups` maps a container id to its group's name, set at creation."""

    def __init__(self, *args, cgroups, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cgroups = cgroups
        self.groups: dict[str, str] = {}
        self.joins: dict[str, list[Path]] = {}

    def start(self, container, *args, **kwargs):
        super().start(container, *args, **kwargs)
        self._join(container, lambda: self.inspect_container(container)["State"], child=True)

    def exec_create(self, container, cmd, *args, **kwargs):
        group = self.groups.get(container)
        if group is None:  # removed (closed): as the daemon says of a container it no longer has
            raise NotFound(f"no such container: {container[:12]}")
        res = super().exec_create(container, gate(group, self.joins[group], list(cmd)), *args, **kwargs)
        self.groups[res["Id"]] = group
        return res

    def exec_start(self, exec_id, *args, **kwargs):
        res = super().exec_start(exec_id, *args, **kwargs)
        self._join(exec_id, lambda: self.exec_inspect(exec_id))
        return res

    def _join(self, key: str, state, child: bool = False) -> None:
        """Move the pid `state()` reports (once it has one), or with `child` its first child
        (the gate under the watchdog), into the group of `key`."""
        group = self.groups.get(key)
        if group is None:
            return  # not ours to limit (the image probe's container, which never runs)
        deadline = time.monotonic() + PID_WAIT_S
        while not (pid := int(state().get("Pid") or 0)) or (child and not (pid := first_child(pid))):
            if time.monotonic() > deadline:
                raise SandboxError(f"podman: {key[:12]} reports no {'gate' if child else 'pid'}; "
                                   f"its limits cannot be set")
            time.sleep(0.002)
        try:
            for d in self.joins[group]:
                (d / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass  # it died before it ran anything: the wait and the exit code say so
        except OSError as e:
            raise SandboxError(f"podman: cannot move pid {pid} into cgroup {group}: {e}") from None


def first_child(pid: int) -> int:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    return int(children[0]) if children else 0


def gate(group: str, joins: list[Path], argv: list[str]) -> list[str]:
    return ["/bin/sh", "-c", GATE, "gate", f"/{group}", str(len(joins)), *argv]
