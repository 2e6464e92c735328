"""The podman backend's limits: the docker SDK's client for the rootless service, which moves
each started container's gate and each exec into the harness's own cgroup for it."""

from __future__ import annotations

import time
from pathlib import Path

import docker
from docker.errors import NotFound

from validate.core.errors import SandboxError
from validate.sandbox.base import Limits
from validate.sandbox.docker.wire import LABEL
from validate.sandbox.podman.service import LIBPOD

#: The containers' cgroups (one per controller on v1), beside bwrap's own parent.
PARENT = "deshuffle-validate-podman"
#: PID 1 and every exec start as this: wait until the harness has moved the process into its
#: group ($1 names it, $2 is how many lines of /proc/self/cgroup must show it), then exec the
#: rest. Nothing of the agent runs before its limits hold.
GATE = ('t=$1 n=$2; shift 2; while [ "$(grep -cF -- "$t" /proc/self/cgroup)" != "$n" ]; do sleep 0.001; '
        'done; exec "$@"')
#: How long the harness waits for a started container or exec to report its pid.
PID_WAIT_S = 10.0
#: podman's answer to an upload whose extracting subprocess died (`PodmanAPI.put_archive`).
BROKEN_PUT = "passing bulk input to subprocess"
PUT_TRIES = 3



class PodmanAPI(docker.APIClient):
    """The docker SDK's client for the rootless service, plus the harness's cgroups: a
    started container's PID 1 and a started exec are moved into the container's group (their
    gate waits for it). `groups` maps a container id to its group's name, set at creation.

    A container made through the Docker API's own creation (a Harbor trial's,
    `validate.taskdir.trial.docker.create`) has the memory, pids and cpu limits its host config asks
    taken out (rootless podman on cgroup v1 ignores them, silently) and put on a group of the
    harness's own, which its PID 1 itself joins at the start (PID 1 is the trial's backstop
    ``sleep``; the OOM counter read from it is then the group's) and each exec's gate before
    it runs; removing the container kills and removes the group. Without root the group
    cannot be made: the creation fails (`SandboxError`), never runs unlimited. A fresh volume
    it mounts starts empty (`_nocopy_binds`), and what the harness uploads before the start
    goes in at the start (`start`)."""

    #: podman 4.3's exec inspect never reports a *detached* exec as ended (``Running`` stays
    #: true): `validate.taskdir.trial.docker.run_exec` attaches instead and waits for the stream's end.
    exec_attached = True
    #: No one-container trial here (`validate.taskdir.trial.run`): it pauses the container (the cgroup
    #: freezer, which rootless podman on cgroup v1 cannot use) and binds host directories the
    #: rootless user cannot make; a trial snapshots the agent's container instead.
    one_container = False

    def __init__(self, *args, cgroups, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cgroups = cgroups
        self.groups: dict[str, str] = {}
        self.joins: dict[str, list[Path]] = {}
        #: Containers whose PID 1 itself joins their group (the trial's), not its first child.
        self.pid1_joins: set[str] = set()
        #: Uploads into a created container with a fresh volume, made at its start (`start`).
        self.deferred: dict[str, list[tuple[str, bytes]]] = {}

    def create_container(self, image, *args, host_config=None, labels=None, name=None, **kwargs):
        fresh = _nocopy_binds(host_config)
        limits = _take_limits(host_config)
        if limits is None:
            res = super().create_container(image, *args, host_config=host_config, labels=labels, name=name,
                                           **kwargs)
            if fresh:
                self.deferred[res["Id"]] = []
            return res
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
        if fresh:
            self.deferred[res["Id"]] = []
        return res

    def remove_container(self, container, *args, **kwargs):
        self.deferred.pop(container, None)
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
        res = self.delete(f"{self.base_url}/{LIBPOD}/libpod/images/remove",
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

    def put_archive(self, container, path, data):
        if container in self.deferred:  # created with a fresh volume, not started: see `start`
            self.deferred[container].append((path, data))
            return True
        return self._upload(container, path, data)

    def _upload(self, container, path, data):
        """podman 4.3 fails about one upload in a hundred into a fresh container, its
        extracting subprocess gone (``passing bulk input to subprocess: write |1: broken
        pipe``): that one is tried again (extracting the same archive twice is the same; an
        archive given as a stream is sent once)."""
        tries = PUT_TRIES if isinstance(data, (bytes, bytearray)) else 1
        for attempt in range(tries):
            try:
                return super().put_archive(container, path, data)
            except docker.errors.APIError as e:
                if attempt + 1 >= tries or BROKEN_PUT not in str(e.explanation or e):
                    raise
        raise AssertionError("unreachable")

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
        # Uploads into a container with a fresh volume, held until now: podman writes an
        # upload into a created container's own layer, which the ``nocopy`` volume then hides
        # (without ``nocopy`` podman copies that layer into the volume: the planted files too).
        # Nothing but its PID 1 (a sleep) runs before they are in; an exec comes after.
        for path, data in self.deferred.pop(container, []):
            if not self._upload(container, path, data):
                raise docker.errors.APIError(f"podman: upload to {path} was refused")

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


def _nocopy_binds(host_config: dict | None) -> bool:
    """Each named volume mounted with ``NoCopy`` made a bind with ``nocopy``: podman's Docker
    API ignores the mount's ``NoCopy`` and fills a fresh volume with what the image holds at
    its mount point (a trial's snapshot: the reward files the agent planted in
    ``/logs/verifier``, a ``conftest.py`` in ``/tests``), where its bind option is honoured.
    Whether there was one."""
    if not host_config or not host_config.get("Mounts"):
        return False
    kept, binds = [], list(host_config.get("Binds") or [])
    for m in host_config["Mounts"]:
        if m.get("Type") == "volume" and (m.get("VolumeOptions") or {}).get("NoCopy"):
            binds.append(f"{m['Source']}:{m['Target']}:{'ro' if m.get('ReadOnly') else 'rw'},nocopy")
        else:
            kept.append(m)
    fresh = len(kept) < len(host_config["Mounts"])
    host_config["Mounts"], host_config["Binds"] = kept, binds
    return fresh


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
