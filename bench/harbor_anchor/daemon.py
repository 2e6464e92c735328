"""The bench's one private dockerd: started, emptied between measurements, stopped.

The daemon is the test suite's (`tests.dockerd.PrivateDockerd`: own socket, data-root,
exec-root, pidfile, config file, cgroup parent and containerd namespaces under one fresh
directory; ``--bridge=none --iptables=false``), with one addition: its registry traffic goes
to a proxy on a closed loopback port, so a pull that Harbor or a task's Dockerfile asks for
(``FROM ubuntu:24.04``, a compose service's image) fails here at once instead of leaving the
machine. Images it should hold for the whole invocation (the sandbox image, the bases and
their upstream tags, Harbor's stand-ins) are recorded as the baseline; `purge` removes every
container, network, volume and image not in it.
"""

from __future__ import annotations

import os

import docker

from tests.dockerd import PrivateDockerd

#: Nothing listens on the discard port of loopback: a pull through this proxy fails at once.
DEAD_PROXY = "http://127.0.0.1:9"


class BenchDaemon(PrivateDockerd):
    """A `PrivateDockerd` whose pulls cannot leave the machine, and what it must keep."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.baseline: set[str] = set()
        self._client: docker.DockerClient | None = None

    def argv(self) -> list[str]:
        # `env` execs dockerd in place: the pid (and the pidfile's check of its command line) is dockerd's.
        return ["env", f"HTTP_PROXY={DEAD_PROXY}", f"HTTPS_PROXY={DEAD_PROXY}", "NO_PROXY=", *super().argv()]

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker.DockerClient(base_url=self.host, timeout=600)
        return self._client

    def env(self) -> dict[str, str]:
        """This process's environment with DOCKER_HOST pointing at this daemon."""
        return {**os.environ, "DOCKER_HOST": self.host}

    def mark_baseline(self) -> None:
        self.baseline = {image.id for image in self.client.images.list(all=True)}

    def purge(self) -> None:
        """Every container, network, volume and image that is not the baseline: gone."""
        api = self.client.api
        for c in api.containers(all=True):
            api.remove_container(c["Id"], force=True, v=True)
        for n in api.networks():
            if n["Name"] not in ("none", "host", "bridge"):
                api.remove_network(n["Id"])
        for v in (api.volumes().get("Volumes") or []):
            api.remove_volume(v["Name"], force=True)
        # Tagged images first (a tag holds its parents), then whatever dangles; repeat until stable.
        for _ in range(10):
            extra = [i for i in api.images(all=True) if i["Id"] not in self.baseline]
            if not extra:
                return
            for image in sorted(extra, key=lambda i: -len(i.get("RepoTags") or [])):
                try:
                    api.remove_image(image["Id"], force=True, noprune=False)
                except docker.errors.APIError:
                    pass  # a parent of another image still here: removed with it, or in the next pass

    def close(self) -> None:
        """Remove everything the bench made in the daemon, stop it by its pidfile, delete its directory."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.baseline = set()
                self.purge()
        except docker.errors.DockerException:
            pass  # the daemon's whole data-root is deleted below in any case
        finally:
            if self._client is not None:
                self._client.close()
            self.stop()
            self.cleanup()
