"""The rootless profile: podman run by an unprivileged user, driven through its REST socket.

The service (``podman system service``) runs as an unprivileged user (set-up creates
``dv-podman``) whose subordinate ids include the agents' own uids: the container's root is
that user, container uids 65533 and 65534 are the same host uids as under docker and bwrap
(so the attempt's files, their owners and the answer key's ``0400`` mean the same), and every
other container uid is one of the user's subordinate ids (`idmap`). The service must hold the
agents' gids as supplementary groups to reach the attempt storage (``0710 root:<gid>``).

The harness speaks the Docker API to it (the docker SDK: start, wait, inspect, logs, exec,
archives), so the one-shot runs, sessions and the judging of an exit are the docker backend's
(`DockerSandbox`); only the container's creation goes through podman's own endpoint, the one
that takes uid and gid maps.

Limits. Rootless podman on cgroup v1 *ignores* ``--memory``, ``--pids-limit`` and
``--cpus`` (it says so on the CLI, and nothing through the API), so none is asked of it: the
harness (root) makes one cgroup per container (`validate.sandbox.cgroups`, memory with no
swap, pids, cpu quota) and moves the container's PID 1 and each exec'd command into it
before they run anything: each starts as a gate (`GATE`) that waits until
``/proc/self/cgroup`` shows the group, then execs the agent. Without root there is no way to
enforce them and `facts` refuses the profile, naming the limits. Storage is the harness's
size- and inode-capped tmpfs (``/tmp`` too: podman's tmpfs takes no inode cap), file size is
RLIMIT_FSIZE (rlimits do bite rootless), the timeout the harness's plus the watchdog's.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import docker
import requests
from docker.errors import DockerException, ImageNotFound, NotFound

from validate.errors import ProfileUnavailable, SandboxError
from validate.paths import DEFAULT_IMAGE, ImagePaths
from validate.sandbox import storage
from validate.sandbox.base import BackendFacts, Isolation, RunRequest, watchdog_argv
from validate.sandbox.cgroups import CGROUP_ROOT, V1Cgroups, V2Cgroups, detect
from validate.sandbox.docker.backend import DockerSandbox
from validate.sandbox.docker.wire import LABEL
from validate.workspace import AGENT_UID, KEY_UID

#: The socket of the rootless service; unset, the default user's at its XDG runtime dir.
HOST_ENV = "VALIDATE_PODMAN_HOST"
#: The unprivileged user set-up creates to run the service.
USER = "dv-podman"
#: The podman (libpod) API version of the one endpoint the Docker API lacks.
LIBPOD = "v4.0.0"
#: The containers' cgroups (one per controller on v1), beside bwrap's own parent.
PARENT = "deshuffle-validate-podman"
#: PID 1 and every exec start as this: wait until the harness has moved the process into its
#: group ($1 names it, $2 is how many lines of /proc/self/cgroup must show it), then exec the
#: rest. Nothing of the agent runs before its limits hold.
GATE = ('t=$1 n=$2; shift 2; while [ "$(grep -cF -- "$t" /proc/self/cgroup)" != "$n" ]; do sleep 0.001; done; '
        'exec "$@"')
#: How long the harness waits for a started container or exec to report its pid.
PID_WAIT_S = 10.0


#: podman's default syscall filter, which this profile tightens (`seccomp_profile`).
PODMAN_SECCOMP = Path("/usr/share/containers/seccomp.json")
#: Allowed unconditionally by podman's default (it relies on capabilities, and rootless
#: containers hold some in their own user namespace): refused here, as docker's default does.
REFUSED = frozenset({"unshare", "setns", "mount", "umount", "umount2", "pivot_root", "keyctl", "add_key",
                     "request_key", "clone", "clone3"})
#: clone(2) is allowed only without a CLONE_NEW* flag (docker's rule); clone3 says ENOSYS, so
#: that the C library falls back to clone.
CLONE_NEW_FLAGS = 0x7E020000


def seccomp_profile(base: Path = PODMAN_SECCOMP) -> bytes:
    """podman's default filter, tightened to docker's default: no new namespaces, no mounts,
    no keyrings, EPERM (not ENOSYS) for what is refused. Canonical JSON, so its sha256 names it."""
    try:
        profile = json.loads(base.read_bytes())
    except (OSError, ValueError) as e:
        raise ProfileUnavailable(f"execution.seccomp: cannot read podman's default profile {base}: {e}") from None
    rules = []
    for rule in profile.get("syscalls", []):
        names = [n for n in rule.get("names", []) if n not in REFUSED]
        if names:
            rules.append({**rule, "names": names})
    rules += [{"names": ["clone"], "action": "SCMP_ACT_ALLOW",
               "args": [{"index": 0, "value": CLONE_NEW_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
              {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]
    profile.update(syscalls=rules, defaultAction="SCMP_ACT_ERRNO", defaultErrnoRet=1)
    profile.pop("defaultErrno", None)
    return json.dumps(profile, sort_keys=True, separators=(",", ":")).encode()


def write_seccomp(directory: Path) -> tuple[Path, str]:
    """The tightened profile as a file the service can read, named by its digest."""
    data = seccomp_profile()
    digest = hashlib.sha256(data).hexdigest()
    path = directory / f"podman-seccomp-{digest[:16]}.json"
    if not path.is_file():
        directory.mkdir(mode=0o711, parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o644)
        tmp.replace(path)
    return path, f"sha256:{digest}"


def default_host() -> str:
    try:
        uid = pwd.getpwnam(USER).pw_uid
    except KeyError:
        return f"unix:///run/user/{USER}/podman/podman.sock"
    return f"unix:///run/user/{uid}/podman/podman.sock"


def idmap(mapped: list[dict], ids: tuple[int, ...]) -> list[dict]:
    """The container's id map: 0 → the service's own 0 (the user), each of `ids` the service
    holds → the host id of the same number, every other id below 65536 → the service's
    remaining subordinate ids in order (an id outside the user's ranges, e.g. a test's 65532,
    is then some subordinate id: it runs, but owns no host file). `mapped` is the service's
    map (container_id = its id, host_id = the host's)."""
    by_host = {}
    for m in mapped:
        for k in range(int(m["size"])) if int(m["size"]) <= 65536 else ():
            by_host[int(m["host_id"]) + k] = int(m["container_id"]) + k
    inner = {i: by_host[i] for i in ids if i in by_host}
    spare = iter(sorted(set(by_host.values()) - set(inner.values()) - {0}))
    out, cid = [{"container_id": 0, "host_id": 0, "size": 1}], 1
    while cid < 65536:
        if cid in inner:
            out.append({"container_id": cid, "host_id": inner[cid], "size": 1})
        else:
            nxt = next(spare, None)
            if nxt is None:
                break
            out.append({"container_id": cid, "host_id": nxt, "size": 1})
        cid += 1
    return _merge(out)


def _merge(entries: list[dict]) -> list[dict]:
    merged: list[dict] = []
    for e in entries:
        last = merged[-1] if merged else None
        if last and last["container_id"] + last["size"] == e["container_id"] and \
                last["host_id"] + last["size"] == e["host_id"]:
            last["size"] += e["size"]
        else:
            merged.append(dict(e))
    return merged


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
        while not (pid := int(state().get("Pid") or 0)) or (child and not (pid := _first_child(pid))):
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


def _first_child(pid: int) -> int:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    return int(children[0]) if children else 0


def gate(group: str, joins: list[Path], argv: list[str]) -> list[str]:
    return ["/bin/sh", "-c", GATE, "gate", f"/{group}", str(len(joins)), *argv]


class PodmanSandbox(DockerSandbox):
    backend = "podman"
    isolates_network = True

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
        return (f"backend podman: no rootless podman service answers at {self.host} ({type(e).__name__}: {e}); "
                f"start one as {USER} (`podman system service --time=0 unix://PATH`) and set {HOST_ENV}")

    @classmethod
    def prepare_image(cls, paths: ImagePaths, log) -> None:
        from validate.image import require_record
        from validate.sandbox.docker.image import image_layers

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
        res = getattr(api, method)(f"{api.base_url}/{LIBPOD}/libpod/{path}", timeout=kwargs.pop("timeout", api.timeout),
                                   **kwargs)
        if res.status_code >= 400:
            raise SandboxError(f"podman: {path}: {res.status_code} {res.text[:300]}")
        return res.json()

    def _service_map(self) -> tuple[dict, list[dict], list[dict]]:
        host = self._libpod("get", "info")["host"]
        maps = host.get("idMappings") or {}
        return host, list(maps.get("uidmap") or []), list(maps.get("gidmap") or [])

    def facts(self) -> BackendFacts:
        from validate.image import python_version
        from validate.sandbox.docker.image import image_layers, image_packages

        try:
            host, uids, _ = self._service_map()
            version = self.client.api.version().get("Version", "?")
            image = self.client.images.get(self.image)
            layers = image_layers(image)
            if len(layers) != 1:
                raise ProfileUnavailable(f"execution.image: {self.image} has {len(layers)} layers in podman, not the "
                                         f"one imported root filesystem; build it with `validate image build`")
            packages = image_packages(self.client, image.id, labels={LABEL: self.run_label})
        except ImageNotFound:
            raise ProfileUnavailable(f"execution.image: {self.image} is not in the rootless podman's storage; "
                                     f"build it with `validate image build --backend podman`") from None
        except (DockerException, requests.RequestException, SandboxError) as e:
            raise ProfileUnavailable(self._unreachable(e)) from None
        if not (host.get("security") or {}).get("rootless"):
            raise ProfileUnavailable(f"execution.backend: the podman service at {self.host} runs as root; "
                                     f"this profile is rootless (start it as {USER})")
        root = next((m for m in uids if int(m["container_id"]) == 0), None)
        return BackendFacts(backend=self.backend, image=self.image, image_digest=layers[0],
                            architecture=image.attrs.get("Architecture", "unknown"), version=f"podman {version}",
                            packages=packages, python=python_version(packages),
                            seccomp=f"{self._seccomp()[1]} (podman {version}'s default, tightened to docker's)",
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
        raise ProfileUnavailable(f"execution.limits: storage_mb, storage_inodes: {parent} is not a shared mount, so "
                                 f"the rootless service would bind the empty directory under each attempt's tmpfs; "
                                 f"run `bash scripts/setup.sh --test` (mount --rbind, --make-rshared), then start the "
                                 f"service")

    def enforcement(self) -> dict[str, str]:
        """How each limit is enforced here; `ProfileUnavailable` naming those that cannot be."""
        unenforced = "memory_mb, pids, cpus"
        if os.geteuid() != 0:
            raise ProfileUnavailable(f"execution.limits: rootless podman on cgroup {self.cgroups.version} would "
                                     f"ignore {unenforced}; the harness enforces them through its own cgroups, "
                                     f"which needs root")
        self._check_storage()
        try:
            self.cgroups.check()
        except ProfileUnavailable as e:
            raise ProfileUnavailable(f"execution.limits: {unenforced} cannot be enforced: "
                                     f"{str(e).replace('backend bwrap: ', '')}") from None
        v = self.cgroups.version
        group = f"the harness's own cgroup {v} group per container, which its PID 1 and every exec join before "\
                f"they run (podman's own limit is not asked: rootless on cgroup v1 ignores it)"
        return {"memory_mb": f"{group}; no swap", "pids": group, "cpus": f"{group} (cpu quota)",
                "timeout_s": "the harness kills the container; coreutils timeout as PID 1 kills it 5 s later",
                "storage_mb": "the harness's size-capped tmpfs per attempt, bind-mounted (/tmp included)",
                "storage_inodes": "the harness's inode-capped tmpfs per attempt (podman's tmpfs takes no nr_inodes)",
                "tmpfs_mb": "a harness tmpfs of that size and storage_inodes, bind-mounted at /tmp",
                "max_file_mb": "RLIMIT_FSIZE set by the OCI runtime",
                "max_log_bytes": "the harness keeps the head of each stream"}

    def _group(self, name: str) -> str:
        return f"{self.run_label}-{name}"

    def create_container(self, req: RunRequest) -> str:
        api, group = self.client.api, self._group(req.name)
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
        live.pid = _first_child(live.pid) or live.pid

    def _spec(self, req: RunRequest, held: ExitStack, uidmap: list[dict], gidmap: list[dict]) -> dict:
        """podman's create spec of `req` (the docker backend's container, `wire.create_container`)."""
        lim = req.limits
        tmp = req.tmp
        if tmp is None:  # the harness's own capped tmpfs: podman's takes no inode cap
            tmp = held.enter_context(storage.attempt_storage(self.run_label, f"{req.name}-tmp",
                                                             lim.model_copy(update={"storage_mb": lim.tmpfs_mb}),
                                                             gid=req.uid_gid[1]))
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
        self.client.api.joins.pop(group, None)

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
            self.client.api.groups.pop(container_id, None)
            held.close()
