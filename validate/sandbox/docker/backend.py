"""The reference profile: a fresh Docker container per attempt or live session, through the Docker SDK.

Each container: the network disabled (a fresh namespace holding only ``lo``), memory (no
swap), cpu and pids limits, read-only root with ``/tmp`` (the request's own directory, else a
tmpfs capped in bytes and inodes), the request's user (65534:65534 unless told), every
capability dropped, no-new-privileges, docker's default seccomp profile, an RLIMIT_FSIZE cap,
a capped json-file log (`wire.create_container`). Its PID 1 is coreutils ``timeout``, which
kills the agent `BACKSTOP_S` past its timeout, so no container outlives its limit even when
the harness is killed; the harness's own timeout (it kills the container) comes first and is
recorded.

Agent or infrastructure is decided from the daemon, never from the exit code the agent
chooses: a failed create or start, a lost connection, an error in the container's state,
and a kill the harness did not send (a ``kill`` event of the daemon: someone's
``docker kill`` or ``docker stop``, the daemon shutting down) are infrastructure faults;
OOM is read from the container's state (and its ``oom`` event). The events are asked for
only when the exit is ambiguous, a signal's (128 + n), so a plain exit costs nothing more.

A live session's container is made exactly as a one-shot run's; its PID 1 is the watchdog
over ``sleep infinity``, both exempt from the OOM killer (oom_score_adj −1000, written by
the harness on the host), so a command's memory blow-up kills the command, not the session.
Each command is an exec instance (the container's user, working directory and environment)
under coreutils ``timeout -s KILL`` for its timeout, its output streamed off the hijacked
socket; its exit code comes from the daemon (``exec_inspect``), an OOM kill from the
container's memory cgroup (its ``oom_kill`` counter before and after). A container found no
longer running is judged as a one-shot run's exit is (`judge`); with no harness-side cause,
before the deadline, it is `SandboxEnded`: the agent's doing, whatever exit code it left. A
command is ``timed_out`` by the harness's clock only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from validate.core.errors import ProfileUnavailable, SandboxError
from validate.core.paths import DEFAULT_IMAGE, ImagePaths
from validate.sandbox.base import BackendFacts, Capabilities, ExecResult, RunRequest, Sandbox, shield
from validate.sandbox.cgroups import oom_kills_of_pid
from validate.sandbox.docker import wire
from validate.sandbox.docker.image import image_layers, image_packages, import_docker
from validate.sandbox.docker.wire import LABEL, unreachable
from validate.sandbox.image import python_version
from validate.sandbox.session import SandboxEnded

#: Seconds past now the events of an ambiguous exit are awaited (the daemon logs a kill
#: right after it signals, which can be just after the exit is reported).
EVENTS_GRACE_S = 0.1
#: Seconds past a command's timeout the harness waits for its stream before declaring the session dead.
STREAM_GRACE_S = 10.0


@dataclass
class DockerLive:
    """A live session's container: its request, id, PID 1 on the host, when it started (the
    daemon's events are judged from then, a ``time.time()``) and its deadline (monotonic)."""

    request: RunRequest
    deadline: float
    cid: str | None = None
    pid: int = 0
    since: float = 0.0


class DockerSandbox(Sandbox):
    backend = "docker"
    isolates_network = True
    capabilities = Capabilities(trials="engine", images="docker", shared_verifier=True, trusted_verifier=True,
                                separate_verifier=True)

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

    @classmethod
    def prepare_image(cls, paths: ImagePaths, log) -> None:
        import_docker(paths, log)

    def _sweep(self) -> None:
        """Remove what a killed earlier process of this same run left: its containers (a
        running one is past its limit by its backstop at the latest; its attempt storage:
        `open_sandbox`)."""
        try:
            for c in self.client.api.containers(all=True, quiet=True,
                                                filters={"label": f"{LABEL}={self.run_label}"}):
                self._remove(c["Id"])
        except (DockerException, requests.RequestException):
            pass  # facts() reports an unreachable daemon with a clear message

    def facts(self) -> BackendFacts:
        try:
            version = self.client.version()
            # Daemons before 20.10 report no CgroupVersion: they supported cgroup v1 only.
            cgroup = "v2" if str(self.client.info().get("CgroupVersion", "1")) == "2" else "v1"
            image, digest, packages = self.image_facts()
        except ImageNotFound:
            raise ProfileUnavailable(f"execution.image: {self.image} is not in the Docker daemon; "
                                     f"build it with `validate image build`") from None
        except (DockerException, requests.RequestException) as e:
            raise ProfileUnavailable(unreachable(e)) from None
        return BackendFacts(backend=self.backend, image=self.image, image_digest=digest,
                            architecture=image.attrs.get("Architecture", "unknown"),
                            version=f"docker {version.get('Version', '?')}",
                            packages=packages, python=python_version(packages),
                            seccomp=f"docker {version.get('Version', '?')} default profile", cgroup=cgroup)

    def image_facts(self, engine: str = "") -> tuple:
        """The sandbox image, its one layer's digest and its packages (docker's `ImageNotFound`
        passes through). The image is identified by that layer's diff_id, the sha256 of the
        rootfs tarball it was imported from (the image id also hashes the import's config and
        time, so it differs between two imports of the same bytes); `engine` names where it was
        looked for in errors."""
        image = self.client.images.get(self.image)
        layers = image_layers(image)
        if len(layers) != 1:
            raise ProfileUnavailable(f"execution.image: {self.image} has {len(layers)} layers{engine}, not "
                                     "the one imported root filesystem; build it with `validate image build`")
        return image, layers[0], image_packages(self.client, image.id, labels={LABEL: self.run_label})

    def host_config(self, req: RunRequest) -> dict:
        """What a profile over this backend changes in a container's host config
        (`wire.create_container`); the reference profile changes nothing."""
        return {}

    def create_container(self, req: RunRequest) -> str:
        """Create the container of `req` (`wire.create_container`), counted among those `close` removes."""
        cid = wire.create_container(self.client.api, self.image, req, self.run_label, **self.host_config(req))
        with self._lock:
            self._live.add(cid)
        return cid

    def run(self, req: RunRequest) -> ExecResult:
        lim = req.limits
        api = self.client.api
        cid = None
        try:
            cid = self.create_container(req)
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
            stdout, stderr = wire.logs(api, cid)
            return ExecResult(exit_code=None if timed_out else state.get("ExitCode"), timed_out=timed_out,
                              oom_killed=oom, stdout=stdout[: lim.max_log_bytes],
                              stderr=stderr[: lim.max_log_bytes], runtime_s=runtime)
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

    # --- live sessions --------------------------------------------------------------------

    def start_session(self, request: RunRequest, deadline: float) -> DockerLive:
        live = DockerLive(request=request, deadline=deadline)
        try:
            self._start_container(live)
        except BaseException:
            self.stop_session(live)
            raise
        return live

    def _start_container(self, live: DockerLive) -> None:
        api = self.client.api
        try:
            live.cid = self.create_container(live.request.model_copy(update={"argv": ("sleep", "infinity")}))
            live.since = time.time()  # the daemon's events of this container are judged from here
            api.start(live.cid)
            state = api.inspect_container(live.cid)["State"]
        except (DockerException, requests.RequestException) as e:
            raise SandboxError(f"docker session: cannot start: {type(e).__name__}: {e}") from None
        if not state.get("Running"):
            raise SandboxError(f"docker session: the container is not running: {state.get('Error') or state}")
        live.pid = pid = int(state.get("Pid") or 0)
        children = Path(f"/proc/{pid}/task/{pid}/children")
        for _ in range(50):  # `timeout` forks its sleep just after the start
            if children.exists() and children.read_text().strip():
                break
            time.sleep(0.002)
        shield(pid)

    def _still_running(self, live: DockerLive) -> bool:
        """Whether the container still runs. If it does not: `SandboxError` when the daemon
        reports an error or a kill the harness did not send (`judge`, as for a one-shot run);
        False when the session's deadline has passed (the watchdog's backstop, the harness's
        own clock); else `SandboxEnded`, whatever the exit code says."""
        name = live.request.name
        try:
            state = self.client.api.inspect_container(live.cid)["State"]
        except (DockerException, requests.RequestException) as e:
            raise SandboxError(f"docker session: the daemon cannot say how container dv-{name} is: "
                               f"{type(e).__name__}: {e}") from None
        if state.get("Running"):
            return True
        try:
            oom = self.judge(live.cid, name, live.since, {}, state, False)
        except (DockerException, requests.RequestException) as e:
            raise SandboxError(
                f"docker session: cannot read the daemon's events: {type(e).__name__}: {e}"
            ) from None
        if time.monotonic() >= live.deadline:
            return False
        raise SandboxEnded(f"container dv-{name} ended under the agent's command before its deadline "
                           f"(exit {state.get('ExitCode')}{', OOM' if oom else ''}); "
                           f"the harness saw no cause of its own")

    def session_exec(self, live: DockerLive, argv: tuple[str, ...], stdin: bytes, timeout_s: float,
                     keep: int) -> ExecResult:
        api, req = self.client.api, live.request
        before = oom_kills_of_pid(live.pid)
        t0 = time.monotonic()
        try:
            exec_id = api.exec_create(live.cid, ["/usr/bin/timeout", "-s", "KILL", f"{timeout_s:.3f}", *argv],
                                      stdin=bool(stdin), user=req.user, workdir=req.workdir,
                                      environment=dict(req.env))["Id"]
            sock = api.exec_start(exec_id, socket=True)
            out, err, ended = wire.stream_exec(sock, stdin, timeout_s + STREAM_GRACE_S, keep)
            info = self._finished(exec_id, t0 + timeout_s + STREAM_GRACE_S)
        except (DockerException, requests.RequestException, OSError) as e:
            if not self._still_running(live):
                return ExecResult(exit_code=None, timed_out=True, runtime_s=time.monotonic() - t0)
            raise SandboxError(f"docker session: exec failed: {type(e).__name__}: {e}") from None
        runtime = time.monotonic() - t0
        code = info.get("ExitCode")
        # 126/127: also how the runtime reports an exec into a container that has just stopped.
        if (info.get("Running") or not isinstance(code, int)
            or code >= 126) and not self._still_running(live):
            return ExecResult(exit_code=None, timed_out=True, stdout=out, stderr=err, runtime_s=runtime)
        after = oom_kills_of_pid(live.pid)
        oom = before is not None and after is not None and after > before
        # Timed out by the harness's clock: past the command's time (t0 precedes the container's
        # `timeout`, so its kill lands later), or a command still running (its `timeout`
        # stopped, or its output held open by a process it left behind).
        timed_out = not oom and (info.get("Running") or not ended or
                                 (code == 137 and runtime >= timeout_s))
        return ExecResult(exit_code=None if timed_out else code, timed_out=bool(timed_out), oom_killed=oom,
                          stdout=out, stderr=err, runtime_s=runtime)

    def _finished(self, exec_id: str, until: float) -> dict:
        """The exec's state once it has ended, or as it is at `until` (harness clock)."""
        while True:
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running") or time.monotonic() >= until:
                return info
            time.sleep(0.01)

    def stop_session(self, live: DockerLive) -> None:
        if live.cid is not None:
            self._remove(live.cid)
