"""A real registry on loopback for the suite (Debian's ``docker-registry``, the distribution
project's registry 2.x), started in a private directory and stopped by its own pid: images
are pushed to it under upstream-style names, and tasks pull them through it.

127.0.0.0/8 registries are plain HTTP to docker by default, so the suite's dockerd needs no
configuration for it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

CONFIG = """version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


class LoopbackRegistry:
    """One registry process: ``host`` is ``127.0.0.1:<port>``."""

    def __init__(self, directory: Path) -> None:
        if shutil.which("docker-registry") is None:
            raise RuntimeError("docker-registry is not installed (scripts/setup.sh --test installs it)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.yml").write_text(CONFIG.format(root=directory / "data", port=self.port))
        self.log = open(directory / "registry.log", "wb")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(directory / "config.yml")],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"docker-registry did not answer on {self.host}: "
                                       f"{(directory / 'registry.log').read_text()[-1000:]}") from None
                time.sleep(0.2)

    def delete_manifest(self, repository: str, digest: str) -> None:
        """Remove one manifest (by digest) from the registry, as an upstream deletion would."""
        path = repository.removeprefix(self.host + "/")
        req = urllib.request.Request(f"http://{self.host}/v2/{path}/manifests/{digest}", method="DELETE")
        urllib.request.urlopen(req, timeout=10).close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
