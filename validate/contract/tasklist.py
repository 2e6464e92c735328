"""A contract's task entries: the schema of one (`TaskEntry`) and how a parsed contract holds
them all (`TaskList`).

A contract of 10,000 tasks parsed into one pydantic model per entry costs ~1 KB per task
(the model, its field dict and field set, its strings), and the allocator keeps the parse's
garbage around them: ~17 MB more RSS than a 1,000-task one for a driver whose every other
holding is flat in the tasks. `TaskList` keeps the same entries as columns — the ids and the
hashes each one string with an offset array, the idx an integer array, only the skips that
are not empty — ~0.15 KB per task, and makes a `TaskEntry` when one is asked for. It is an
immutable `Sequence[TaskEntry]` validated and serialised exactly as ``list[TaskEntry]`` is
(the same JSON, so the same content hash, and the same error locations), so the entry model
stays the schema of record and every reader of ``manifest.tasks`` is unchanged.
"""

from __future__ import annotations

import io
import operator
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, ValidationError
from pydantic_core import core_schema


class TaskEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    idx: int = Field(ge=0, le=2**63 - 1)  # held in a 64-bit array (TaskList)
    hash: str
    skip: dict[str, str] = Field(default_factory=dict, description="Agents of the contract that cannot test "
                                 "this task, each with the environment's reason: they are not played on it.")


class _Column:
    """Strings appended as one string and the end offset of each (each string consumed as it
    comes: only the column is held, not a list of its parts)."""

    def __init__(self) -> None:
        self._out, self._ends, self._at = io.StringIO(), array("q"), 0

    def append(self, value: str) -> None:
        self._at += self._out.write(value)
        self._ends.append(self._at)

    def done(self) -> tuple[str, array]:
        return self._out.getvalue(), self._ends


def _column(values: Iterable[str]) -> tuple[str, array]:
    column = _Column()
    for v in values:
        column.append(v)
    return column.done()


class TaskList(Sequence[TaskEntry]):
    """The entries of a contract, held as columns (see the module); equal to any sequence of
    the same entries. One column per field of `TaskEntry` (`COLUMNS`): a field added there
    needs its column here (tests/test_tasklist.py checks the two agree)."""

    #: The fields of `TaskEntry` this list holds, in the model's order.
    COLUMNS = ("id", "idx", "hash", "skip")

    __slots__ = ("_hash_ends", "_hashes", "_id_ends", "_ids", "_idx", "_skip", "_skip_at")

    def __init__(self, entries: Iterable[TaskEntry]) -> None:
        # One pass, each entry into the columns as it comes: an iterable of entries made one at
        # a time (a parse validating them) never has them all alive at once.
        ids, hashes, self._idx = _Column(), _Column(), array("q")
        # Skips repeat (the same agents excused for the same reason on many tasks): each distinct
        # one is held once, and where each applies as an integer array, not an object per task.
        self._skip_at, self._skip = array("q"), []
        distinct: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        for i, e in enumerate(entries):
            ids.append(e.id)
            hashes.append(e.hash)
            self._idx.append(e.idx)
            if e.skip:
                self._skip_at.append(i)
                self._skip.append(distinct.setdefault(tuple(sorted(e.skip.items())), dict(e.skip)))
        (self._ids, self._id_ends), (self._hashes, self._hash_ends) = ids.done(), hashes.done()

    def __len__(self) -> int:
        return len(self._idx)

    @staticmethod
    def _strings(column: str, ends: array, at: Iterable[int] | None = None) -> Iterator[str]:
        for i in range(len(ends)) if at is None else at:
            yield column[ends[i - 1] if i else 0:ends[i]]

    def ids(self) -> Iterator[str]:
        """The entries' ids in order, made one at a time (no entry is made)."""
        return self._strings(self._ids, self._id_ends)

    def hashes(self) -> Iterator[str]:
        """The entries' task hashes in order, made one at a time."""
        return self._strings(self._hashes, self._hash_ends)

    def idx(self) -> array:
        """The entries' idx in order (a copy: the list is immutable)."""
        return array("q", self._idx)

    def take(self, positions: Sequence[int]) -> TaskList:
        """The entries at `positions` (each in range, in the order given) as a new list, made from
        the columns: a child contract's entries cost no entry model each
        (`validate.contract.manifest.derive`)."""
        n, positions = len(self), [operator.index(p) for p in positions]
        if any(not 0 <= p < n for p in positions):
            raise IndexError("task list index out of range")
        out = TaskList(())
        out._ids, out._id_ends = _column(self._strings(self._ids, self._id_ends, positions))
        out._hashes, out._hash_ends = _column(self._strings(self._hashes, self._hash_ends, positions))
        out._idx = array("q", (self._idx[p] for p in positions))
        at, skips = array("q"), []  # the parent's skip objects: one held once there is held once here too
        for i, p in enumerate(positions):
            k = bisect_left(self._skip_at, p)
            if k < len(self._skip_at) and self._skip_at[k] == p:
                at.append(i)
                skips.append(self._skip[k])
        out._skip_at, out._skip = at, skips
        return out

    def _entry(self, i: int) -> TaskEntry:
        a, b = (self._id_ends[i - 1] if i else 0), self._id_ends[i]
        c, d = (self._hash_ends[i - 1] if i else 0), self._hash_ends[i]
        at = bisect_left(self._skip_at, i)
        skip = self._skip[at] if at < len(self._skip_at) and self._skip_at[at] == i else None
        # Validated when the list was made: built without validating again.
        return TaskEntry.model_construct(id=self._ids[a:b], idx=self._idx[i], hash=self._hashes[c:d],
                                         skip=dict(skip) if skip else {})

    @overload
    def __getitem__(self, i: int) -> TaskEntry: ...

    @overload
    def __getitem__(self, i: slice) -> list[TaskEntry]: ...

    def __getitem__(self, i: int | slice) -> TaskEntry | list[TaskEntry]:
        if isinstance(i, slice):
            return [self._entry(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("task list index out of range")
        return self._entry(i % n)

    def __iter__(self) -> Iterator[TaskEntry]:
        return (self._entry(i) for i in range(len(self)))

    def position(self, idx: int) -> int | None:
        """Where the entry of task `idx` is (a contract's entries follow its sorted idx), or None."""
        i = bisect_left(self._idx, idx)
        return i if i < len(self._idx) and self._idx[i] == idx else None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TaskList):
            return (self._ids, self._id_ends, self._hashes, self._hash_ends, self._idx, self._skip_at,
                    self._skip) == \
                (other._ids, other._id_ends, other._hashes, other._hash_ends, other._idx, other._skip_at,
                 other._skip)
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a list's: equal to lists, so not hashable

    def __repr__(self) -> str:
        return f"TaskList({len(self)} tasks)"

    def json_items(self) -> Iterator[dict[str, Any]]:
        """Each entry as its model dumps it, made one at a time (how a sealed document writes
        and hashes its task list: `validate.contract.sealed.Streamed`)."""
        return (e.model_dump(mode="json") for e in self)

    @staticmethod
    def _dump(entries: Sequence[TaskEntry]) -> list[dict[str, Any]]:
        # The JSON of list[TaskEntry]: each entry as its model dumps it (the contract's bytes and hash).
        return [e.model_dump(mode="json") for e in entries]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        entries = handler.generate_schema(list[TaskEntry])

        def validate(value: Any, inner: core_schema.ValidatorFunctionWrapHandler) -> TaskList:
            if isinstance(value, TaskList):
                return value
            if isinstance(value, list):
                # An entry validated at a time into the columns, each by the list's own validator
                # (this validation's mode, strict included): a parsed 10,000-task contract never
                # holds 10,000 entry models. On any error the list is validated whole again, so
                # the error and its location are exactly a list's.
                try:
                    return cls(inner([item])[0] for item in value)
                except ValidationError:
                    pass
            return cls(inner(value))

        return core_schema.no_info_wrap_validator_function(
            validate, entries, serialization=core_schema.plain_serializer_function_ser_schema(cls._dump))
