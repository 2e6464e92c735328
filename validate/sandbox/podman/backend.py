"""The podman backend's class: the docker backend over the rootless service, with its own
container creation (podman's endpoint, id maps, the gate), facts and refusals (see the package)."""

from __future__ import annotations

import json
import os
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import cast

import docker
import requests
from docker.errors import DockerException, ImageNotFound

from validate.core.errors import ProfileUnavailable, SandboxError
from validate.core.paths import AGENT_UID, DEFAULT_IMAGE, KEY_UID, ImagePaths
from validate.sandbox import storage
from validate.sandbox.base import BackendFacts, Capabilities, Isolation, RunRequest, watchdog_argv
from validate.sandbox.cgroups import CGROUP_ROOT, V1Cgroups, V2Cgroups, detect
from validate.sandbox.docker.backend import DockerSandbox
from validate.sandbox.docker.image import image_layers
from validate.sandbox.docker.wire import LABEL
from validate.sandbox.image import python_version, require_record
from validate.sandbox.podman.limits import PARENT, PodmanAPI, first_child, gate
from validate.sandbox.podman.service import HOST_ENV, LIBPOD, USER, default_host, idmap, write_seccomp


class PodmanSandbox(DockerSandbox):
    backend = "podman"
    isolates_network = True
    #: its rootless service speaks the Docker API and builds and holds the task images itself
    capabilities = Capabilities(trials="engine", images="podman", shared_verifier=True, trusted_verifier=True,
                                separate_verifier=True)

    def __init__(self, image: str = DEFAULT_IMAGE, run_label: str = "adhoc", pool_size: int = 16) -> None:
        self.image, self.run_label = image, run_label
        self.host = os.environ.get(HOST_ENV) or default_host()
        self.cgroups = (V2Cgroups if detect() == "v2" else V1Cgroups)(CGROUP_ROOT, parent=PARENT)
        try:
            api = PodmanAPI(base_url=self.host, timeout=60, max_pool_size=pool_size, version="1.41",
                            cgroups=self.cgroups)
            self.client = docker.DockerClient.__new__(docker.DockerClient)
            self.client.api = api
        except DockerException as e:
            raise ProfileUnavailable(self._unreachable(e)) from None
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._held: dict[str, ExitStack] = {}
        self._maps_of: dict[str, tuple[list[dict], list[dict]]] = {}
        self._filter: tuple[Path, str] | None = None
        self._sweep()
        if os.geteuid() == 0:
            try:
                self.cgroups.sweep(run_label)
            except OSError:
                pass  # facts() says why the groups cannot be made

    def _unreachable(self, e: Exception) -> str:
        return (
            f"backend podman: no rootless podman service answers at {self.host} ({type(e).__name__}: "
            f"{e}); start one as {USER} (`podman system service --time=0 unix://PATH`) and set {HOST_ENV}"
        )

    @classmethod
    def prepare_image(cls, paths: ImagePaths, log) -> None:
        record = require_record(paths)
        sb = cls(image=paths.name, run_label="image-build")
        try:
            try:
                layers = image_layers(sb.client.images.get(paths.name))
            except ImageNotFound:
                layers = []
            if layers != [record.digest]:
                # podman's own import: the Docker API's names the image docker.io/library/…,
                # which the name alone then does not find.
                with paths.tarball.open("rb") as tar:
                    sb._libpod("post", f"images/import?reference={paths.name}", data=tar, timeout=600,
                               headers={"Content-Type": "application/x-tar"})
                layers = image_layers(sb.client.images.get(paths.name))
        except (DockerException, requests.RequestException, SandboxError) as e:
            raise ProfileUnavailable(sb._unreachable(e)) from None
        if layers != [record.digest]:
            raise ProfileUnavailable(f"image build: podman imported {paths.tarball} as layers {layers}, "
                                     f"not the one layer {record.digest}")
        log(f"podman image {paths.name}: layer {record.digest[:19]}…")

    def _libpod(self, method: str, path: str, **kwargs) -> dict:
        api = self.client.api
        res = getattr(api, method)(f"{api.base_url}/{LIBPOD}/libpod/{path}",
                                   timeout=kwargs.pop("timeout", api.timeout), **kwargs)
        if res.status_code >= 400:
            raise SandboxError(f"podman: {path}: {res.status_code} {res.text[:300]}")
        return res.json()

    def _service_map(self) -> tuple[dict, list[dict], list[dict]]:
        host = self._libpod("get", "info")["host"]
        maps = host.get("idMappings") or {}
        return host, list(maps.get("uidmap") or []), list(maps.get("gidmap") or [])

    def facts(self) -> BackendFacts:
        try:
            host, uids, _ = self._service_map()
            version = self.client.api.version().get("Version", "?")
            image, digest, packages = self.image_facts(" in podman")
        except ImageNotFound:
            raise ProfileUnavailable(
                f"execution.image: {self.image} is not in the rootless podman's "
                "storage; build it with `validate image build --backends podman`"
            ) from None
        except (DockerException, requests.RequestException, SandboxError) as e:
            raise ProfileUnavailable(self._unreachable(e)) from None
        if not (host.get("security") or {}).get("rootless"):
            raise ProfileUnavailable(f"execution.backend: the podman service at {self.host} runs as root; "
                                     f"this profile is rootless (start it as {USER})")
        root = next((m for m in uids if int(m["container_id"]) == 0), None)
        return BackendFacts(backend=self.backend, image=self.image, image_digest=digest,
                            architecture=image.attrs.get("Architecture", "unknown"),
                            version=f"podman {version}", packages=packages, python=python_version(packages),
                            seccomp=f"{self._seccomp()[1]} (podman {version}'s default, "
                                    "tightened to docker's)",
                            cgroup=self.cgroups.version,
                            isolation=Isolation(runtime=str((host.get("ociRuntime") or {}).get("name", "?")),
                                                rootless=True,
                                                root_maps_to=f"uid {root['host_id']}" if root else "unknown",
                                                limit_enforcement=self.enforcement()))

    def _check_storage(self) -> None:
        """The attempt storage is mounted after the service made its own mount namespace: it
        reaches the service only through a shared parent (set-up makes it one)."""
        parent = str(storage.DEFAULT_PARENT)
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split(" - ")[0].split()
            if len(fields) > 5 and fields[4] == parent and any(f.startswith("shared:") for f in fields[6:]):
                return
        raise ProfileUnavailable(f"execution.limits: storage_mb, storage_inodes: {parent} is not a shared "
                                 "mount, so the rootless service would bind the empty directory under each "
                                 "attempt's tmpfs; run `bash scripts/setup.sh --test` (mount --rbind, "
                                 "--make-rshared), then start the service")

    def enforcement(self) -> dict[str, str]:
        """How each limit is enforced here; `ProfileUnavailable` naming those that cannot be."""
        unenforced = "memory_mb, pids, cpus"
        if os.geteuid() != 0:
            raise ProfileUnavailable(f"execution.limits: rootless podman on cgroup {self.cgroups.version} "
                                     f"would ignore {unenforced}; the harness enforces them through its own "
                                     "cgroups, which needs root")
        self._check_storage()
        try:
            self.cgroups.check()
        except ProfileUnavailable as e:
            raise ProfileUnavailable(f"execution.limits: {unenforced} cannot be enforced: "
                                     f"{str(e).replace('backend bwrap: ', '')}") from None
        v = self.cgroups.version
        group = (
            f"the harness's own cgroup {v} group per container, which its PID 1 and every exec join before "
            f"they run (podman's own limit is not asked: rootless on cgroup v1 ignores it)"
        )
        return {"memory_mb": f"{group}; no swap", "pids": group, "cpus": f"{group} (cpu quota)",
                "timeout_s": "the harness kills the container; coreutils timeout as PID 1 kills it 5 s later",
                "storage_mb": "the harness's size-capped tmpfs per attempt, bind-mounted (/tmp included)",
                "storage_inodes": "the harness's inode-capped tmpfs per attempt (podman's tmpfs "
                                  "takes no nr_inodes)",
                "tmpfs_mb": "a harness tmpfs of that size and storage_inodes, bind-mounted at /tmp",
                "max_file_mb": "RLIMIT_FSIZE set by the OCI runtime",
                "max_log_bytes": "the harness keeps the head of each stream"}

    def _group(self, name: str) -> str:
        return f"{self.run_label}-{name}"

    def create_container(self, req: RunRequest) -> str:
        # The client's api is the PodmanAPI made in __init__ (docker's DockerClient types the base).
        api, group = cast(PodmanAPI, self.client.api), self._group(req.name)
        held = ExitStack()
        try:
            spec = self._spec(req, held, *self._maps(req))
            joins = self.cgroups.create(group, req.limits)
            held.callback(self._drop_group, group)
            api.joins[group] = joins
            # The watchdog is PID 1 from the start (a harness killed before the join cannot
            # leave a gate waiting for ever); its child, the gate, joins the group.
            spec["command"] = watchdog_argv(tuple(gate(group, joins, list(req.argv))), req.limits.timeout_s)
            cid = self._libpod("post", "containers/create", data=json.dumps(spec),
                               headers={"Content-Type": "application/json"})["Id"]
        except BaseException:
            held.close()
            raise
        api.groups[cid] = group
        with self._lock:
            self._live.add(cid)
            self._held[cid] = held
        return cid

    def _seccomp(self) -> tuple[Path, str]:
        if self._filter is None:
            self._filter = write_seccomp(storage.DEFAULT_PARENT.parent)
        return self._filter

    def _maps(self, req: RunRequest) -> tuple[list[dict], list[dict]]:
        """The container's uid and gid maps for `req`'s user (computed once per user)."""
        if req.user not in self._maps_of:
            _, uids, gids = self._service_map()
            uid, gid = req.uid_gid
            self._maps_of[req.user] = (idmap(uids, tuple(sorted({AGENT_UID, KEY_UID, uid}))),
                                       idmap(gids, tuple(sorted({AGENT_UID, KEY_UID, gid}))))
        return self._maps_of[req.user]

    def _start_container(self, live) -> None:
        super()._start_container(live)
        # The session's OOM counter is read from the process's memory group (docker's PID 1):
        # here the watchdog stays outside, its child (the gate, now `sleep`) is in the group.
        live.pid = first_child(live.pid) or live.pid

    def _spec(self, req: RunRequest, held: ExitStack, uidmap: list[dict], gidmap: list[dict]) -> dict:
        """podman's create spec of `req` (the docker backend's container, `wire.create_container`)."""
        lim = req.limits
        tmp = req.tmp
        if tmp is None:  # the harness's own capped tmpfs: podman's takes no inode cap
            tmp = held.enter_context(
                storage.attempt_storage(
                    self.run_label,
                    f"{req.name}-tmp",
                    lim.model_copy(update={"storage_mb": lim.tmpfs_mb}),
                    gid=req.uid_gid[1],
                )
            )
            tmp.chmod(0o1777)
        mounts = [{"destination": m.target, "type": "bind", "source": str(m.source),
                   "options": ["rbind", "ro" if m.read_only else "rw"]} for m in req.mounts]
        mounts.append({"destination": "/tmp", "type": "bind", "source": str(tmp), "options": ["rbind", "rw"]})
        fsize = lim.max_file_mb * 1024 * 1024
        return {"name": f"dv-{req.name}", "image": self.image, "user": req.user, "work_dir": req.workdir,
                "env": dict(req.env), "labels": {LABEL: self.run_label}, "netns": {"nsmode": "none"},
                "userns": {"nsmode": "private"}, "idmappings": {"UIDMap": uidmap, "GIDMap": gidmap},
                "read_only_filesystem": True, "cap_drop": ["ALL"], "no_new_privileges": True,
                "seccomp_policy": "default", "seccomp_profile_path": str(self._seccomp()[0]),
                "r_limits": [{"type": "fsize", "hard": fsize, "soft": fsize}], "mounts": mounts,
                "log_configuration": {"driver": "k8s-file", "size": 1024 * 1024}}

    def _drop_group(self, group: str) -> None:
        self.cgroups.kill(group)
        self.cgroups.remove(group)
        cast(PodmanAPI, self.client.api).joins.pop(group, None)

    def judge(self, cid: str, name: str, since: float, waited: dict, state: dict, timed_out: bool) -> bool:
        # The OOM killer acts in the harness's group, which podman knows nothing of.
        if not state.get("OOMKilled") and self.cgroups.oom_killed(self._group(name)):
            state = {**state, "OOMKilled": True}
        return super().judge(cid, name, since, waited, state, timed_out)

    def _remove(self, container_id: str) -> None:
        super()._remove(container_id)
        with self._lock:
            gone = container_id not in self._live
            held = self._held.pop(container_id, None) if gone else None
        if held is not None:
            cast(PodmanAPI, self.client.api).groups.pop(container_id, None)
            held.close()
