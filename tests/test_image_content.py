"""Task images as evidence (`validate.taskdir.images.content`, `.transfer`): a content digest of
each image's filesystem frozen beside its id, independent of when it was built; another
machine's rebuild (another id) verified by content, or its differing files named; the
contract's images carried as one archive and held to their digests on import. Real builds
in the suite's own dockerd; "another machine" is this daemon with the frozen images removed
and rebuilt without the layer cache."""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import docker
import pytest

from validate import api
from validate.core import environments
from validate.core.errors import ContractError, ValidateError
from validate.core.paths import DEFAULT_IMAGE, task_image_store
from validate.taskdir.images.content import _git_index, _normalised, content_file
from validate.taskdir.images.docker import DockerImages
from validate.taskdir.images.frozen import log_dir_of, verify_images

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
#: a git history made in the build (its commit dates), and a plain one
PICK = ("answer-in-git-history", "csv-to-json")


def test_what_a_build_writes_only_because_of_its_clock_is_normalised(tmp_path):
    pyc = b"\xa7\r\r\n" + b"\0\0\0\0" + b"\x11\x22\x33\x44" + b"\x10\0\0\0" + b"code"
    assert _normalised("a/__pycache__/m.cpython-311.pyc", pyc) == pyc[:8] + b"\0\0\0\0" + pyc[12:]
    hashed = b"\xa7\r\r\n" + b"\x01\0\0\0" + b"\x11\x22\x33\x44" * 2 + b"code"  # hash-based: kept
    assert _normalised("m.pyc", hashed) == hashed
    shadow = b"root:*:19700:0:99999:7:::\nagent:!:20001:0:99999:7:::\n"
    assert _normalised("etc/shadow", shadow) == b"root:*::0:99999:7:::\nagent:!::0:99999:7:::\n"
    indexes = []
    for n, when in ((1, 1_000_000), (2, 2_000_000)):  # the same file, other inodes and times
        repo = tmp_path / f"r{n}"
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        (repo / "f").write_text("x")
        os.utime(repo / "f", (when, when))
        subprocess.run(["git", "-C", str(repo), "add", "f"], check=True)
        indexes.append((repo / ".git/index").read_bytes())
    assert indexes[0] != indexes[1] and _git_index(indexes[0]) == _git_index(indexes[1])
    (repo / "f").write_text("y")  # staged content changes: the normalised index changes
    subprocess.run(["git", "-C", str(repo), "add", "f"], check=True)
    assert _git_index((repo / ".git/index").read_bytes()) != _git_index(indexes[0])


class NoCacheImages(DockerImages):
    """The docker backend building without the daemon's layer cache: a fresh machine's build."""

    def _connect(self, timeout_s):
        client = super()._connect(timeout_s)
        client.api.build = functools.partial(client.api.build, nocache=True)
        return client


def _idx() -> list[int]:
    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(SAMPLE)))
    return [i for i in range(ts.size) if ts.task(i).id in PICK]


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    base = tmp_path_factory.mktemp("content")
    path = base / "c.json"
    m = api.freeze(
        "c",
        env="harbor",
        config={"dataset": str(SAMPLE)},
        idx=_idx(),
        backend="docker",
        min_count=1,
        allow_patch=True,
        out=path,
    )
    return path, m


@pytest.mark.docker
@pytest.mark.slow
def test_the_contracts_images_travel_as_one_archive_checked_on_import(frozen, tmp_path):
    path, m = frozen
    api.verify(path)  # every frozen image held here, by its id
    archive = api.export_task_images(path, tmp_path)
    assert archive.name == f"task-images-{m.sha256.removeprefix('sha256:')[:12]}.tar"
    client = docker.from_env()
    ids = {e.image for e in m.execution.task_images.tasks.values() if e.image}
    for image in ids:
        client.images.remove(image, force=True)
    assert api.import_task_images(archive, path) == len(ids)
    assert {client.images.get(i).id for i in ids} == ids  # the very ids: verify holds them as frozen
    # an archive that would name (and so add or shadow) an image is refused before loading
    hostile = tmp_path / "hostile.tar"
    with tarfile.open(archive) as src, tarfile.open(hostile, "w") as out:
        for member in src:
            data = src.extractfile(member).read() if member.isreg() else None
            if member.name == "manifest.json":
                index = json.loads(data)
                index[0]["RepoTags"] = ["deshuffle-validate-sandbox:bookworm"]
                data = json.dumps(index).encode()
                member.size = len(data)
            out.addfile(member, io.BytesIO(data) if data is not None else None)
    with pytest.raises(ValidateError, match="names images .*deshuffle-validate-sandbox"):
        api.import_task_images(hostile, path)


@pytest.mark.docker
@pytest.mark.slow
def test_a_rebuild_elsewhere_is_held_to_the_frozen_content_and_differences_are_named(frozen, tmp_path):
    """(After the archive's test: this one removes the frozen images for good.)"""
    path, m = frozen
    ti = m.execution.task_images
    assert ti.build_policy.clock is not None
    for tid in PICK:
        entry = ti.tasks[tid]
        assert entry.content.startswith("sha256:") and content_file(log_dir_of(path), entry.content).is_file()
    # "another machine": the frozen images gone, each rebuilt from nothing, to other ids
    client = docker.from_env()
    for tid in PICK:
        client.images.remove(ti.tasks[tid].image, force=True)
    taskset = environments.get("harbor").load(environments.get("harbor").Config(dataset=str(SAMPLE)))
    store = tmp_path / "store"
    store.mkdir()
    (store / "bases").symlink_to(task_image_store() / "bases")
    assert verify_images(ti, taskset, store, NoCacheImages(), log_dir_of(path)) == len(PICK)
    # a build with another clock writes other git commits: named, file by file
    other = ti.model_copy(update={"build_policy": ti.build_policy.model_copy(update={"clock": 86400})})
    with pytest.raises(ContractError) as said:
        verify_images(other, taskset, tmp_path / "store2", NoCacheImages(), log_dir_of(path))
    text = str(said.value)
    assert "answer-in-git-history" in text and "whose content is not the frozen image's" in text
    assert "/app/.git/objects/" in text and "/app/.git/refs/heads/" in text, text


def test_the_audit_holds_each_content_listing_to_the_digest_it_is_named_by(tmp_path):
    from types import SimpleNamespace

    from validate.audit.taskimages import check_listing
    from validate.taskdir.images.content import ContentDelta, delta_json

    digest = "sha256:" + "3" * 64
    good = content_file(tmp_path, digest)
    good.write_bytes(
        delta_json(
            ContentDelta(digest=digest, base="sha256:" + "0" * 64, changed={}, removed=[], packages={})
        )
    )
    r = SimpleNamespace(problems=[])
    check_listing(good, {digest}, r)
    assert r.problems == []
    check_listing(good, {"sha256:" + "4" * 64}, r)
    assert "do not name" in r.problems[-1]
    forged = content_file(tmp_path, "sha256:" + "4" * 64)
    forged.write_bytes(good.read_bytes())  # another image's listing under this one's name
    check_listing(forged, {"sha256:" + "4" * 64}, r)
    assert "is not the listing of the content it is named by" in r.problems[-1]


@pytest.mark.docker
def test_a_disk_budget_prunes_the_oldest_images_not_kept_and_logs_each(tmp_path):
    from validate.taskdir.images.budget import own_bytes, prune, task_image_usage
    from validate.taskdir.images.build import KEY_LABEL

    client = docker.from_env()
    base = client.images.get(DEFAULT_IMAGE).id  # the session's sandbox image: a named base
    made = []
    for n in range(3):  # three task images of 64 KiB each beyond their base, oldest first
        dockerfile = f"FROM {base}\nRUN head -c 65536 /dev/zero | tr '\\\\0' '{n}' > /blob\n"
        image, _ = client.images.build(
            fileobj=io.BytesIO(dockerfile.encode()),
            labels={KEY_LABEL: f"bench-{n}"},
            rm=True,
            network_mode="none",
        )
        made.append(image.id)
        time.sleep(1.1)  # distinct creation seconds: the order is the age
    assert all(own_bytes(client, i) >= 65536 for i in made)
    said: list[str] = []
    removed = prune(client, 150_000, keep={made[0]}, log=said.append, only=made)
    assert removed == [made[1]], removed  # the oldest not kept; then the total fits
    assert len(said) == 1 and made[1] in said[0] and "pruned" in said[0]
    left = {i for i, _, _ in task_image_usage(client)}
    assert made[0] in left and made[2] in left and made[1] not in left
    for image in (made[0], made[2]):
        client.images.remove(image, force=True)


@pytest.mark.parametrize("index", [["x"], [None], [1, {"Config": "c"}], {"Config": "x"}, "x"])
def test_an_archive_index_of_any_json_is_refused_with_a_clear_error(tmp_path, index):
    """The index is the user's file: any JSON in it is an error naming the archive, never a
    traceback (checked before docker reads anything)."""
    from validate.taskdir.images.transfer import IMAGE_ARCHIVE_INDEX, archive_images

    archive = tmp_path / "images.tar"
    data = json.dumps(index).encode()
    with tarfile.open(archive, "w") as out:
        member = tarfile.TarInfo(IMAGE_ARCHIVE_INDEX)
        member.size = len(data)
        out.addfile(member, io.BytesIO(data))
    with pytest.raises(ValidateError, match="images.tar: its index names an image without a config digest"):
        archive_images(archive)
