"""A contract's task entries held as columns: the same entries, JSON and errors as a list of
models, at a fraction of the memory; and the CLI's allocator setting that returns freed memory."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tracemalloc

import pytest
from pydantic import BaseModel

from tests.conftest import make_manifest
from validate.contract import Manifest, write_manifest
from validate.errors import ContractError
from validate.tasklist import TaskEntry, TaskList

WHY = {"oracle": "no reference", "shuffled": "one paper: nothing to shuffle"}


def _entries(n: int) -> list[TaskEntry]:
    return [TaskEntry(id=f"env/{i:08x}/{i}", idx=3 * i, hash=f"sha256:{i:064x}", skip=WHY if i % 3 == 1 else {})
            for i in range(n)]


class Holder(BaseModel):
    tasks: TaskList


def test_a_task_list_is_its_entries():
    entries = _entries(50)
    tasks = TaskList(entries)
    assert len(tasks) == 50 and tasks == entries and entries == tasks and list(tasks) == entries
    assert tasks[0] == entries[0] and tasks[-1] == entries[-1] and tasks[7].skip == WHY and tasks[6].skip == {}
    assert tasks[10:13] == entries[10:13] and tasks[::-7] == entries[::-7]
    with pytest.raises(IndexError):
        tasks[50]
    assert tasks.position(21) == 7 and tasks.position(22) is None and tasks.position(10**6) is None
    assert pickle.loads(pickle.dumps(tasks)) == tasks
    changed = [*entries[:-1], entries[-1].model_copy(update={"hash": "sha256:" + "f" * 64})]
    assert tasks != changed and tasks != TaskList(changed) and tasks != entries[:-1]
    # An entry handed out is a copy: changing its skip changes nothing held.
    tasks[1].skip["x"] = "y"
    assert tasks[1].skip == WHY and tasks[4].skip == WHY


def test_the_list_holds_every_field_of_an_entry():
    # A field added to TaskEntry without its column would be dropped from every parsed contract.
    assert tuple(TaskEntry.model_fields) == TaskList.COLUMNS


def test_it_validates_and_dumps_as_a_list_of_entries():
    entries = _entries(20)
    as_list = [e.model_dump() for e in entries]
    held = Holder.model_validate({"tasks": as_list})
    assert isinstance(held.tasks, TaskList) and held.tasks == entries
    assert held.model_dump(mode="json") == {"tasks": as_list}
    assert json.loads(held.model_dump_json()) == {"tasks": as_list}
    assert list(held.model_dump(mode="json")["tasks"][0]) == ["id", "idx", "hash", "skip"]  # the model's order
    assert Holder(tasks=entries).tasks == entries and Holder(tasks=held.tasks).tasks is held.tasks
    bad = [*as_list[:3], {**as_list[3], "idx": -1}]
    with pytest.raises(ValueError, match=r"tasks\.3\.idx"):
        Holder.model_validate({"tasks": bad})
    with pytest.raises(ValueError, match=r"tasks\.2\.bogus"):
        Holder.model_validate({"tasks": [*as_list[:2], {**as_list[2], "bogus": 1}]})


@pytest.mark.bwrap
def test_a_parsed_manifest_holds_its_entries_as_columns_and_keeps_its_bytes(sandboxes, tmp_path):
    made = make_manifest(sandboxes("bwrap"), idx=list(range(12)), max_papers=2)
    assert any(t.skip for t in made.tasks)  # one-paper tasks excuse the controls that cannot test them
    raw = write_manifest(made, tmp_path / "m.json").read_bytes()
    m = Manifest.parse(raw, "m.json")
    assert isinstance(m.tasks, TaskList) and m.to_json() == raw and m.content_sha256() == m.sha256
    assert [t.idx for t in m.tasks] == m.selection.idx
    hostile = json.loads(raw)
    hostile["tasks"][0]["idx"] = 2**64  # beyond what the columns hold: refused by name, never an overflow
    with pytest.raises(ContractError, match=r"tasks\.0\.idx"):
        Manifest.parse(json.dumps(hostile).encode(), "m.json")


def test_columns_cost_a_fraction_of_one_model_per_entry():
    n = 10_000
    entries = _entries(n)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tasks = TaskList(entries)
        columns = tracemalloc.get_traced_memory()[0] - before
        before = tracemalloc.get_traced_memory()[0]
        models = [TaskEntry.model_validate(e.model_dump()) for e in entries]
        one_each = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(tasks) == len(models) == n
    # ~0.15 KB a task against ~1 KB: the ids' and hashes' characters, three integer arrays, and
    # the skips once each.
    assert columns < 250 * n and columns * 4 < one_each, (columns / n, one_each / n)


# The allocator: after one large block is freed, glibc raises its thresholds, and blocks of up to
# that size come from the heap; with a long-lived one after each, freeing them leaves the heap
# resident. The CLI fixes the thresholds first (`_freed_memory_goes_back`).
HEAP = r"""
import sys
from validate import cli
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024
if sys.argv[1] == "fixed":
    cli._freed_memory_goes_back()
big = bytearray(8 << 20); big[::4096] = b"x" * len(big[::4096]); del big  # a large block, freed
before = rss()
freed, kept = [], []
for _ in range(40):
    b = bytearray(1 << 20); b[::4096] = b"x" * len(b[::4096]); freed.append(b)
    kept.append(bytearray(200 << 10))
del freed
print(rss() - before)
"""


def test_the_cli_keeps_freed_memory_going_back_to_the_system():
    def held(mode: str, **env: str) -> int:
        out = subprocess.run([sys.executable, "-c", HEAP, mode], capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin", **env})
        return int(out.stdout)

    assert held("dynamic") >= 30  # glibc's own behaviour: the freed megabytes stay resident
    assert held("fixed") <= 15  # only the 200 KB blocks kept
    assert held("fixed", MALLOC_TRIM_THRESHOLD_="1000000000", MALLOC_MMAP_THRESHOLD_="1000000000") >= 30  # the user's
