"""The podman backend's limits: the docker SDK's client for the rootless service, which moves
each started container's gate and each exec into the harness's own cgroup for it."""

from __future__ import annotations

import time
from pathlib import Path

import docker
from docker.errors import NotFound

from validate.errors import SandboxError
from validate.sandbox.base import Limits
from validate.sandbox.docker.wire import LABEL

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
    gate waits for it). `groups` maps a container id to its group's name, set at creation.

    A container made through the Docker API's own creation (a Harbor trial's,
    `validate.trial.docker.create`) has the memory, pids and cpu limits its host config asks
    taken out (rootless podman on cgroup v1 ignores them, silently) and put on a group of the
    harness's own, which its PID 1 itself joins at the start (PID 1 is the trial's backstop
    ``sleep``; the OOM counter read from it is then the group's) and each exec's gate before
    it runs; removing the container kills and removes the group. Without root the group
    cannot be made: the creation fails (`SandboxError`), never runs unlimited."""

    #: podman 4.3's exec inspect never reports a *detached* exec as ended (``Running`` stays
    #: true): `validate.trial.docker.run_exec` attaches instead and waits for the stream's end.
    exec_attached = True
    #: How each limit a trial container asks is enforced here (recorded with the trial).
    TRIAL_ENFORCEMENT = {
        "memory_mb": "the harness's own cgroup per container (no swap), joined by PID 1 at the start and by every "
                     "exec before it runs; podman's own limit is not asked (rootless on cgroup v1 ignores it)",
        "pids": "the same cgroup (pids.max)", "cpus": "the same cgroup (cpu quota)",
        "timeout_s": "the harness's clock (the container is killed); PID 1 a backstop sleep"}

    def __init__(self, *args, cgroups, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cgroups = cgroups
        self.groups: dict[str, str] = {}
        self.joins: dict[str, list[Path]] = {}
        #: Containers whose PID 1 itself joins their group (the trial's), not its first child.
        self.pid1_joins: set[str] = set()

    def create_container(self, image, *args, host_config=None, labels=None, name=None, **kwargs):
        limits = _take_limits(host_config)
        if limits is None:
            return super().create_container(image, *args, host_config=host_config, labels=labels, name=name,
                                            **kwargs)
        group = f"{(labels or {}).get(LABEL, 'adhoc')}-{name or 'trial'}"
        joins = self.cgroups.create(group, limits)
        try:
            res = super().create_container(image, *args, host_config=host_config, labels=labels, name=name,
                                           **kwargs)
        except BaseException:
            self.cgroups.remove(group)
            raise
        self.groups[res["Id"]], self.joins[group] = group, joins
        self.pid1_joins.add(res["Id"])
        return res

    def remove_container(self, container, *args, **kwargs):
        try:
            return super().remove_container(container, *args, **kwargs)
        finally:
            if container in self.pid1_joins:
                group = self.groups.get(container)
                if group is not None:
                    self.cgroups.kill(group)
                    self.cgroups.remove(group)
                    self.joins.pop(group, None)
                    self.groups.pop(container, None)
                self.pid1_joins.discard(container)

    def remove_image(self, image, force=False, noprune=False):
        """podman's Docker API ignores ``noprune``: removing a committed snapshot would take
        its untagged parents with it (a task image built here, by id). libpod's endpoint
        honours it."""
        res = self.delete(f"{self.base_url}/v4.0.0/libpod/images/remove",
                          params={"images": image, "force": str(bool(force)).lower(),
                                  "noprune": str(bool(noprune)).lower()})
        if res.status_code == 404:
            raise NotFound(f"no such image: {image[:19]}")
        self._raise_for_status(res)
        errors = (res.json() or {}).get("Errors") or []
        if any("image not known" in str(e) or "no such image" in str(e).lower() for e in errors):
            raise NotFound(f"no such image: {image[:19]}")
        if errors:
            raise docker.errors.APIError(f"podman: remove image {image[:19]}: {errors}")
        return res.json()

    def commit(self, *args, **kwargs):
        """The snapshot's id as ``sha256:<hex>``: podman's Docker API answers bare hex, which it
        then refuses as an image name (``cannot specify 64-byte hexadecimal strings``)."""
        res = super().commit(*args, **kwargs)
        if "Id" in res and ":" not in res["Id"]:
            res = {**res, "Id": f"sha256:{res['Id']}"}
        return res

    def start(self, container, *args, **kwargs):
        super().start(container, *args, **kwargs)
        self._join(container, lambda: self.inspect_container(container)["State"],
                   child=container not in self.pid1_joins)

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


def _take_limits(host_config: dict | None) -> Limits | None:
    """The memory, pids and cpu limits of a Docker API host config, taken out of it (None
    when it asks none)."""
    if not host_config or not any(host_config.get(k) for k in ("Memory", "PidsLimit", "NanoCpus")):
        return None
    memory, nano = host_config.pop("Memory", None), host_config.pop("NanoCpus", None)
    host_config.pop("MemorySwap", None)
    pids = host_config.pop("PidsLimit", None)
    fields = {"memory_mb": int(memory) // 2**20 if memory else None, "pids": pids,
              "cpus": nano / 1e9 if nano else None}
    return Limits(**{k: v for k, v in fields.items() if v})


def first_child(pid: int) -> int:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    return int(children[0]) if children else 0


def gate(group: str, joins: list[Path], argv: list[str]) -> list[str]:
    return ["/bin/sh", "-c", GATE, "gate", f"/{group}", str(len(joins)), *argv]
