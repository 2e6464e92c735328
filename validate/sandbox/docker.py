"""The reference profile: a fresh Docker container per attempt, through the Docker SDK.

Each container: the network disabled (a fresh namespace holding only ``lo``), memory (no
swap), cpu and pids limits, read-only root with ``/tmp`` (the request's own directory, else a
tmpfs capped in bytes and inodes), the request's user (65534:65534 unless told), every
capability dropped, no-new-privileges, docker's default seccomp profile, an RLIMIT_FSIZE cap,
a capped json-file log. Its PID 1 is coreutils ``timeout``, which kills the agent
`BACKSTOP_S` past its timeout, so no container outlives its limit even when the harness
is killed; the harness's own timeout (it kills the container) comes first and is recorded.

Agent or infrastructure is decided from the daemon, never from the exit code the agent
chooses: a failed create or start, a lost connection, an error in the container's state,
and a kill the harness did not send (a ``kill`` event of the daemon: someone's
``docker kill`` or ``docker stop``, the daemon shutting down) are infrastructure faults;
OOM is read from the container's state (and its ``oom`` event). The events are asked for
only when the exit is ambiguous, a signal's (128 + n), so a plain exit costs nothing more.
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
from validate.sandbox.base import BackendFacts, ExecResult, RunRequest, Sandbox, watchdog_argv

LABEL = "deshuffle-validate"
#: Seconds past now the events of an ambiguous exit are awaited (the daemon logs a kill
#: right after it signals, which can be just after the exit is reported).
EVENTS_GRACE_S = 0.1


def unreachable(error: Exception) -> str:
    """What to say when the daemon does not answer: which socket was tried, and the fix."""
    import os

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock (the default; DOCKER_HOST is unset)"
    return (f"backend docker: no Docker daemon answers at {host} ({type(error).__name__}: {error}). Start one with "
            f"`bash scripts/setup.sh` (as root), point DOCKER_HOST at a running daemon, or freeze the contract for "
            f"bwrap (`validate freeze --backend bwrap ...`)")


class DockerSandbox(Sandbox):
    backend = "docker"
    isolates_network = True

    def __init__(self, image: str = DEFAULT_IMAGE, run_label: str = "adhoc", pool_size: int = 16) -> None:
        self.image = image
        self.run_label = run_label
        try:
            self.client = docker.from_env(timeout=60, max_pool_size=pool_size)
        except DockerException as e:
            raise ProfileUnavailable(unreachable(e)) from None
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._sweep()

    def _sweep(self) -> None:
        """Remove what a killed earlier process of this same run left: its containers (a
        running one is past its limit by its backstop at the latest; its attempt storage:
        `open_sandbox`)."""
        try:
            for c in self.client.api.containers(all=True, quiet=True, filters={"label": f"{LABEL}={self.run_label}"}):
                self._remove(c["Id"])
        except (DockerException, requests.RequestException):
            pass  # facts() reports an unreachable daemon with a clear message

    def facts(self) -> BackendFacts:
        # The image is identified by its one layer's diff_id, the sha256 of the rootfs tarball it
        # was imported from: the image id also hashes the import's config and time, so it
        # differs between two imports of the same bytes.
        from validate.image import docker_image_packages, image_layers, python_version

        try:
            version = self.client.version()
            # Daemons before 20.10 report no CgroupVersion: they supported cgroup v1 only.
            cgroup = "v2" if str(self.client.info().get("CgroupVersion", "1")) == "2" else "v1"
            image = self.client.images.get(self.image)
            layers = image_layers(image)
            if len(layers) != 1:
                raise ProfileUnavailable(f"execution.image: {self.image} has {len(layers)} layers, not the one "
                                         f"imported root filesystem; build it with `validate image build`")
            packages = docker_image_packages(self.client, image.id, labels={LABEL: self.run_label})
        except ImageNotFound:
            raise ProfileUnavailable(f"execution.image: {self.image} is not in the Docker daemon; "
                                     f"build it with `validate image build`") from None
        except (DockerException, requests.RequestException) as e:
            raise ProfileUnavailable(unreachable(e)) from None
        return BackendFacts(backend=self.backend, image=self.image, image_digest=layers[0],
                            architecture=image.attrs.get("Architecture", "unknown"),
                            version=f"docker {version.get('Version', '?')}",
                            packages=packages, python=python_version(packages),
                            seccomp=f"docker {version.get('Version', '?')} default profile", cgroup=cgroup)

    def create_container(self, req: RunRequest) -> str:
        """Create the container of `req` through the low-level API (the high-level
        `containers.create` adds an inspect per attempt) and return its id."""
        lim = req.limits
        fsize = lim.max_file_mb * 1024 * 1024
        api = self.client.api
        mounts = [Mount(target=m.target, source=str(m.source), type="bind", read_only=m.read_only)
                  for m in req.mounts]
        tmpfs = None
        if req.tmp is None:
            tmpfs = {"/tmp": f"size={lim.tmpfs_mb}m,nr_inodes={lim.storage_inodes},mode=1777"}
        else:
            mounts.append(Mount(target="/tmp", source=str(req.tmp), type="bind", read_only=False))
        host_config = api.create_host_config(
            network_mode="none",
            mem_limit=f"{lim.memory_mb}m",
            memswap_limit=f"{lim.memory_mb}m",
            nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.pids,
            read_only=True,
            tmpfs=tmpfs,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[Ulimit(name="fsize", soft=fsize, hard=fsize)],
            log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
            mounts=mounts,
        )
        return api.create_container(
            self.image,
            command=watchdog_argv(req.argv, lim.timeout_s),
            name=f"dv-{req.name}",
            labels={LABEL: self.run_label},
            user=req.user,
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
            cid = self.create_container(req)
            with self._lock:
                self._live.add(cid)
            since = time.time()
            t0 = time.monotonic()
            api.start(cid)
            timed_out, waited = False, {}
            try:
                waited = api.wait(cid, timeout=lim.timeout_s)
            except requests.exceptions.ConnectionError:
                if time.monotonic() - t0 < lim.timeout_s * 0.99:
                    raise  # the daemon went away, not our timeout
                timed_out = True
                try:
                    api.kill(cid)
                except APIError:
                    pass  # it exited between the timeout and the kill
            runtime = time.monotonic() - t0
            state = api.inspect_container(cid)["State"]
            oom = self.judge(cid, req.name, since, waited, state, timed_out)
            stdout, stderr = self._logs(cid)
            return ExecResult(exit_code=None if timed_out else state.get("ExitCode"), timed_out=timed_out,
                              oom_killed=oom, stdout=stdout[: lim.max_log_bytes], stderr=stderr[: lim.max_log_bytes],
                              runtime_s=runtime)
        except SandboxError:
            raise
        except (DockerException, requests.RequestException) as e:
            raise SandboxError(f"docker: {type(e).__name__}: {e}") from None
        finally:
            if cid is not None:
                self._remove(cid)

    def judge(self, cid: str, name: str, since: float, waited: dict, state: dict, timed_out: bool) -> bool:
        """Whether the agent was OOM-killed; `SandboxError` when the daemon says the container
        failed or was killed by someone other than the harness (its ``kill`` events since
        `since`, a ``time.time()``). A one-shot run and a live session judge an exit alike."""
        error = (waited.get("Error") or {}).get("Message") or state.get("Error")
        if error:
            raise SandboxError(f"container dv-{name}: the daemon reports {error!r}")
        oom = bool(state.get("OOMKilled"))
        if timed_out or oom or not isinstance(state.get("ExitCode"), int) or state["ExitCode"] < 128:
            return oom
        # A signal's exit: the agent's own (it may kill itself) or someone else's. Ask the daemon.
        actions = self._events(cid, since)
        kills = [signal for action, signal in actions if action == "kill"]
        if kills:
            raise SandboxError(f"container dv-{name} was killed from outside (signal {', '.join(kills)}, "
                               f"exit {state['ExitCode']}); the harness sent no kill")
        return any(action == "oom" for action, _ in actions)

    def _events(self, cid: str, since: float) -> list[tuple[str, str]]:
        """(action, signal) of the daemon's events for container `cid` since `since`; the
        stream ends a moment after now, so an event logged just after the exit is seen."""
        stream = self.client.api.events(since=since, until=time.time() + EVENTS_GRACE_S, decode=True,
                                        filters={"type": "container", "container": cid})
        try:
            return [(e.get("Action", ""), str(e.get("Actor", {}).get("Attributes", {}).get("signal", "")))
                    for e in stream]
        finally:
            stream.close()

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

    def track(self, container_id: str) -> None:
        """Count a container made outside `run` (a live session's) among those `close` removes."""
        with self._lock:
            self._live.add(container_id)

    def remove(self, container_id: str) -> None:
        """Remove a container now (kept for `close` if the daemon does not answer)."""
        self._remove(container_id)

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
