"""Harbor datasets as they are published (`environment.harbor.published`, `.unpack`, `.hub`):
Parquet rows holding each task packed, written here in that shape from the sample dataset;
hostile rows (traversal, links out, devices, bombs, bad paths) refused by name, never a crash
and never a write outside the private directory; ``hf://`` read through the real
huggingface_hub from a cache laid out as the library lays it out, offline."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environment.harbor.env import HarborEnvironment
from environment.harbor.published import pack_task, write_published
from environment.harbor.taskdir import Limits, load_dataset
from environment.harbor.unpack import ArchiveProblem, unpack_archive
from environment.protocol import ConfigError, LoadHints

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
SOUND = ("csv-to-json", "edit-config", "unicode-names", "answer-in-git-history")
ENV = HarborEnvironment()


def _hashes(taskset) -> dict[str, str]:
    return {taskset.task(i).id: taskset.task(i).hash for i in range(taskset.size)}


def _sample_rows(ids=SOUND) -> dict[str, list]:
    return {"path": list(ids), "task_binary": [pack_task(SAMPLE / t) for t in ids]}


def _write(path: Path, columns: dict[str, list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def _tar(*members: tuple[tarfile.TarInfo, bytes | None], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _entry(name: str, kind: bytes, link: str = "", size: int = 0) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size
    return info, None


def test_the_published_shape_loads_as_the_directory_does_ids_hashes_and_row_columns(tmp_path):
    every = sorted(p.name for p in SAMPLE.iterdir() if p.is_dir())
    ds = load_dataset(SAMPLE)
    write_published(SAMPLE, every, tmp_path / "pub/data/train-00000-of-00001.parquet",
                    {t.id: t.instruction for t in ds.tasks}, {"csv-to-json": {"row.sif_image": "csv.sif"}})
    published = ENV.load(ENV.Config(dataset=str(tmp_path / "pub")))
    directory = ENV.load(ENV.Config(dataset=str(SAMPLE)))
    assert _hashes(published) == _hashes(directory) and len(_hashes(published)) == len(every)
    csv = next(published.task(i) for i in range(published.size) if published.task(i).id == "csv-to-json")
    assert csv.meta["row.sif_image"] == "csv.sif" and csv.meta["category"] == "data-format"
    src = published.source
    assert src["kind"] == "parquet" and list(src["files"]) == ["data/train-00000-of-00001.parquet"]
    digest = hashlib.sha256((tmp_path / "pub/data/train-00000-of-00001.parquet").read_bytes()).hexdigest()
    assert src["files"]["data/train-00000-of-00001.parquet"] == f"sha256:{digest}"
    # the same bytes written twice: the shape is reproducible
    write_published(SAMPLE, every, tmp_path / "again.parquet", {t.id: t.instruction for t in ds.tasks},
                    {"csv-to-json": {"row.sif_image": "csv.sif"}})
    assert pack_task(SAMPLE / "csv-to-json") == pack_task(SAMPLE / "csv-to-json")
    assert hashlib.sha256((tmp_path / "again.parquet").read_bytes()).hexdigest() == digest


def test_a_folder_of_parquet_files_and_an_archive_wrapped_in_its_folder(tmp_path):
    rows = _sample_rows()
    wrapped = io.BytesIO()
    with tarfile.open(fileobj=wrapped, mode="w:gz") as tar:
        tar.add(SAMPLE / "edit-config", arcname="edit-config")  # <name>/task.toml
    _write(tmp_path / "ds/data/train.parquet",
           {"path": rows["path"][:1], "task_binary": rows["task_binary"][:1],
                                                "split_train": [True]})
    _write(tmp_path / "ds/data/test.parquet", {"path": ["edit-config"], "task_binary": [wrapped.getvalue()],
                                               "split_train": [False]})
    ts = ENV.load(ENV.Config(dataset=str(tmp_path / "ds")))
    directory = _hashes(ENV.load(ENV.Config(dataset=str(SAMPLE))))
    assert _hashes(ts) == {t: directory[t] for t in ("csv-to-json", "edit-config")}
    assert sorted(ts.source["files"]) == ["data/test.parquet", "data/train.parquet"]
    assert {ts.task(i).meta["row.split_train"] for i in range(ts.size)} == {True, False}


HOSTILE = {
    "dotdot": (_tar(_file("../../escaped", b"pwned")), "leaves the task directory"),
    "absolute": (_tar(_file("/tmp/escaped-abs", b"pwned")), "absolute path"),
    "link-out": (_tar(_entry("evil", tarfile.SYMTYPE, "../../../outside")), "symlink out of the task"),
    "link-abs": (_tar(_entry("evil", tarfile.SYMTYPE, "/etc")), "symlink out of the task"),
    "through-link": (_tar(_entry("d", tarfile.SYMTYPE, "."), _file("d/task.toml", b"x")),
                     "through the symlink"),
    "hardlink-out": (_tar(_entry("h", tarfile.LNKTYPE, "/etc/passwd")), "hard link"),
    "device": (_tar(_entry("dev", tarfile.CHRTYPE)), "a device file"),
    "fifo": (_tar(_entry("pipe", tarfile.FIFOTYPE)), "a FIFO"),
    "twice": (_tar(_file("a"), _file("a")), "given twice"),
    "garbage": (b"this is no archive", "not a readable tar archive"),
}


def test_hostile_rows_are_findings_naming_the_row_and_nothing_lands_outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    names = sorted(HOSTILE)
    rows = _sample_rows(("csv-to-json",))
    _write(tmp_path / "ds/hostile.parquet", {
        "path": [*rows["path"], *names, "../up", ".hidden", "csv-to-json", "csv-to-json/inner", None],
        "task_binary": [*rows["task_binary"], *(HOSTILE[n][0] for n in names), *rows["task_binary"] * 4,
                        None]})
    before = sorted(p.name for p in tmp_path.rglob("*"))
    ts = ENV.load(ENV.Config(dataset=str(tmp_path / "ds")))
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no write next to the dataset
    assert not Path("/tmp/escaped-abs").exists()
    tasks = {ts.task(i).id: ts.task(i) for i in range(ts.size)}
    assert tasks["csv-to-json"].parsed is not None  # the sound row still loads
    for n in names:  # a refused archive is its task's blocking finding, naming the row and the member
        line = tasks[n].problems[0].detail
        assert tasks[n].parsed is None and f"hostile.parquet#{1 + names.index(n)}" in line, line
        assert HOSTILE[n][1] in line, line
    at = len(names) + 1
    bad_paths = {f"hostile.parquet#{at + k}": why for k, why in enumerate(
        ["not a relative path", "not a relative path", "is also row hostile.parquet#0",
         "one task inside the other", "not text"])}
    for tid, why in bad_paths.items():
        assert tid in tasks and why in tasks[tid].problems[0].detail, (tid, tasks.get(tid))
    assert not any(p.name == "escaped" for p in Path(ts.root).parent.rglob("*"))


def test_bombs_stop_at_their_first_header_and_caps_are_named(tmp_path):
    big = tarfile.TarInfo("huge")
    big.size = 10 * 2**30  # declared, never read: the header alone is refused
    with pytest.raises(ArchiveProblem, match="file limit"):
        unpack_archive(_declared_only(big), tmp_path / "a", Limits())
    small = Limits(max_task_bytes=1000, max_file_bytes=800, max_entries=5)
    (tmp_path / "b").mkdir()
    with pytest.raises(ArchiveProblem, match="more than 1000 bytes"):
        unpack_archive(_tar(_file("a", b"0" * 600), _file("b", b"0" * 600), gz=True), tmp_path / "b", small)
    (tmp_path / "c").mkdir()
    with pytest.raises(ArchiveProblem, match="more than 5 members"):
        unpack_archive(_tar(*(_file(f"f{i}") for i in range(6))), tmp_path / "c", small)
    (tmp_path / "d").mkdir()
    zeros = io.BytesIO()
    with tarfile.open(fileobj=zeros, mode="w:gz") as tar:  # 1 MiB of zeros compresses to ~1 KiB
        tar.addfile(_file("z", b"\0" * 2**20)[0], io.BytesIO(b"\0" * 2**20))
    with pytest.raises(ArchiveProblem, match="file limit"):
        unpack_archive(zeros.getvalue(), tmp_path / "d", small)
    with pytest.raises(ArchiveProblem, match="over the 10-byte limit"):
        unpack_archive(b"0" * 11, tmp_path / "e", Limits(max_archive_bytes=10))


def _declared_only(info: tarfile.TarInfo) -> bytes:
    """A tar header declaring `info.size` bytes followed by none: what a bomb's first header says."""
    return info.tobuf(tarfile.PAX_FORMAT)


def test_a_parquet_file_without_the_shape_is_a_config_error_naming_its_columns(tmp_path):
    _write(tmp_path / "x.parquet", {"question": ["q"], "answer": ["a"]})
    with pytest.raises(ConfigError, match="has columns question, answer; a published Harbor dataset"):
        ENV.load(ENV.Config(dataset=str(tmp_path / "x.parquet")))
    (tmp_path / "y.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ConfigError, match="not a readable Parquet file"):
        ENV.load(ENV.Config(dataset=str(tmp_path / "y.parquet")))


# --- the Hub, offline ------------------------------------------------------------------

def hub_cache(cache: Path, repo: str, commit: str, files: dict[str, bytes], ref: str = "main") -> None:
    """A dataset repository in huggingface_hub's cache layout: blobs by sha256, the commit's
    snapshot of symlinks to them, and ``refs/<ref>`` naming the commit."""
    root = cache / f"datasets--{repo.replace('/', '--')}"
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        (root / "blobs" / sha).write_bytes(data)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(root / "blobs" / sha, link.parent), link)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / ref).write_text(commit)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants  # read once at import: set for this test only

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def _parquet_bytes(ids) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(_sample_rows(ids)), buf)
    return buf.getvalue()


def test_hub_dataset_resolves_the_branch_to_its_commit_and_a_contract_pins_it(offline_hub):
    one, two = "1" * 40, "2" * 40
    hub_cache(offline_hub, "our-org/tasks", one,
              {"data/train-00000-of-00001.parquet": _parquet_bytes(SOUND[:2])})
    said: list[str] = []
    ts = ENV.load(ENV.Config(dataset="hf://our-org/tasks@main"), LoadHints(log=said.append))
    assert (
        ts.source["commit"] == one
        and ts.source["requested"] == "main"
        and ts.source["repo"] == "our-org/tasks"
    )
    assert any(f"commit {one}" in line for line in said)
    assert sorted(_hashes(ts)) == sorted(SOUND[:2])
    # main moves on: a fresh load reads the new commit, a contract's load still reads its own
    hub_cache(offline_hub, "our-org/tasks", two, {"data/train-00000-of-00001.parquet": _parquet_bytes(SOUND)})
    assert ENV.load(ENV.Config(dataset="hf://our-org/tasks@main")).source["commit"] == two
    pinned = ENV.load(ENV.Config(dataset="hf://our-org/tasks@main"),
                      LoadHints(revision=ts.revision, source=ts.source))
    assert pinned.source == ts.source and _hashes(pinned) == _hashes(ts)
    with pytest.raises(ConfigError, match="cannot give revision v9 of our-org/tasks"):
        ENV.load(ENV.Config(dataset="hf://our-org/tasks@v9"))
    with pytest.raises(ConfigError, match="not a Hub dataset reference"):
        ENV.load(ENV.Config(dataset="hf://only-a-name"))


@pytest.mark.docker
def test_freeze_of_a_hub_revision_says_what_it_resolved_and_a_second_freeze_rebuilds_nothing(
        offline_hub, tmp_path, capsys):
    from validate.cli.main import main

    commit = "3" * 40
    hub_cache(offline_hub, "our-org/tasks", commit, {"data/train.parquet": _parquet_bytes(SOUND[:2])})
    args = ["freeze", "--env", "harbor", "--name", "hub", "--dataset", "hf://our-org/tasks@main",
            "--min-count", "1", "--allow-patch"]
    assert main([*args, "--out", str(tmp_path / "a.json")]) == 0
    first = capsys.readouterr().err
    assert f"commit {commit}" in first and "2 tasks, revision sha256:" in first, first
    assert main([*args, "--out", str(tmp_path / "b.json")]) == 0
    second = capsys.readouterr().err
    assert second.count(": cached") == 2 and ": built" not in second, second
    import json

    frozen = json.loads((tmp_path / "b.json").read_bytes())["environment"]["source"]
    assert frozen["commit"] == commit and frozen["requested"] == "main" and list(frozen["files"]) == \
        ["data/train.parquet"]
    # main moves on; the contract still verifies against its own commit, and not without it
    hub_cache(offline_hub, "our-org/tasks", "4" * 40, {"data/train.parquet": _parquet_bytes(SOUND[:1])})
    assert main(["verify", "--manifest", str(tmp_path / "b.json")]) == 0
    import shutil

    shutil.rmtree(offline_hub / "datasets--our-org--tasks" / "snapshots" / commit)
    assert main(["verify", "--manifest", str(tmp_path / "b.json")]) == 2
    assert f"cannot give revision {commit}" in capsys.readouterr().err
