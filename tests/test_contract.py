"""Manifests: frozen, self-hashed, and refused on any mismatch with the field named."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from validate.contract import build_taskset, load_manifest, verify, write_manifest
from validate.errors import ContractError, ProfileUnavailable
from validate.sandbox import open_sandbox
from tests.conftest import make_manifest


@pytest.fixture
def bwrap_manifest(corpus, corpus_path, sandboxes, tmp_path):
    m = make_manifest(corpus, corpus_path, sandboxes("bwrap"), idx=[3, 1, 2, 1], max_papers=2)
    return m, write_manifest(m, tmp_path / "m.json")


@pytest.mark.bwrap
def test_roundtrip_and_contents(bwrap_manifest, sandboxes):
    m, path = bwrap_manifest
    loaded = load_manifest(path)
    assert loaded == m and loaded.sha256 == m.content_sha256()
    assert loaded.selection.idx == [1, 2, 3]  # sorted, distinct
    assert [t.id for t in loaded.tasks] == ["deshuffle:1:0", "deshuffle:2:0", "deshuffle:3:0"]
    assert loaded.execution.network == "none" and loaded.execution.dependency_policy == "none"
    assert loaded.expectations.agents()[0] == "oracle" and len(loaded.expectations.agents()) == 7
    assert loaded.git_commit and loaded.harness_version
    raw = path.read_text()
    assert json.loads(raw) == json.loads(json.dumps(json.loads(raw), sort_keys=True))
    taskset = verify(loaded, sandboxes("bwrap"))
    assert [taskset.task(e.idx).hash for e in loaded.tasks] == [e.hash for e in loaded.tasks]


@pytest.mark.bwrap
def test_edited_manifest_is_refused(bwrap_manifest):
    _, path = bwrap_manifest
    raw = json.loads(path.read_text())
    raw["min_task_count"] = 0
    path.write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="field 'sha256'"):
        load_manifest(path)


@pytest.mark.bwrap
@pytest.mark.parametrize("field,value", [
    ("image_digest", "sha256:" + "0" * 64),
    ("architecture", "riscv64"),
    ("image", "someone-else:latest"),
])
def test_changed_image_or_profile_is_refused(bwrap_manifest, sandboxes, field, value):
    m, _ = bwrap_manifest
    changed = m.model_copy(update={"execution": m.execution.model_copy(update={field: value})}).sealed()
    with pytest.raises(ContractError, match=f"execution.{field}"):
        verify(changed, sandboxes("bwrap"))


@pytest.mark.bwrap
@pytest.mark.docker
def test_other_backend_is_refused(bwrap_manifest, sandboxes):
    m, _ = bwrap_manifest
    with pytest.raises(ContractError, match="execution.backend"):
        verify(m, sandboxes("docker"))


def test_missing_image_is_refused_before_any_task():
    for backend in ("docker", "bwrap"):
        with pytest.raises(ProfileUnavailable, match="execution.image.*validate image build"):
            open_sandbox(backend, image="no-such-image:never").facts()


@pytest.mark.bwrap
def test_changed_corpus_is_refused(corpus, corpus_path, sandboxes, tmp_path):
    copy = tmp_path / "papers.jsonl.gz"
    shutil.copy(corpus_path, copy)
    from environment.deshuffle import Corpus

    local = Corpus.from_path(copy)
    m = make_manifest(local, copy, sandboxes("bwrap"), idx=[0])
    with gzip.open(copy, "rt") as fh:
        lines = fh.readlines()
    with gzip.open(copy, "wt") as fh:
        fh.writelines(lines[:-1])  # one paper fewer
    with pytest.raises(ContractError, match="environment.corpus.revision"):
        verify(m, sandboxes("bwrap"))


@pytest.mark.bwrap
def test_changed_task_hash_is_refused(bwrap_manifest, sandboxes):
    m, _ = bwrap_manifest
    tasks = [m.tasks[0].model_copy(update={"hash": "sha256:" + "1" * 64}), *m.tasks[1:]]
    with pytest.raises(ContractError, match=r"tasks\[0\].hash \(deshuffle:1:0\)"):
        verify(m.model_copy(update={"tasks": tasks}).sealed(), sandboxes("bwrap"))


def test_unreadable_manifests(tmp_path):
    with pytest.raises(ContractError, match="not found"):
        load_manifest(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ContractError, match="not a readable JSON"):
        load_manifest(tmp_path / "bad.json")
    (tmp_path / "partial.json").write_text('{"name": "x"}')
    with pytest.raises(ContractError, match="field '"):
        load_manifest(tmp_path / "partial.json")


@pytest.mark.bwrap
def test_taskset_config_error_names_the_field(corpus, bwrap_manifest):
    m, _ = bwrap_manifest
    env = m.environment.model_copy(update={"config": m.environment.config.model_copy(update={"source": "nature"})})
    with pytest.raises(ContractError, match="environment.config.source"):
        build_taskset(env, corpus)
