"""Sealed documents: a JSON document carrying the sha256 of its own content.

Dataset manifests (`validate.contract.Manifest`) and eval contracts
(`validate.eval.contract.EvalContract`) are both one: written as canonical, indented JSON
with sorted keys; sealed by ``sha256`` = sha256 of the canonical JSON of every other field
*as written* (a field a later version adds, with its default, does not change an older
document's hash); parsed and loaded with one error per problem, naming the file and the
field and saying how to make a good one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ValidationError

from environment.protocol import canonical_json, sha256_tag
from validate.errors import ContractError
from validate.jsonio import JSONInputError, loads


def pretty(value: object) -> bytes:
    """Canonical JSON indented for reading (sealed documents on disk)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2, allow_nan=False).encode() + b"\n"


def first_error(e: ValidationError, prefix: str = "") -> str:
    """``prefix.loc: message`` of a validation error's first problem."""
    err = e.errors()[0]
    loc = ".".join(map(str, err["loc"]))
    return f"{prefix}{'.' if prefix and loc else ''}{loc}: {err['msg']}"


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
        return sha256_tag(canonical_json(self.model_dump(mode="json", exclude={"sha256"})))

    def sealed(self) -> Self:
        return self.model_copy(update={"sha256": self.content_sha256()})

    def to_json(self) -> bytes:
        return pretty(self.model_dump(mode="json"))

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
