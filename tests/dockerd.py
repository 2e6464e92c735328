"""A private dockerd for the test session: the suite never talks to the machine's daemon.

`pytest_configure` points ``DOCKER_HOST`` at a socket under a fresh short temporary
directory before any test module is imported, so a docker client opened anywhere in the
suite, in this process or in a `validate` subprocess (which inherits the environment),
reaches this daemon or nothing. The session fixture `private_dockerd` (autouse) starts it
with its own socket, data-root, exec-root, pidfile, config file (registering gVisor's runsc
when it is installed) and cgroup parent, no bridge and no iptables; imports the sandbox
image from the image store's tarball; and at the end stops only that daemon, by its
pidfile. The fault tests stop and restart it through the same object.

The same hook puts this interpreter's ``bin/`` first on ``PATH``: the suite runs
``validate`` as a subprocess, and that must be this checkout's, not another one on the
machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

#: Unix socket paths are limited to 108 bytes, and containerd's ttrpc socket lies three
#: levels under the exec-root: keep the root short.
SHORT_TMP = Path("/tmp")


#: gVisor's runtime as the docker-gvisor backend needs it (`validate.sandbox.docker.gvisor`),
#: and one registered without ``--network=none``, whose every start fails: the test that a
#: failed start leaves no process behind uses it.
GVISOR_RUNTIME, BROKEN_GVISOR_RUNTIME = "runsc", "runsc-without-network-none"


def daemon_config() -> dict:
    """This daemon's own config: the runsc runtimes when runsc is installed (never registered
    with the machine's daemon); without runsc, docker-gvisor's tests fail naming the fix."""
    runsc = shutil.which("runsc")
    if runsc is None:
        return {}
    return {"runtimes": {GVISOR_RUNTIME: {"path": runsc, "runtimeArgs": ["--network=none"]},
                         BROKEN_GVISOR_RUNTIME: {"path": runsc}}}


class PrivateDockerd:
    """One dockerd that shares nothing with the machine's: socket, data, state, cgroups."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "d.sock"
        self.data_root = root / "data"
        self.exec_root = root / "x"
        self.pidfile = root / "d.pid"
        self.log = root / "dockerd.log"
        self.config = root / "daemon.json"
        #: The daemon's cgroup parent and containerd namespaces: a digest of where it lives, as
        #: scripts/setup.sh names its own. Not the directory's name: mkdtemp's names may end in
        #: "_" or hold "__", which containerd refuses as a namespace (every container start then
        #: fails with "namespace validation").
        self.tag = "dv-" + hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
        #: Containers' cgroups go under this parent, never under the machine daemon's /docker.
        self.cgroup_parent = f"/{self.tag}"
        self.proc: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def argv(self) -> list[str]:
        return ["dockerd", f"--host={self.host}", f"--data-root={self.data_root}",
                f"--exec-root={self.exec_root}", f"--pidfile={self.pidfile}",
                f"--config-file={self.config}",  # not the machine's /etc/docker/daemon.json
                f"--cgroup-parent={self.cgroup_parent}",
                # a containerd already running on the machine (Debian's containerd.service) is
                # shared by every dockerd that finds it: our containers go in our own namespace
                f"--containerd-namespace={self.tag}",
                f"--containerd-plugins-namespace={self.tag}-plugins",
                "--iptables=false", "--ip6tables=false", "--bridge=none"]

    def start(self, timeout_s: float = 120.0) -> None:
        import docker

        self.config.write_text(json.dumps(daemon_config(), sort_keys=True) + "\n")
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the test dockerd exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                docker.DockerClient(base_url=self.host, timeout=5).ping()
                return
            except docker.errors.DockerException:
                time.sleep(0.2)
        raise RuntimeError(f"the test dockerd did not answer within {timeout_s:.0f} s: {self.log_tail()}")

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM the daemon named by our pidfile (it stops its containers and its
        containerd), then wait for it; SIGKILL it and its containerd only if it hangs."""
        pid = _ours(_read_pid(self.pidfile), str(self.pidfile))
        if pid is None and self.proc is not None and self.proc.poll() is None:
            pid = self.proc.pid
        if pid is not None:
            _signal(pid, signal.SIGTERM)
            if not _wait_gone(pid, timeout_s):
                _signal(pid, signal.SIGKILL)
                _wait_gone(pid, 10)
        if self.proc is not None:
            self.proc.wait()
            self.proc = None
        containerd = _ours(_read_pid(self.exec_root / "containerd/containerd.pid"), str(self.exec_root))
        if containerd is not None and not _wait_gone(containerd, 10):
            _signal(containerd, signal.SIGKILL)
            _wait_gone(containerd, 10)
        self.pidfile.unlink(missing_ok=True)

    def cleanup(self) -> None:
        """Unmount what a killed daemon may have left under our root, remove our cgroup
        parents, then the root itself."""
        for target in sorted(_mounts_under(self.root), key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True)
        for controller in Path("/sys/fs/cgroup").iterdir():
            _rmdir_tree(controller / self.cgroup_parent.lstrip("/"))
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.root)], capture_output=True)

    def log_tail(self, n_bytes: int = 2000) -> str:
        try:
            return self.log.read_bytes()[-n_bytes:].decode(errors="replace")
        except OSError:
            return "(no log)"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _ours(pid: int | None, mark: str) -> int | None:
    """`pid` if that process's command line names `mark` (our pidfile or exec-root): a stale
    pidfile must never make us signal a process that reused the number."""
    if pid is None:
        return None
    try:
        return pid if mark in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") else None
    except OSError:
        return None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
        except (OSError, IndexError):
            return True
        if state == "Z":  # exited; its parent reaps it
            return True
        time.sleep(0.1)
    return False


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root) + "/"
    targets = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target.startswith(prefix):
            targets.append(target)
    return targets


def _rmdir_tree(path: Path) -> None:
    if not path.is_dir():
        return
    for child in path.iterdir():
        if child.is_dir():
            _rmdir_tree(child)
    try:
        path.rmdir()
    except OSError:
        pass


_DAEMON: PrivateDockerd | None = None


def pytest_configure(config) -> None:
    global _DAEMON
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    _DAEMON = PrivateDockerd(Path(tempfile.mkdtemp(prefix="dv", dir=SHORT_TMP)))
    os.environ["DOCKER_HOST"] = _DAEMON.host


def pytest_unconfigure(config) -> None:
    if _DAEMON is not None:
        _DAEMON.stop()
        _DAEMON.cleanup()


@pytest.fixture(scope="session", autouse=True)
def private_dockerd() -> PrivateDockerd:
    """The session's own dockerd, with the sandbox image imported from the image store."""
    from validate.core.paths import DEFAULT_IMAGE, ImagePaths
    from validate.sandbox.docker.image import import_docker

    assert _DAEMON is not None and os.environ["DOCKER_HOST"] == _DAEMON.host
    _DAEMON.start()
    import_docker(ImagePaths(DEFAULT_IMAGE), log=lambda _msg: None)
    yield _DAEMON
    if _DAEMON.proc is not None and _DAEMON.proc.poll() is not None:  # someone else stopped it
        warnings.warn(f"the test dockerd exited during the session ({_DAEMON.proc.returncode}); "
                      f"its log ends: {_DAEMON.log_tail()}", stacklevel=1)
    _DAEMON.stop()
