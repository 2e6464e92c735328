"""The offline base-image map's coverage (`validate.taskdir.images.basemap`, `.bases`): Debian
trixie's Python 3.13 built the same reproducible way, the full (non-slim) python images,
references written through a Docker Hub mirror or pinned by digest (normalised; the mirror
and the unmatched digest recorded with the substitution); and a published task with only an
Apptainer image (`sif_image`), which is unsupported here, naming Apptainer."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environment.harbor.env import HarborEnvironment
from environment.harbor.published import pack_task
from validate.core.paths import task_image_store
from validate.taskdir.images.basemap import CORE, SUBSTITUTIONS, split_reference
from validate.taskdir.images.bases import build_base_map, needed_recipes
from validate.taskdir.images.build import TaskImage, build_task_image
from validate.taskdir.images.docker import DockerImages
from validate.taskdir.images.frozen import apptainer_only, freeze_images

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("ref, want", [
    ("python:3.13-slim", ("python:3.13-slim", None, None)),
    ("docker.io/library/debian:bookworm-slim", ("debian:bookworm-slim", None, None)),
    (f"mirror.gcr.io/library/python:3.13-slim@{DIGEST}", ("python:3.13-slim", DIGEST, "mirror.gcr.io")),
    ("public.ecr.aws/docker/library/python:3.11-bookworm",
     ("python:3.11-bookworm", None, "public.ecr.aws/docker")),
    ("registry.example.com:5000/hub/library/python:3.13",
     ("python:3.13", None, "registry.example.com:5000/hub")),
    ("ghcr.io/some-org/swe-image:abc", ("ghcr.io/some-org/swe-image:abc", None, None)),
    ("python", ("python:latest", None, None)),
])
def test_references_are_normalised_with_the_mirror_and_digest_kept_apart(ref, want):
    assert split_reference(ref) == want


@pytest.mark.parametrize("ref, recipe", [
    ("python:3.13-slim", "python-3.13-slim-trixie"), ("python:3.13-slim-bookworm", "python-3.13-slim-trixie"),
    ("python:3.11-bookworm", "python-3.11-bookworm"), ("python:3.11", "python-3.11-bookworm"),
    ("python:3.12-bookworm", "python-3.11-bookworm"), ("python:3.13-bookworm", "python-3.13-trixie"),
    ("python:3.13", "python-3.13-trixie"), ("debian:trixie-slim", "debian-trixie-slim"),
    ("python:3.11-slim", "python-3.11-slim-bookworm"), (f"mirror.gcr.io/library/python:3.13-slim@{DIGEST}",
                                                        "python-3.13-slim-trixie"),
])
def test_each_upstream_reference_is_served_by_its_recipe(ref, recipe):
    assert needed_recipes([ref]) == {recipe}
    sub = next(s for s in SUBSTITUTIONS if s.matches(split_reference(ref)[0]))
    assert sub.recipe == recipe and sub.version >= 1


def _sif_row(tmp_path: Path) -> Path:
    """A published row whose task has no Dockerfile, only an Apptainer image."""
    task = tmp_path / "src" / "sif-only"
    for sub in ("solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = 60\n")
    (task / "instruction.md").write_text("Do it.\n")
    (task / "tests/test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (task / "solution/solve.sh").write_text("#!/bin/bash\ntrue\n")
    out = tmp_path / "ds.parquet"
    pq.write_table(pa.table({"path": ["sif-only", "csv-to-json"],
                             "task_binary": [pack_task(task), pack_task(SAMPLE / "csv-to-json")],
                             "sif_image": ["images/sif-only.sif", "images/csv.sif"]}), out)
    return out


def test_a_task_with_only_an_apptainer_image_loads_and_is_unsupported_naming_apptainer(tmp_path):
    env = HarborEnvironment()
    ts = env.load(env.Config(dataset=str(_sif_row(tmp_path))))
    tasks = {ts.task(i).id: ts.task(i) for i in range(ts.size)}
    sif = tasks["sif-only"].parsed
    assert sif is not None and sif.environment == "none" and sif.sif_image == "images/sif-only.sif"
    assert "Apptainer" in apptainer_only(sif) and "images/sif-only.sif" in apptainer_only(sif)
    assert (
        tasks["csv-to-json"].parsed.sif_image == "images/csv.sif"
        and apptainer_only(tasks["csv-to-json"].parsed) is None
    )
    assert tasks["sif-only"].meta["row.sif_image"] == "images/sif-only.sif"


@pytest.mark.docker
def test_freeze_refuses_the_apptainer_only_task_before_building(tmp_path):
    env = HarborEnvironment()
    ts = env.load(env.Config(dataset=str(_sif_row(tmp_path))))
    idx = [i for i in range(ts.size) if ts.task(i).id == "sif-only"]
    frozen = freeze_images(ts, idx, "docker", tmp_path / "logs", task_image_store(), log=lambda m: None)
    entry = frozen.tasks["sif-only"]
    assert entry.refusal == "unsupported_execution_contract" and "Apptainer" in entry.detail
    assert set(frozen.base_map.bases) == {r.name for r in CORE}  # no base beyond the core was built for it


@pytest.mark.docker
@pytest.mark.slow
def test_python_313_from_trixie_serves_a_mirrored_pinned_reference(tmp_path):
    images = DockerImages()
    base_map = build_base_map(images, task_image_store() / "bases", log=lambda m: None,
                              needed={"python-3.13-slim-trixie"})
    base = base_map.bases["python-3.13-slim-trixie"]
    assert base.python.startswith("3.13.") and any("trixie" in line for line in base.apt_sources)
    task = tmp_path / "t"
    (task / "environment").mkdir(parents=True)
    ref = f"mirror.gcr.io/library/python:3.13-slim@{DIGEST}"
    (task / "environment/Dockerfile").write_text(
        f"FROM {ref}\nRUN python -c 'import sys; assert sys.version_info[:2] == (3, 13), sys.version'\n")
    built = build_task_image(task, base_map, images, tmp_path / "store")
    assert isinstance(built, TaskImage), built
    (resolved,) = built.bases
    assert (resolved.reference, resolved.pinned, resolved.mirror) == ("python:3.13-slim", DIGEST,
                                                                      "mirror.gcr.io")
    assert any(DIGEST in d for d in resolved.differences) and any("mirror.gcr.io" in d
                                                                  for d in resolved.differences)
    assert f"-FROM {ref}" in built.patch and f"+FROM {base.image_id}" in built.patch
