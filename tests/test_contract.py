"""Manifests: frozen, self-hashed, and refused on any mismatch with the field named."""

from __future__ import annotations

import gzip
import json
import os
import shutil

import pytest

from environment.protocol import LoadHints, canonical_json, sha256_tag
from tests.conftest import HINTS, ROOT, make_manifest
from validate.contract.manifest import load_manifest, verify, write_manifest
from validate.core.errors import ContractError, ProfileUnavailable
from validate.sandbox import open_sandbox


@pytest.fixture
def bwrap_manifest(sandboxes, tmp_path):
    m = make_manifest(sandboxes("bwrap"), idx=[3, 1, 2, 1], max_papers=2)
    return m, write_manifest(m, tmp_path / "m.json")


@pytest.mark.bwrap
def test_roundtrip_and_contents(bwrap_manifest, sandboxes):
    m, path = bwrap_manifest
    loaded = load_manifest(path)
    assert loaded == m and loaded.sha256 == m.content_sha256()
    assert loaded.selection.idx == [1, 2, 3]  # sorted, distinct
    assert [t.id.rsplit("/", 1)[1] for t in loaded.tasks] == ["1", "2", "3"]
    assert loaded.environment.name == "deshuffle-papers" and loaded.environment.revision.startswith("sha256:")
    assert loaded.execution.network == "none" and loaded.execution.dependency_policy == "none"
    roles = {n: a.role for n, a in loaded.expectations.agents.items()}
    assert roles["oracle"] == "oracle" and list(roles.values()).count("oracle") == 1
    assert {"empty", "shuffled", "identity", "reversed", "singletons", "malformed", "source-peek"} == \
        {n for n, r in roles.items() if r == "control"}
    assert all(a.program_sha256.startswith("sha256:") for a in loaded.expectations.agents.values())
    assert loaded.expectations.exception_rule == "strict" and len(loaded.salt) == 32
    raw = path.read_text()
    assert json.loads(raw) == json.loads(json.dumps(json.loads(raw), sort_keys=True))
    _, taskset = verify(loaded, sandboxes("bwrap"), HINTS)
    assert [taskset.task(e.idx).hash for e in loaded.tasks] == [e.hash for e in loaded.tasks]


@pytest.mark.bwrap
def test_task_ids_are_unique_per_config_variant(sandboxes):
    on = make_manifest(sandboxes("bwrap"), idx=[0], include_headers=True)
    off = make_manifest(sandboxes("bwrap"), idx=[0], include_headers=False)
    assert on.tasks[0].id != off.tasks[0].id and on.tasks[0].hash != off.tasks[0].hash


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
    ("backend_version", "bubblewrap 0.1.0"),
])
def test_changed_image_or_profile_is_refused(bwrap_manifest, sandboxes, field, value):
    m, _ = bwrap_manifest
    changed = m.model_copy(update={"execution": m.execution.model_copy(update={field: value})}).sealed()
    with pytest.raises(ContractError, match=f"execution.{field}"):
        verify(changed, sandboxes("bwrap"), HINTS)


@pytest.mark.bwrap
def test_an_isolation_record_is_sealed_only_when_present_and_checked(bwrap_manifest, sandboxes):
    """Contracts sealed before `isolation` existed keep their bytes; one that records it is
    refused by a backend that reports another (e.g. a runsc contract on runc)."""
    from validate.sandbox.base import Isolation

    m, _ = bwrap_manifest
    assert json.loads(m.to_json())["execution"]["isolation"]["rootless"] is True  # bwrap records its own
    bare = m.model_copy(update={"execution": m.execution.model_copy(update={"isolation": None})}).sealed()
    assert "isolation" not in json.loads(bare.to_json())["execution"]
    iso = Isolation(runtime="runsc", limit_enforcement={"memory_mb": "cgroup v1 memory.limit_in_bytes"})
    changed = m.model_copy(update={"execution": m.execution.model_copy(update={"isolation": iso})}).sealed()
    assert changed.sha256 != m.sha256
    assert json.loads(changed.to_json())["execution"]["isolation"]["runtime"] == "runsc"
    with pytest.raises(ContractError, match="execution.isolation"):
        verify(changed, sandboxes("bwrap"), HINTS)


@pytest.mark.bwrap
@pytest.mark.docker
def test_other_backend_is_refused(bwrap_manifest, sandboxes):
    m, _ = bwrap_manifest
    with pytest.raises(ContractError, match="execution.backend"):
        verify(m, sandboxes("docker"), HINTS)


def test_missing_image_is_refused_before_any_task():
    for backend in ("docker", "bwrap"):
        with pytest.raises(ProfileUnavailable, match="execution.image.*validate image build"):
            open_sandbox(backend, image="no-such-image:never").facts()


@pytest.mark.bwrap
def test_changed_corpus_is_refused(corpus_path, sandboxes, tmp_path):
    copy = tmp_path / "papers.jsonl.gz"
    shutil.copy(corpus_path, copy)
    m = make_manifest(sandboxes("bwrap"), idx=[0], corpus=str(copy))
    with gzip.open(copy, "rt") as fh:
        lines = fh.readlines()
    with gzip.open(copy, "wt") as fh:
        fh.writelines(lines[:-1])  # one paper fewer
    with pytest.raises(ContractError, match=r"environment.config.corpus: no corpus file with revision"):
        verify(m, sandboxes("bwrap"), LoadHints())


@pytest.mark.bwrap
def test_the_corpus_is_found_by_its_revision_not_the_working_directory(corpus_path, sandboxes, tmp_path,
                                                                         monkeypatch):
    empty = tmp_path / "no-data"
    empty.mkdir()
    monkeypatch.setenv("VALIDATE_DATA_DIR", str(empty))  # not a corpus a cache on this machine holds
    default = make_manifest(sandboxes("bwrap"), idx=[0], corpus=os.path.relpath(corpus_path, ROOT))
    monkeypatch.chdir(tmp_path)  # the relative path means nothing here ...
    verify(default, sandboxes("bwrap"), LoadHints())  # ... but it is found below the project's root
    m = make_manifest(sandboxes("bwrap"), idx=[0], corpus="data/papers.jsonl.gz")
    with pytest.raises(ContractError, match="--data PATH, or set VALIDATE_DATA_DIR"):  # names both ways
        verify(m, sandboxes("bwrap"), LoadHints())
    verify(m, sandboxes("bwrap"), LoadHints(search=(corpus_path.parent,)))  # a folder is searched by name
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(corpus_path, cache / "papers.jsonl.gz")
    monkeypatch.setenv("VALIDATE_DATA_DIR", str(cache))
    verify(m, sandboxes("bwrap"), LoadHints())


@pytest.mark.bwrap
def test_changed_task_hash_is_refused(bwrap_manifest, sandboxes):
    m, _ = bwrap_manifest
    tasks = [m.tasks[0].model_copy(update={"hash": "sha256:" + "1" * 64}), *m.tasks[1:]]
    from validate.contract.manifest import task_list_sha256

    forged = m.model_copy(update={"tasks": tasks, "task_list_sha256": task_list_sha256(tasks)}).sealed()
    with pytest.raises(ContractError, match=r"tasks\[0\].hash"):
        verify(forged, sandboxes("bwrap"), HINTS)


@pytest.mark.bwrap
def test_a_node_checks_each_task_it_is_handed_by_the_idx_it_asked_for(bwrap_manifest):
    # A worker rebuilt on a cluster node checks a task the first time it is handed it: the task
    # its taskset made for idx 2 must be the contract's entry of idx 2, not a task that says it
    # is another of the contract's tasks.
    from validate.contract.manifest import TaskCheck, check_environment

    m, _ = bwrap_manifest
    env, config, taskset = check_environment(m, HINTS)
    check = TaskCheck(m, env, config)
    check(2, taskset.task(2))  # the contract's own
    with pytest.raises(ContractError, match=r"tasks\[\d\]\.idx .*the manifest says 2 but this machine has 3"):
        check(2, taskset.task(3))
    with pytest.raises(ContractError, match="the contract has no task of idx 7"):
        check(7, taskset.task(7))


@pytest.mark.bwrap
def test_a_changed_agent_program_is_refused(bwrap_manifest, sandboxes):
    m, _ = bwrap_manifest
    agents = dict(m.expectations.agents)
    agents["oracle"] = agents["oracle"].model_copy(update={"program_sha256": "sha256:" + "2" * 64})
    forged = m.model_copy(
        update={"expectations": m.expectations.model_copy(update={"agents": agents})}
    ).sealed()
    with pytest.raises(ContractError, match="expectations.agents.oracle.program_sha256"):
        verify(forged, sandboxes("bwrap"), HINTS)


def test_unreadable_and_hostile_manifests(tmp_path):
    with pytest.raises(ContractError, match="not found"):
        load_manifest(tmp_path / "none.json")
    cases = {"bad.json": b"{", "utf8.json": b'{"name": "\xff"}', "deep.json": b"[" * 100_000 + b"]" * 100_000,
             "bigint.json": b'{"min_task_count": ' + b"9" * 5000 + b"}"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ContractError, match=f"{name}: not a readable JSON manifest"):
            load_manifest(tmp_path / name)
    (tmp_path / "partial.json").write_text('{"name": "x"}')
    with pytest.raises(ContractError, match="field '"):
        load_manifest(tmp_path / "partial.json")


@pytest.mark.bwrap
def test_a_resealed_manifest_with_a_negative_idx_is_refused(bwrap_manifest, tmp_path):
    m, _ = bwrap_manifest
    raw = json.loads(m.to_json())
    raw["tasks"][0]["idx"] = raw["selection"]["idx"][0] = -1
    raw["sha256"] = sha256_tag(canonical_json({k: v for k, v in raw.items() if k != "sha256"}))
    (tmp_path / "neg.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="tasks.0.idx"):
        load_manifest(tmp_path / "neg.json")


@pytest.mark.bwrap
def test_config_errors_name_the_field(sandboxes):
    with pytest.raises(ContractError, match="environment.config.source"):
        make_manifest(sandboxes("bwrap"), idx=[0], source="nature")
    with pytest.raises(ContractError, match="selection.idx: task -1"):
        make_manifest(sandboxes("bwrap"), idx=[-1, 2])


@pytest.mark.bwrap
def test_another_machines_image_names_the_packages_that_differ(bwrap_manifest, sandboxes):
    m, _ = bwrap_manifest
    assert m.execution.packages and m.execution.python and m.execution.tree_digest
    packages = dict(m.execution.packages)
    name = sorted(packages)[0]
    packages[name] = packages[name] + "+other"
    packages["made-up-package"] = "1.0"
    forged = m.model_copy(
        update={"execution": m.execution.model_copy(update={"packages": packages})}
    ).sealed()
    with pytest.raises(ContractError, match=rf"execution.packages:.*{name}.*made-up-package"):
        verify(forged, sandboxes("bwrap"), HINTS)


@pytest.mark.bwrap
def test_oracle_repeats_are_sealed_only_when_more_than_one(bwrap_manifest, tmp_path):
    """One repeat (every contract sealed before the field) is not written, so those contracts
    keep their bytes and hash; more is sealed, read back, and refused when not a whole number ≥ 1."""
    m, path = bwrap_manifest
    assert m.expectations.oracle_repeats == 1 and b"oracle_repeats" not in path.read_bytes()
    three = m.model_copy(
        update={"expectations": m.expectations.model_copy(update={"oracle_repeats": 3})}
    ).sealed()
    assert three.sha256 != m.sha256 and b'"oracle_repeats": 3' in three.to_json()
    assert load_manifest(write_manifest(three, tmp_path / "three.json")) == three
    for bad in (0, -1, 1.5, True, "3"):
        raw = json.loads(three.to_json())
        raw["expectations"]["oracle_repeats"] = bad
        raw["sha256"] = sha256_tag(canonical_json({k: v for k, v in raw.items() if k != "sha256"}))
        (tmp_path / "bad.json").write_text(json.dumps(raw))
        with pytest.raises(ContractError, match="oracle_repeats"):
            load_manifest(tmp_path / "bad.json")
