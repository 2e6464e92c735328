"""A private rootless podman service for the test session: never the machine's, nor any user's.

`pytest_configure` points ``VALIDATE_PODMAN_HOST`` at a socket under a fresh temporary
directory, so the podman backend opened anywhere in the suite (or in a `validate`
subprocess, which inherits the environment) reaches this service or nothing. The service is
started only when a collected test is marked ``podman`` (so every other run of the suite
pays nothing), as the unprivileged user set-up creates (`validate.sandbox.podman.USER`),
with the agents' gids as supplementary groups (the attempt storage is ``0710 root:<gid>``),
and with its own HOME, XDG dirs, overlay storage and run root under that directory; the
sandbox image is imported through the backend's own `prepare_image`. At the end it stops
only what it started, by pid: the service, then the user-namespace holder ("pause")
process podman left, whose pid file lies under our run root; then removes the directory.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from validate.run.workspace import AGENT_UID, KEY_UID
from validate.sandbox.podman import HOST_ENV, USER

STORAGE_CONF = """[storage]
driver = "overlay"
graphroot = "{root}/storage"
runroot = "{root}/run/storage"
"""


class PrivatePodman:
    """One rootless `podman system service` whose state is all under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "podman.sock"
        self.log = root / "service.log"
        self.proc: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def env(self) -> dict[str, str]:
        r = self.root
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": f"{r}/home", "XDG_RUNTIME_DIR": f"{r}/run",
                "XDG_CONFIG_HOME": f"{r}/config", "XDG_DATA_HOME": f"{r}/data"}

    def start(self, timeout_s: float = 60.0) -> None:
        import docker
        import requests

        try:
            user = pwd.getpwnam(USER)
        except KeyError:
            raise RuntimeError(f"no user {USER!r} to run the rootless podman service: run "
                               f"`bash scripts/setup.sh --test` (as root)") from None
        for sub in ("home", "run", "config/containers", "data"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "config/containers/storage.conf").write_text(STORAGE_CONF.format(root=self.root))
        self.root.chmod(0o755)
        subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(self.root)], check=True)
        (self.root / "run").chmod(0o700)
        # The agents' gids (the key reader's, everyone else's, and 65532, which the conformance
        # suite's test of a foreign user runs as): the service must traverse their storage.
        groups = ",".join(map(str, (KEY_UID - 1, KEY_UID, AGENT_UID)))
        argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", f"--groups={groups}",
                "podman", "system", "service", "--time=0", self.host]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(argv, cwd=self.root, env=self.env(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the test podman service exited ({self.proc.returncode}): "
                                   f"{self.log_tail()}")
            try:
                docker.APIClient(base_url=self.host, version="1.41", timeout=5).ping()
                return
            except (docker.errors.DockerException, requests.RequestException):
                time.sleep(0.1)
        raise RuntimeError(f"the test podman service did not answer within {timeout_s:.0f} s: "
                           f"{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        try:
            uid = pwd.getpwnam(USER).pw_uid
        except KeyError:
            return  # no such user: nothing of it was started
        pause = _owned(self.root / "run/libpod/tmp/pause.pid", uid)
        if pause is not None:
            os.kill(pause, signal.SIGKILL)
        # conmon outlives an exec by minutes (its --exit-delay): every process of the user whose
        # command line names our root is ours, and nothing else is.
        for pid in _ours(uid, str(self.root)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def cleanup(self) -> None:
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.root)], capture_output=True)

    def log_tail(self, n_bytes: int = 2000) -> str:
        try:
            return self.log.read_bytes()[-n_bytes:].decode(errors="replace")
        except OSError:
            return "(no log)"


def _owned(pidfile: Path, uid: int) -> int | None:
    """The pid in `pidfile` if that process belongs to `uid` (a stale file must never make us
    signal a process that reused the number)."""
    try:
        pid = int(pidfile.read_text().strip())
        return pid if os.stat(f"/proc/{pid}").st_uid == uid else None
    except (OSError, ValueError):
        return None


def _ours(uid: int, mark: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid and \
                    mark.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


_SERVICE: PrivatePodman | None = None


def pytest_configure(config) -> None:
    global _SERVICE
    _SERVICE = PrivatePodman(Path(tempfile.mkdtemp(prefix="dvpodman-", dir="/tmp")))
    os.environ[HOST_ENV] = _SERVICE.host


def pytest_unconfigure(config) -> None:
    if _SERVICE is not None:
        _SERVICE.stop()
        _SERVICE.cleanup()


@pytest.fixture(scope="session", autouse=True)
def private_podman(request):
    """The session's own rootless service with the sandbox image, if any test needs it."""
    if not any(item.get_closest_marker("podman") for item in request.session.items):
        yield None
        return
    from validate.core.paths import DEFAULT_IMAGE, ImagePaths
    from validate.sandbox.podman import PodmanSandbox

    assert _SERVICE is not None and os.environ[HOST_ENV] == _SERVICE.host
    _SERVICE.start()
    PodmanSandbox.prepare_image(ImagePaths(DEFAULT_IMAGE), log=lambda _msg: None)
    yield _SERVICE
    _SERVICE.stop()
