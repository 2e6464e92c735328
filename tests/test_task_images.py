"""Per-task images (`validate.taskdir.images`) built for real: the bases made with mmdebstrap and
imported into the suite's own dockerd (once per session), the sample dataset's tasks built
with the legacy builder, the outcomes read back from the daemon. Nothing is mocked; the
one wrapper (`CountingImages`) only counts the real backend's builds.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import time
from pathlib import Path

import pytest

from environment.harbor.taskdir import HarborTask, load_dataset
from validate.core.paths import task_image_store
from validate.core.records import INVALID_TASK_OR_VERIFIER, UNSUPPORTED_CONTRACT
from validate.sandbox.image import tarball_digests
from validate.taskdir.images.basemap import DEBIAN_BOOKWORM_SLIM, BaseImageMap
from validate.taskdir.images.bases import build_base_map, build_tarball
from validate.taskdir.images.build import (
    KEY_LABEL,
    TaskImage,
    TaskImageRefusal,
    build_task_image,
    context_digest,
    resolve_bases,
)
from validate.taskdir.images.docker import BASE_REPOSITORY, DockerImages
from validate.taskdir.images.dockerfile import DockerfileError, Unresolvable, external_images, rewrite

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples/harbor-sample"
PYTHON, DEBIAN = "python-3.11-slim-bookworm", "debian-bookworm-slim"


class CountingImages(DockerImages):
    """The docker backend, counting the builds it is asked for (a cached image asks none)."""

    def __init__(self) -> None:
        super().__init__()
        self.builds = 0

    def build(self, *args, **kwargs):
        self.builds += 1
        return super().build(*args, **kwargs)


# --- the Dockerfile rewrite (no docker) ------------------------------------------------------

def test_every_external_image_is_found_and_only_those_are_rewritten():
    text = ("# syntax=docker/dockerfile:1\n"
            "FROM --platform=linux/amd64 python:3.11-slim AS build\n"
            "RUN echo one \\\n"
            "  # a comment inside the continuation\n"
            "  two\n"
            "FROM build AS test\n"
            "COPY --from=build /a /a\n"
            "COPY --from=0 /b /b\n"
            "COPY --from=debian:bookworm-slim /etc/os-release /c\n"
            "FROM \\\n  debian:bookworm-slim\n"
            "FROM scratch\n")
    _, refs = external_images(text)
    assert [(r.image, r.kind) for r in refs] == [
        ("python:3.11-slim", "from"),
        ("debian:bookworm-slim", "copy-from"),
        ("debian:bookworm-slim", "from"),
    ]
    new, diff = rewrite(text, {"python:3.11-slim": "sha256:aaa", "debian:bookworm-slim": "sha256:bbb"})
    assert new.splitlines() == [
        "# syntax=docker/dockerfile:1",
        "FROM --platform=linux/amd64 sha256:aaa AS build",
        "RUN echo one \\",
        "  # a comment inside the continuation",
        "  two",
        "FROM build AS test",
        "COPY --from=build /a /a",
        "COPY --from=0 /b /b",
        "COPY --from=sha256:bbb /etc/os-release /c",
        "FROM sha256:bbb",
        "FROM scratch",
    ]
    assert "-FROM --platform=linux/amd64 python:3.11-slim AS build\n" in diff
    assert "+FROM --platform=linux/amd64 sha256:aaa AS build\n" in diff
    assert diff.startswith("--- a/environment/Dockerfile\n+++ b/environment/Dockerfile\n")


def test_an_escape_directive_changes_the_continuation():
    text = "# escape=`\nFROM `\n  python:3.11-slim-bookworm\nRUN dir c:\\\n"
    new, _ = rewrite(text, {"python:3.11-slim-bookworm": "sha256:aaa"})
    assert new == "# escape=`\nFROM sha256:aaa\nRUN dir c:\\\n"


@pytest.mark.parametrize("text, error, words", [
    ("ARG BASE=python:3.11-slim\nFROM ${BASE}\n", Unresolvable, "made by ARG"),
    ("RUN true\n", DockerfileError, "no FROM"),
    ("FROM\n", DockerfileError, "names no image"),
])
def test_a_dockerfile_that_cannot_be_resolved_says_why(text, error, words):
    with pytest.raises(error, match=words):
        external_images(text)


def test_the_context_digest_covers_content_and_modes_not_mtimes(tmp_path):
    ctx = tmp_path / "environment"
    shutil.copytree(SAMPLE / "c-fix-build/environment", ctx)
    first = context_digest(ctx)
    (ctx / "Makefile").touch()
    assert context_digest(ctx) == first
    (ctx / "Makefile").chmod(0o755)
    assert context_digest(ctx) != first
    (ctx / "Makefile").chmod(0o644)
    (ctx / "src/median.c").write_text((ctx / "src/median.c").read_text() + "\n")
    assert context_digest(ctx) != first


# --- the bases (built once per session) ------------------------------------------------------

@pytest.fixture(scope="session")
def images():
    backend = CountingImages()
    yield backend
    backend.client.close()


@pytest.fixture(scope="session")
def base_store():
    """The image store's own bases (``$VALIDATE_IMAGE_DIR/task-images/bases``, fresh in CI): what
    the trial attempt kind builds and uses, so a session builds them once (tests/test_harbor_run.py)."""
    return task_image_store() / "bases"


@pytest.fixture(scope="session")
def base_map(images, base_store) -> BaseImageMap:
    return build_base_map(images, base_store, log=lambda _msg: None)


@pytest.fixture(scope="session")
def task_store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("task-images")


def _task(name: str) -> HarborTask:
    dataset = load_dataset(SAMPLE)
    return next(t for t in dataset.tasks if t.id == name)


def _build(name: str, base_map, images, store, task_dir: Path | None = None):
    task = _task(name)
    return build_task_image(task_dir or SAMPLE / name, base_map, images, store,
                            build_timeout_s=task.config.environment.build_timeout_sec)


def _run(images, image_id: str, script: str) -> str:
    out = images.client.containers.run(image_id, ["sh", "-c", script], network_mode="none", remove=True,
                                       stderr=True)
    return out.decode()


@pytest.mark.docker
def test_the_map_serves_the_bases_by_layer_digest_and_records_each_substitution(base_map, base_store, images):
    for name, base in base_map.bases.items():
        assert tarball_digests(base_store / name / "rootfs.tar")[0] == base.layer
        assert images.image_layers(base.image_id) == [base.layer]
        assert any(line.startswith("deb ") and " bookworm " in line for line in base.apt_sources)
    assert base_map.bases[PYTHON].python.startswith("3.11.") and base_map.bases[DEBIAN].python is None
    assert BaseImageMap.model_validate_json((base_store / "base-map.json").read_bytes()) == base_map
    exact = base_map.resolve("python:3.11-slim-bookworm")
    assert exact.recipe == PYTHON and exact.differences == base_map.bases[PYTHON].recipe.differences
    newer = base_map.resolve("python:3.12-slim")
    assert newer.recipe == PYTHON and any("Python 3.11 is served where the task asks for Python 3.12" in d
                                          for d in newer.differences)
    pinned = base_map.resolve("library/debian:bookworm-slim@sha256:" + "0" * 64)
    assert pinned.recipe == DEBIAN and any(
        "pins the upstream image sha256:000" in d for d in pinned.differences
    )
    assert base_map.resolve("ubuntu:24.04") is None and base_map.resolve("python:3.11") is None
    # A second map reuses the tarballs and the imported images: no mmdebstrap, no import.
    mtimes = {n: (base_store / n / "rootfs.tar").stat().st_mtime_ns for n in base_map.bases}
    assert build_base_map(images, base_store, log=lambda _msg: None) == base_map
    assert {n: (base_store / n / "rootfs.tar").stat().st_mtime_ns for n in base_map.bases} == mtimes


@pytest.mark.docker
def test_no_upstream_name_is_tagged_in_the_daemon(base_map, images):
    tags = [tag for image in images.client.images.list() for tag in image.tags]
    assert f"{BASE_REPOSITORY}:{PYTHON}-v1" in tags and f"{BASE_REPOSITORY}:{DEBIAN}-v1" in tags
    assert not [t for t in tags if t.split(":")[0] in ("python", "debian", "ubuntu")], tags


@pytest.fixture(scope="session")
def csv_image(base_map, images, task_store) -> TaskImage:
    return _build("csv-to-json", base_map, images, task_store)


@pytest.mark.docker
def test_a_python_task_image_behaves_like_the_upstream_slim_image(csv_image, base_map, images):
    assert isinstance(csv_image, TaskImage), csv_image
    assert csv_image.layers[0] == base_map.bases[PYTHON].layer
    assert "-FROM python:3.11-slim-bookworm\n" in csv_image.patch
    assert f"+FROM {base_map.bases[PYTHON].image_id}\n" in csv_image.patch
    assert [b.upstream for b in csv_image.bases] == ["python:3.11-slim-bookworm"]
    assert csv_image.policy.network == "host"
    assert images.image_labels(csv_image.image_id)[KEY_LABEL] == csv_image.key
    out = _run(
        images,
        csv_image.image_id,
        (
            "set -e; python --version; python3 --version; pip --version; "
            "test -s /etc/ssl/certs/ca-certificates.crt; "
            "python3 -c 'import sysconfig, os; "
            "m = os.path.join(sysconfig.get_path(\"stdlib\"), \"EXTERNALLY-MANAGED\");"
            " print(\"marker\", os.path.exists(m))'; "
            "pip install --no-index --no-deps --force-reinstall /usr/share/python-wheels/pip-*.whl "
            ">/dev/null; "
            "echo pip-install-ok; apt-get --version | head -n1; cat /app/people.csv | head -n1"
        ),
    )
    assert "Python 3.11." in out and "pip " in out and "marker False" in out and "pip-install-ok" in out, out
    assert "apt " in out and "externally-managed" not in out, out


@pytest.fixture(scope="session")
def c_build(base_map, images, task_store) -> tuple[TaskImage, int]:
    before = images.builds
    return _build("c-fix-build", base_map, images, task_store), images.builds - before


@pytest.mark.docker
def test_a_task_that_apt_installs_builds_through_the_host_network(c_build, base_map, images):
    result, builds = c_build
    assert isinstance(result, TaskImage) and builds == 1, result
    assert result.layers[0] == base_map.bases[DEBIAN].layer and len(result.layers) > 1
    log = Path(result.log).read_text()
    assert "Setting up gcc" in log and "# build done" in log
    out = _run(images, result.image_id, "gcc --version | head -n1; make --version | head -n1; ls /app/src")
    assert "gcc" in out and "GNU Make" in out and "median.c" in out, out


@pytest.mark.docker
def test_a_second_build_of_the_same_content_rebuilds_nothing(c_build, base_map, images, task_store, tmp_path):
    first, _ = c_build
    log = Path(first.log)
    log_state = (log.stat().st_ino, log.stat().st_mtime_ns, log.read_bytes())
    daemon_images = {i.id for i in images.client.images.list(all=True)}
    builds = images.builds
    # The same content in another place, every mtime changed: the same key.
    copy = tmp_path / "c-fix-build"
    shutil.copytree(SAMPLE / "c-fix-build", copy)
    for path in copy.rglob("*"):
        path.touch()
    for task_dir in (SAMPLE / "c-fix-build", copy):
        again = _build("c-fix-build", base_map, images, task_store, task_dir)
        assert again.cached and again.image_id == first.image_id and again.key == first.key
    assert images.builds == builds
    assert (log.stat().st_ino, log.stat().st_mtime_ns, log.read_bytes()) == log_state
    assert {i.id for i in images.client.images.list(all=True)} == daemon_images
    # Changed content is another image.
    (copy / "environment/src/median.c").write_text((copy / "environment/src/median.c").read_text() + "\n")
    changed = _build("c-fix-build", base_map, images, task_store, copy)
    assert isinstance(changed, TaskImage) and not changed.cached and changed.key != first.key
    assert changed.image_id != first.image_id and images.builds == builds + 1


@pytest.mark.docker
def test_a_newer_python_is_served_by_the_older_one_with_the_difference_recorded(base_map, images, task_store,
                                                                                tmp_path):
    task = tmp_path / "task"
    (task / "environment").mkdir(parents=True)
    (task / "environment/Dockerfile").write_text("FROM python:3.12-slim AS base\nFROM base\nWORKDIR /app\n")
    result = build_task_image(task, base_map, images, task_store)
    assert isinstance(result, TaskImage), result
    assert [(b.upstream, b.recipe, b.substitution.upstream) for b in result.bases] == [
        ("python:3.12-slim", PYTHON, "python:3.12-slim*")]
    assert "Python 3.11 is served where the task asks for Python 3.12: code needing 3.12 features fails" in \
        result.bases[0].differences
    assert (
        f"+FROM {base_map.bases[PYTHON].image_id} AS base\n" in result.patch
        and "+FROM base" not in result.patch
    )
    assert result.layers[0] == base_map.bases[PYTHON].layer


@pytest.mark.docker
def test_an_unmapped_base_is_unsupported_and_nothing_is_built(base_map, images, task_store):
    builds = images.builds
    result = _build("unmapped-base", base_map, images, task_store)
    assert result == TaskImageRefusal(reason=UNSUPPORTED_CONTRACT,
                                      detail="ubuntu:24.04 is not available on this profile")
    assert images.builds == builds


@pytest.mark.docker
def test_a_copy_outside_the_context_is_an_invalid_task_with_the_log_tail(base_map, images, task_store):
    result = _build("copy-outside-context", base_map, images, task_store)
    assert isinstance(result, TaskImageRefusal) and result.reason == INVALID_TASK_OR_VERIFIER, result
    assert "forbidden path outside the build context: ../data/numbers.txt" in result.detail
    assert "forbidden path outside the build context" in result.log_tail
    assert result.log_tail == Path(result.log).read_text()[-len(result.log_tail):]


@pytest.mark.docker
@pytest.mark.parametrize("body, words", [
    ("FROBNICATE now\n", "unknown instruction: FROBNICATE"),
    ("RUN echo about to fail && exit 3\n", "returned a non-zero code: 3"),
])
def test_a_failing_dockerfile_is_an_invalid_task(body, words, base_map, images, task_store, tmp_path):
    task = tmp_path / "task"
    (task / "environment").mkdir(parents=True)
    (task / "environment/Dockerfile").write_text(f"FROM python:3.11-slim-bookworm\n{body}")
    result = build_task_image(task, base_map, images, task_store)
    assert isinstance(result, TaskImageRefusal) and result.reason == INVALID_TASK_OR_VERIFIER, result
    assert words.lower() in result.detail.lower() and words.lower() in result.log_tail.lower()


@pytest.mark.docker
def test_a_build_over_its_timeout_is_an_invalid_task_and_leaves_no_container(base_map, images, task_store,
                                                                             tmp_path):
    task = tmp_path / "task"
    (task / "environment").mkdir(parents=True)
    (task / "environment/Dockerfile").write_text("FROM debian:bookworm-slim\nRUN sleep 61\n")
    result = build_task_image(task, base_map, images, task_store, build_timeout_s=2)
    assert isinstance(result, TaskImageRefusal) and result.reason == INVALID_TASK_OR_VERIFIER, result
    assert "exceeded its timeout of 2 s" in result.detail and ": RUN sleep 61\n" in result.log_tail

    def sleepers():
        return [c for c in images.client.containers.list(all=True)
                if "sleep 61" in " ".join(c.attrs["Config"].get("Cmd") or [])]

    deadline = time.monotonic() + 30
    while sleepers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not sleepers(), "the cancelled build left its container behind"


@pytest.mark.docker
def test_every_sample_task_resolves_as_its_label_says(base_map):
    dataset = load_dataset(SAMPLE)
    refused = {}
    for task in dataset.tasks:
        if task.environment == "dockerfile":
            resolved = resolve_bases(SAMPLE / task.id / "environment", base_map)
            if isinstance(resolved, TaskImageRefusal):
                refused[task.id] = resolved.detail
            else:
                assert [b.upstream for b in resolved[1]] == task.base_images, task.id
    assert refused == {"unmapped-base": "ubuntu:24.04 is not available on this profile"}
    # a separate verifier's tests/Dockerfile resolves through the same map
    verifier = resolve_bases(SAMPLE / "separate-verifier" / "tests", base_map)
    assert [b.upstream for b in verifier[1]] == ["python:3.11-slim-bookworm"]
    assert resolve_bases(SAMPLE / "csv-to-json" / "tests", base_map).detail == \
        "tests/Dockerfile: missing; this profile builds only Dockerfile environments"


@pytest.mark.docker
@pytest.mark.slow
def test_a_base_built_again_is_the_same_layer(base_map, tmp_path):
    """The smallest recipe once more, from the same archive: the same bytes, so the same layer."""
    _, again = build_tarball(DEBIAN_BOOKWORM_SLIM, tmp_path, log=lambda _msg: None)
    assert again.packages == base_map.bases[DEBIAN].packages
    assert (
        again.layer == base_map.bases[DEBIAN].layer
        and again.tree_digest == base_map.bases[DEBIAN].tree_digest
    )


@pytest.mark.docker
@pytest.mark.parametrize("ignore", [None, b"# the task's own\nsecret.txt\n", b"*\n!Dockerfile\n!keep.txt"])
def test_copy_of_the_context_holds_the_tasks_dockerfile_never_this_machines_rewrite(ignore, base_map, images,
                                                                                     task_store, tmp_path):
    """A ``COPY .`` copies the task's Dockerfile as written: the rewrite (this machine's base
    image id) is read by the daemon, never copied, so the image's content is the same on every
    machine. A task's own ``.dockerignore`` keeps excluding what it excludes."""
    task = tmp_path / "task"
    (task / "environment").mkdir(parents=True)
    dockerfile = b"FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY . /app/\n"
    (task / "environment/Dockerfile").write_bytes(dockerfile)
    (task / "environment/keep.txt").write_text("kept\n")
    (task / "environment/secret.txt").write_text("answer\n")
    if ignore is not None:
        (task / "environment/.dockerignore").write_bytes(ignore)
    result = build_task_image(task, base_map, images, task_store)
    assert isinstance(result, TaskImage), result
    listing = _run(images, result.image_id, "cd /app && ls -A | sort && sha256sum Dockerfile").split()
    assert "Dockerfile" in listing and "keep.txt" in listing and ".validate-build.Dockerfile" not in listing
    assert hashlib.sha256(dockerfile).hexdigest() in listing  # the task's bytes, no base image id
    assert ("secret.txt" in listing) == (ignore is None)
    assert (".dockerignore" in listing) == (
        ignore is not None and b"*" not in ignore
    )  # as docker's client sends it


@pytest.mark.docker
def test_a_task_copying_its_context_has_one_content_over_another_machines_base_id(
    base_map, images, task_store
):
    """Another machine imports the same base under another id (a docker image id hashes its
    configuration's times): the sample's answer-in-image, which copies its whole context,
    has the same content digest over either id."""
    from validate.taskdir.images.content import image_content

    here = _build("answer-in-image", base_map, images, task_store)
    assert isinstance(here, TaskImage), here
    [(name, base)] = [(n, b) for n, b in base_map.bases.items() if b.recipe.name == here.bases[0].recipe]
    other, _ = images.client.images.build(
        fileobj=io.BytesIO(f"FROM {base.image_id}\nLABEL other=machine\n".encode()),
        rm=True,
        network_mode="none",
    )
    assert other.id != base.image_id and other.attrs["RootFS"]["Layers"] == [base.layer]
    elsewhere = base_map.model_copy(update={"bases": {**base_map.bases,
                                                      name: base.model_copy(update={"image_id": other.id})}})
    there = _build("answer-in-image", elsewhere, images, task_store)
    assert isinstance(there, TaskImage) and there.image_id != here.image_id, there
    assert (
        image_content(images.client, there.image_id).digest
        == image_content(images.client, here.image_id).digest
    )
