"""The reference profile: a fresh Docker container per attempt, through the Docker SDK.

Each container: the network disabled (a fresh namespace holding only ``lo``), memory (no
swap), cpu and pids limits, read-only root with a tmpfs ``/tmp``, user 65534:65534, every
capability dropped, no-new-privileges, an RLIMIT_FSIZE cap, a capped json-file log. On the timeout the
container is killed. A container that exits 137 while neither OOM-killed nor timed out was
killed from outside (the agent runs as PID 1, which cannot be SIGKILLed from inside its
own namespace): that is an infrastructure fault.
"""

from __future__ import annotations

import threading
import time

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import LogConfig, Mount, Ulimit

from validate.errors import ProfileUnavailable, SandboxError
from validate.paths import DEFAULT_IMAGE
from validate.sandbox.base import BackendFacts, ExecResult, RunRequest, Sandbox

LABEL = "deshuffle-validate"


class DockerSandbox(Sandbox):
    backend = "docker"
    isolates_network = True

    def __init__(self, image: str = DEFAULT_IMAGE, run_label: str = "adhoc", pool_size: int = 16) -> None:
        self.image = image
        self.run_label = run_label
        try:
            self.client = docker.from_env(timeout=60, max_pool_size=pool_size)
        except DockerException as e:
            raise ProfileUnavailable(f"backend docker: the Docker daemon is not reachable ({e}); "
                                     f"start dockerd or choose another backend") from None
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._sweep()

    def _sweep(self) -> None:
        """Remove containers a crashed earlier process of this same run left behind."""
        try:
            for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.run_label}"}):
                self._remove(c.id)
        except (DockerException, requests.RequestException):
            pass  # facts() reports an unreachable daemon with a clear message

    def facts(self) -> BackendFacts:
        # The image is identified by its one layer's diff_id, the sha256 of the rootfs tarball it
        # was imported from: the image id also hashes the import's config and time, so it
        # differs between two imports of the same bytes.
        from validate.image import docker_image_packages, python_version

        try:
            version = self.client.version()
            image = self.client.images.get(self.image)
            layers = list(image.attrs.get("RootFS", {}).get("Layers") or [])
            if len(layers) != 1:
                raise ProfileUnavailable(f"execution.image: {self.image} has {len(layers)} layers, not the one "
                                         f"imported root filesystem; build it with `validate image build`")
            packages = docker_image_packages(self.client, image.id, labels={LABEL: self.run_label})
        except ImageNotFound:
            raise ProfileUnavailable(f"execution.image: {self.image} is not in the Docker daemon; "
                                     f"build it with `validate image build`") from None
        except (DockerException, requests.RequestException) as e:
            raise ProfileUnavailable(f"backend docker: the Docker daemon did not answer ({e})") from None
        return BackendFacts(backend=self.backend, image=self.image, image_digest=layers[0],
                            architecture=image.attrs.get("Architecture", "unknown"),
                            version=f"docker {version.get('Version', '?')}",
                            packages=packages, python=python_version(packages))

    def _create(self, req: RunRequest) -> str:
        """Create the container through the low-level API (the high-level `containers.create`
        adds an inspect per attempt) and return its id."""
        lim = req.limits
        fsize = lim.max_file_mb * 1024 * 1024
        api = self.client.api
        host_config = api.create_host_config(
            network_mode="none",
            mem_limit=f"{lim.memory_mb}m",
            memswap_limit=f"{lim.memory_mb}m",
            nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.pids,
            read_only=True,
            tmpfs={"/tmp": f"size={lim.tmpfs_mb}m,mode=1777"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[Ulimit(name="fsize", soft=fsize, hard=fsize)],
            log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
            mounts=[Mount(target=m.target, source=str(m.source), type="bind", read_only=m.read_only)
                    for m in req.mounts],
        )
        return api.create_container(
            self.image,
            command=list(req.argv),
            name=f"dv-{req.name}",
            labels={LABEL: self.run_label},
            user="65534:65534",
            working_dir=req.workdir,
            environment=dict(req.env),
            # With the network disabled, runc gives the container a fresh namespace holding only
            # `lo`, and dockerd skips libnetwork: no sandbox, no `libnetwork-setkey` prestart hook.
            # That hook and libnetwork's lock serialise `network_mode=none` starts: 5 starts/s
            # at any concurrency, against 9/s at -c 4 with it disabled (docs/performance.md).
            network_disabled=True,
            host_config=host_config,
        )["Id"]

    def run(self, req: RunRequest) -> ExecResult:
        lim = req.limits
        api = self.client.api
        cid = None
        try:
            cid = self._create(req)
            with self._lock:
                self._live.add(cid)
            t0 = time.monotonic()
            api.start(cid)
            timed_out = False
            try:
                exit_code = api.wait(cid, timeout=lim.timeout_s).get("StatusCode")
            except requests.exceptions.ConnectionError:
                if time.monotonic() - t0 < lim.timeout_s * 0.99:
                    raise  # the daemon went away, not our timeout
                timed_out, exit_code = True, None
                try:
                    api.kill(cid)
                except APIError:
                    pass  # it exited between the timeout and the kill
            runtime = time.monotonic() - t0
            oom = bool(api.inspect_container(cid)["State"].get("OOMKilled"))
            if exit_code == 137 and not oom and not timed_out:
                raise SandboxError(f"container dv-{req.name} was killed from outside (exit 137)")
            stdout, stderr = self._logs(cid)
            return ExecResult(exit_code=exit_code, timed_out=timed_out, oom_killed=oom,
                              stdout=stdout[: lim.max_log_bytes], stderr=stderr[: lim.max_log_bytes],
                              runtime_s=runtime)
        except SandboxError:
            raise
        except (DockerException, requests.RequestException) as e:
            raise SandboxError(f"docker: {type(e).__name__}: {e}") from None
        finally:
            if cid is not None:
                self._remove(cid)

    def _logs(self, cid: str) -> tuple[bytes, bytes]:
        """stdout and stderr in one request. `APIClient.logs` inspects the container before
        each call (to learn whether it has a tty; ours never do) and merges the two streams,
        so it cost four calls per attempt where this costs one."""
        api = self.client.api
        res = api.get(f"{api.base_url}/v{api.api_version}/containers/{cid}/logs",
                      params={"stdout": 1, "stderr": 1}, timeout=api.timeout)  # the client's 60 s, as its own calls
        res.raise_for_status()
        return demux_log(res.content)

    def _remove(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True)
        except NotFound:
            pass
        except (DockerException, requests.RequestException):
            return  # keep it in _live: close() tries again
        with self._lock:
            self._live.discard(container_id)

    def close(self) -> None:
        with self._lock:
            live = sorted(self._live)
        for cid in live:
            self._remove(cid)


def demux_log(data: bytes) -> tuple[bytes, bytes]:
    """Split Docker's multiplexed log stream (no tty) into stdout and stderr: frames of an
    8-byte header (stream 1 or 2, three zero bytes, big-endian payload length), then the
    payload."""
    streams = {1: bytearray(), 2: bytearray()}
    at = 0
    while at + 8 <= len(data):
        kind, size = data[at], int.from_bytes(data[at + 4:at + 8], "big")
        if kind in streams:
            streams[kind] += data[at + 8:at + 8 + size]
        at += 8 + size
    return bytes(streams[1]), bytes(streams[2])
