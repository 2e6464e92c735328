"""Sealed documents: a JSON document carrying the sha256 of its own content.

Dataset manifests (`validate.contract.manifest.Manifest`) and eval contracts
(`validate.eval.contract.EvalContract`) are both one: written as canonical, indented JSON
with sorted keys; sealed by ``sha256`` = sha256 of the canonical JSON of every other field
*as written* (a field a later version adds, with its default, does not change an older
document's hash); parsed and loaded with one error per problem, naming the file and the
field and saying how to make a good one.
"""

from __future__ import annotations

import hashlib
import io
import json
import secrets
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ValidationError

from environment.protocol import canonical_json, sha256_tag
from validate.core.errors import ContractError
from validate.core.jsonio import JSONInputError, loads


def pretty(value: object) -> bytes:
    """Canonical JSON indented for reading (sealed documents on disk)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2, allow_nan=False).encode() + b"\n"


def first_error(e: ValidationError, prefix: str = "") -> str:
    """``prefix.loc: message`` of a validation error's first problem."""
    err = e.errors()[0]
    loc = ".".join(map(str, err["loc"]))
    return f"{prefix}{'.' if prefix and loc else ''}{loc}: {err['msg']}"


@runtime_checkable
class Streamed(Protocol):
    """A field value a sealed document serialises an item at a time (a long list: a contract's
    task entries, `validate.contract.tasklist.TaskList`): `json_items` gives each item as it dumps in
    the document, so its JSON is never held whole as one Python object per item."""

    def json_items(self) -> Iterator[Any]: ...


def _pretty_items(items: Iterator[Any]) -> Iterator[bytes]:
    # A top-level field's list as `pretty` indents it (items at depth 2; JSON escapes every
    # newline inside a string, so each line break is the layout's).
    first = True
    for item in items:
        yield (b"[" if first else b",") + b"\n    " + pretty(item)[:-1].replace(b"\n", b"\n    ")
        first = False
    yield b"[]" if first else b"\n  ]"


def canonical_items(items: Iterable[Any]) -> Iterator[bytes]:
    """The canonical JSON of a list, an item at a time (`canonical_json` of the whole list, in chunks)."""
    first = True
    for item in items:
        yield (b"[" if first else b",") + canonical_json(item)
        first = False
    yield b"[]" if first else b"]"


class SealedDocument(BaseModel):
    """A document sealed by the sha256 of its own content (see the module). Subclasses name
    themselves for errors (`document`, `short`) and say how one is made (`make_with`), and
    declare ``sha256: str = ""`` among their fields."""

    #: What errors call the document ("manifest") and its content ("the manifest's content").
    document: ClassVar[str]
    short: ClassVar[str]
    #: How a user makes one, e.g. "create one with `validate freeze`".
    make_with: ClassVar[str]

    sha256: str = ""

    def content_sha256(self) -> str:
        h = hashlib.sha256()
        for chunk in self._encoded(canonical_json, canonical_items, exclude={"sha256"}):
            h.update(chunk)
        return "sha256:" + h.hexdigest()

    def sealed(self) -> Self:
        return self.model_copy(update={"sha256": self.content_sha256()})

    def to_json(self) -> bytes:
        out = io.BytesIO()
        for chunk in self._encoded(pretty, _pretty_items):
            out.write(chunk)
        return out.getvalue()

    def _encoded(self, encode: Callable[[Any], bytes], items: Callable[[Iterator[Any]], Iterator[bytes]],
                 exclude: frozenset[str] | set[str] = frozenset()) -> Iterator[bytes]:
        """The document's bytes as `encode` writes its JSON, in chunks: each `Streamed` field is
        encoded an item at a time where its value goes (the same bytes as `encode` of the whole
        dump: tests/test_tasklist.py), everything else as one."""
        cls = type(self)
        decorators = cls.__pydantic_decorators__
        shaped = {f for d in decorators.field_serializers.values() for f in d.info.fields}
        # Only a field dumped as itself under its own name is spliced: a document whose dump is
        # reshaped (its own serializer, a field's, an alias, an excluded field) is encoded whole.
        streamed = {} if decorators.model_serializers else {
            name: value for name, info in cls.model_fields.items()
            if name not in exclude and name not in shaped and info.alias is None
            and info.serialization_alias is None
            and not info.exclude and isinstance(value := getattr(self, name), Streamed)}
        data = self.model_dump(mode="json", exclude={*exclude, *streamed})
        # Each streamed field's place, marked by a string no document can hold (a fresh random token).
        token = secrets.token_hex(16)
        marks = {name: json.dumps(f"{token}:{name}", ensure_ascii=False).encode() for name in streamed}
        data.update({name: f"{token}:{name}" for name in streamed})
        text = encode(data)
        at = 0
        for name in sorted(streamed, key=lambda n: text.index(marks[n])):
            where = text.index(marks[name])
            yield text[at:where]
            yield from items(streamed[name].json_items())
            at = where + len(marks[name])
        yield text[at:]

    @classmethod
    def check_raw(cls, raw: Any, where: str) -> None:
        """Refuse a parsed document that is plainly another kind (before field validation)."""

    @classmethod
    def parse(cls, data: bytes, where: str) -> Self:
        try:
            raw = loads(data)
        except JSONInputError as e:
            raise ContractError(f"{where}: not a readable JSON {cls.document} ({e})") from None
        cls.check_raw(raw, where)
        try:
            doc = cls.model_validate(raw)
        except ValidationError as e:
            raise ContractError(f"{where}: field '{first_error(e)}'") from None
        try:  # the document as written: a field added later (with its default) does not change its hash
            own = sha256_tag(canonical_json({k: v for k, v in raw.items() if k != "sha256"}))
        except ValueError as e:  # NaN or Infinity somewhere: no canonical JSON, so no hash
            raise ContractError(f"{where}: not canonical JSON ({e}); freeze it again") from None
        if doc.sha256 != own:
            raise ContractError(f"{where}: field 'sha256': {cls.short} content does not match its sha256 "
                                f"(edited after freezing? freeze it again)")
        return doc

    @classmethod
    def load(cls, path: str | Path) -> Self:
        p = Path(path)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise ContractError(f"{p}: {cls.document} not found ({cls.make_with})") from None
        except OSError as e:
            raise ContractError(f"{p}: cannot read the {cls.document} ({e.strerror or e})") from None
        return cls.parse(data, str(p))
