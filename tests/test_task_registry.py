"""Task images' bases from a registry (`validate.taskdir.images.registry`): a real registry on
loopback (Debian's docker-registry), images pushed to it under upstream-style names (a
Docker Hub official image, a ghcr.io one through the mirror), tasks that use them frozen by
the digests they resolved to; a moved tag named and never followed; a digest the registry no
longer has refused, named."""

from __future__ import annotations

import io
import json
from pathlib import Path

import docker
import pytest

from tests.registry import LoopbackRegistry
from validate import api
from validate.cli.main import main
from validate.core.errors import ContractError
from validate.core.paths import task_image_store
from validate.taskdir.images.bases import build_base_map
from validate.taskdir.images.docker import DockerImages

pytestmark = pytest.mark.docker

TOML = "[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 60\n"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = LoopbackRegistry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


def _push(client, registry: LoopbackRegistry, base_id: str, name: str, marker: str) -> str:
    """An image of `base_id` plus a file saying `marker`, pushed as ``<registry>/<name>``;
    the local copy removed, so a task's build must pull it. Returns the pushed digest."""
    dockerfile = f"FROM {base_id}\nRUN mkdir -p /opt && echo {marker} > /opt/marker\n"
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, pull=False,
                                   network_mode="none")
    repo, _, tag = f"{registry.host}/{name}".rpartition(":")
    image.tag(repo, tag)
    for line in client.api.push(repo, tag=tag, stream=True, decode=True):
        assert "error" not in line, line
    digest = client.api.inspect_distribution(f"{repo}:{tag}")["Descriptor"]["digest"]
    client.images.remove(image.id, force=True)
    return digest


def _task(root: Path, name: str, *, dockerfile: str | None = None, image: str | None = None) -> None:
    task = root / name
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(TOML + (f'[environment]\ndocker_image = "{image}"\n' if image else ""))
    (task / "instruction.md").write_text("Say hello.\n")
    if dockerfile:
        (task / "environment/Dockerfile").write_text(dockerfile)
    (task / "solution/solve.sh").write_text("#!/bin/bash\ntrue\n")
    (task / "tests/test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")


def test_tasks_pull_through_the_registry_frozen_by_digest_and_a_moved_tag_is_named(registry, tmp_path,
                                                                                   capsys):
    client = docker.from_env()
    bases = build_base_map(DockerImages(), task_image_store() / "bases", log=lambda m: None)
    python, debian = (
        bases.bases["python-3.11-slim-bookworm"].image_id,
        bases.bases["debian-bookworm-slim"].image_id,
    )
    first = _push(client, registry, python, "library/python:3.11-slim", "one")
    swe = _push(client, registry, debian, "ghcr.io/acme/swe-env:v1", "swe")
    data = tmp_path / "ds"
    _task(data, "from-hub", dockerfile="FROM python:3.11-slim\nRUN cat /opt/marker > /seen\n")
    _task(data, "prebuilt", image="ghcr.io/acme/swe-env:v1")
    _task(data, "gone-digest", dockerfile=f"FROM python:3.11-slim@sha256:{'9' * 64}\n")
    out = tmp_path / "reg.json"
    assert main(["freeze", "--env", "harbor", "--name", "reg", "--dataset", str(data), "--min-count", "1",
                 "--allow-patch", "--registry", registry.host, "--out", str(out)]) == 0
    ti = json.loads(out.read_bytes())["execution"]["task_images"]
    assert ti["build_policy"]["registry"] == registry.host and ti["base_map"]["bases"] == {}
    hub, pre = ti["tasks"]["from-hub"], ti["tasks"]["prebuilt"]
    assert hub["bases"] == {"python:3.11-slim": f"{registry.host}/library/python@{first}"}
    assert pre["bases"] == {"ghcr.io/acme/swe-env:v1": f"{registry.host}/ghcr.io/acme/swe-env@{swe}"}
    seen = client.containers.run(hub["image"], ["cat", "/seen"], remove=True)
    assert seen.strip() == b"one"  # built on the image the registry gave
    gone = ti["tasks"]["gone-digest"]
    assert gone["refusal"] == "unsupported_execution_contract" and "no longer resolves" in gone["detail"], (
        gone
    )
    capsys.readouterr()
    # the tag moves on: verify names it and holds the contract's digest
    moved = _push(client, registry, python, "library/python:3.11-slim", "two")
    assert moved != first
    assert main(["verify", "--manifest", str(out)]) == 0
    said = capsys.readouterr().err
    assert "python:3.11-slim: the tag" in said and f"has moved to {moved}" in said and first in said, said
    # the frozen digest of the prebuilt image is deleted upstream; with no local copy,
    # verify refuses, naming it
    registry.delete_manifest(f"{registry.host}/ghcr.io/acme/swe-env", swe)
    client.images.remove(pre["image"], force=True)
    for image in client.images.list(name=f"{registry.host}/ghcr.io/acme/swe-env"):
        client.images.remove(image.id, force=True)
    with pytest.raises(ContractError, match=f"the digest {swe} no longer resolves"):
        api.verify(out)

