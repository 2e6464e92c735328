"""A contract's task entries held as columns: the same entries, JSON and errors as a list of
models, at a fraction of the memory; and the CLI's allocator setting that returns freed memory."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tracemalloc

import pytest
from pydantic import BaseModel, field_serializer

from environment.protocol import canonical_json, sha256_tag
from tests.conftest import make_manifest
from validate.contract.manifest import Manifest, derive, task_list_sha256, write_manifest
from validate.contract.sealed import SealedDocument, pretty
from validate.contract.tasklist import TaskEntry, TaskList
from validate.core.errors import ContractError

WHY = {"oracle": "no reference", "shuffled": "one paper: nothing to shuffle"}


def _entries(n: int) -> list[TaskEntry]:
    return [TaskEntry(id=f"env/{i:08x}/{i}", idx=3 * i, hash=f"sha256:{i:064x}",
                      skip=WHY if i % 3 == 1 else {})
            for i in range(n)]


class Holder(BaseModel):
    tasks: TaskList


class Doc(SealedDocument):
    document = "document"
    short = "the document's"
    make_with = "make one"

    name: str
    tasks: TaskList
    zeta: dict[str, str] = {}


def _peak(f):
    """What `f` returns, and the most memory it had allocated at once (tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = f()
        return out, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_task_list_is_its_entries():
    entries = _entries(50)
    tasks = TaskList(entries)
    assert len(tasks) == 50 and tasks == entries and entries == tasks and list(tasks) == entries
    assert (
        tasks[0] == entries[0] and tasks[-1] == entries[-1] and tasks[7].skip == WHY and tasks[6].skip == {}
    )
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


def test_taking_entries_makes_a_list_of_those_entries_from_the_columns():
    entries = _entries(30)
    tasks = TaskList(entries)
    taken = tasks.take([4, 1, 7, 29])
    assert isinstance(taken, TaskList) and taken == [entries[4], entries[1], entries[7], entries[29]]
    # the same columns as built anew
    assert taken == TaskList([entries[4], entries[1], entries[7], entries[29]])
    assert tasks.take([]) == [] and len(tasks.take([]).take([])) == 0
    assert tasks.take(p for p in (2, 0)) == [entries[2], entries[0]]  # any iterable of positions, read once
    with pytest.raises(IndexError):
        tasks.take([0, 30])
    with pytest.raises(IndexError):
        tasks.take([-1])
    assert list(tasks.ids()) == [e.id for e in entries] and list(tasks.hashes()) == [e.hash for e in entries]
    assert list(tasks.idx()) == [e.idx for e in entries]


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
    # the model's order
    assert list(held.model_dump(mode="json")["tasks"][0]) == ["id", "idx", "hash", "skip"]
    assert Holder(tasks=entries).tasks == entries and Holder(tasks=held.tasks).tasks is held.tasks
    bad = [*as_list[:3], {**as_list[3], "idx": -1}]
    with pytest.raises(ValueError, match=r"tasks\.3\.idx"):
        Holder.model_validate({"tasks": bad})
    with pytest.raises(ValueError, match=r"tasks\.2\.bogus"):
        Holder.model_validate({"tasks": [*as_list[:2], {**as_list[2], "bogus": 1}]})
    # Validated an entry at a time, in the caller's mode: strict refuses what lax coerces.
    loose = [*as_list[:2], {**as_list[2], "idx": str(as_list[2]["idx"])}]
    assert Holder.model_validate({"tasks": loose}).tasks == entries[:3]
    with pytest.raises(ValueError, match=r"tasks\.2\.idx"):
        Holder.model_validate({"tasks": loose}, strict=True)


def test_a_sealed_document_writes_and_hashes_its_task_list_an_entry_at_a_time():
    hostile = [TaskEntry(id='a"b\\c\nd/é/☃/\u2028', idx=0, hash="sha256:" + "0" * 64, skip={"x\ty": "ü\"\n"}),
               *_entries(12)[1:]]
    for tasks in (hostile, _entries(1), []):
        # A field holding what the document marks a task list's place with is written as it is.
        doc = Doc(name="n", tasks=tasks, zeta={"k": '"tasks": [', "tasks": "[]"})
        whole = doc.model_dump(mode="json")
        assert doc.to_json() == pretty(whole)
        assert doc.content_sha256() == sha256_tag(
            canonical_json({k: v for k, v in whole.items() if k != "sha256"})
        )
        assert task_list_sha256(doc.tasks) == task_list_sha256(list(doc.tasks)) == \
            sha256_tag(canonical_json([[e.id, e.hash] for e in tasks]))
    # A document whose dump reshapes the field is encoded whole, as it dumps.
    class Shaped(Doc):
        @field_serializer("tasks")
        def _ids(self, v: TaskList) -> list[str]:
            return list(v.ids())

    shaped = Shaped(name="n", tasks=hostile)
    assert (
        shaped.to_json() == pretty(shaped.model_dump(mode="json"))
        and b'"tasks": [\n    "a' in shaped.to_json()
    )
    # Written a task at a time: the peak is about the bytes written, not a dict and a few strings
    # per task besides (~10 times them when the dump was held whole), and hashing holds nothing.
    doc = Doc(name="n", tasks=_entries(10_000))
    written, peak = _peak(doc.to_json)
    assert written == pretty(doc.model_dump(mode="json")) and peak < 2 * len(written), peak / len(written)
    assert _peak(doc.content_sha256)[1] < len(written) / 10


def test_validating_a_list_holds_no_model_per_entry():
    entries = _entries(10_000)
    as_list = [e.model_dump() for e in entries]
    held, peak = _peak(lambda: Holder.model_validate({"tasks": as_list}))
    assert held.tasks == entries
    # The list validated whole held a model per entry at once: ~7 MB here; an entry at a time ~1.3.
    assert peak < 250 * len(as_list), peak / len(as_list)


@pytest.mark.bwrap
def test_a_parsed_manifest_holds_its_entries_as_columns_and_keeps_its_bytes(sandboxes, tmp_path):
    made = make_manifest(sandboxes("bwrap"), idx=list(range(12)), max_papers=2)
    assert any(t.skip for t in made.tasks)  # one-paper tasks excuse the controls that cannot test them
    raw = write_manifest(made, tmp_path / "m.json").read_bytes()
    m = Manifest.parse(raw, "m.json")
    assert isinstance(m.tasks, TaskList) and m.to_json() == raw and m.content_sha256() == m.sha256
    assert [t.idx for t in m.tasks] == m.selection.idx
    # Deriving takes the parent's entries from its columns; a copy holding a plain list derives alike.
    for parent in (m, m.model_copy(update={"tasks": list(m.tasks)})):
        child = derive(parent, None, None, name="child", idx=[9, 2, 5], rule="three")
        assert isinstance(child.tasks, TaskList) and child.tasks == [m.tasks[2], m.tasks[5], m.tasks[9]]
        assert Manifest.parse(child.to_json(), "child.json") == child
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
from validate.cli import main as cli
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
    # the user's
    assert held("fixed", MALLOC_TRIM_THRESHOLD_="1000000000", MALLOC_MMAP_THRESHOLD_="1000000000") >= 30
