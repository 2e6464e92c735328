"""The paper corpus: load, validate, fix an order and an immutable revision.

A corpus is a list of full papers, each a list of body paragraphs in reading order. Two
sources are supported:

- a local snapshot, a ``.jsonl``, ``.jsonl.gz`` or ``.parquet`` file of paper records; its
  revision is ``sha256:<hex of the file bytes>``;
- the Hugging Face dataset ``PrimeIntellect/deshuffle-papers-v1-corpus`` pinned at
  `HUB_REVISION` (see `environment.deshuffle.hub`).

Records are validated on load. A paper with a missing or empty text, no paragraphs, or a
licence outside CC BY / CC0 is an error naming the paper and the field, or, with
``skip_invalid=True``, a skip that is counted in `Corpus.skipped`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

#: CC BY (any version, or unstated) and CC0; CC BY-SA, -NC, -ND are outside it.
_LICENCE_OK = re.compile(r"^(CC-BY(-\d(\.\d)?)?( \(.*\))?|CC0(-1\.0)?)$")

DEFAULT_CORPUS_HINT = "../shared/corpus/papers.jsonl.gz"


class CorpusError(ValueError):
    """A corpus file or record that cannot be used; the message names file, paper and field."""


class Paragraph(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    #: The paragraph's text; never empty.
    text: str = Field(min_length=1)
    #: Innermost section heading, ``""`` where none.
    section: str = ""

    @field_validator("text")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("text is blank")
        return v

    @field_validator("section", mode="before")
    @classmethod
    def _none_is_empty(cls, v: object) -> object:
        return "" if v is None else v


class Paper(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    #: ``<source>:<id>``, unique in the corpus.
    paper_id: str = Field(min_length=1)
    #: ``arxiv``, ``biorxiv``, ``medrxiv``, ``plos``, ...
    source: str = Field(min_length=1)
    #: SPDX-like licence, CC BY or CC0 only.
    license: str
    #: Body paragraphs in reading order; at least one.
    paragraphs: tuple[Paragraph, ...] = Field(min_length=1)
    title: str | None = None

    @field_validator("license")
    @classmethod
    def _permissive(cls, v: str) -> str:
        if not _LICENCE_OK.match(v):
            raise ValueError(f"licence {v!r} is outside CC BY / CC0")
        return v


def _field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_paper(record: dict, where: str) -> Paper:
    """Validate one raw record; the error names the paper, the field and `where`."""
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    pid = record.get("paper_id") or "<no paper_id>"
    try:
        return Paper.model_validate(record)
    except ValidationError as e:
        err = e.errors()[0]
        raise CorpusError(
            f"{where}: paper {pid}: field '{_field_path(err['loc'])}': {err['msg']}"
        ) from None


def _iter_records(path: Path) -> Iterator[tuple[dict, str]]:
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        for i, rec in enumerate(pq.read_table(path).to_pylist()):
            yield rec, f"{path} row {i}"
        return
    if name.endswith(".jsonl.gz"):
        fh = gzip.open(path, "rt", encoding="utf-8")
    elif name.endswith(".jsonl"):
        fh = open(path, encoding="utf-8")
    else:
        raise CorpusError(f"{path}: unsupported corpus file; use .jsonl, .jsonl.gz or .parquet")
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path} line {lineno}: not JSON: {e.msg}") from None
            yield rec, f"{path} line {lineno}"


def file_revision(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return f"sha256:{h.hexdigest()}"


class Corpus:
    """Validated papers in a fixed order, with an immutable `revision`.

    `location` says where the papers came from (a path, or ``hf:<repo>``); `skipped` lists
    ``(paper_id, reason)`` for records dropped under ``skip_invalid=True``.
    """

    def __init__(self, papers: Iterable[Paper], *, revision: str, location: str,
                 skipped: Iterable[tuple[str, str]] = ()) -> None:
        self.papers: tuple[Paper, ...] = tuple(papers)
        self.revision = revision
        self.location = location
        self.skipped: tuple[tuple[str, str], ...] = tuple(skipped)
        seen: set[str] = set()
        for p in self.papers:
            if p.paper_id in seen:
                raise CorpusError(f"{location}: paper {p.paper_id}: field 'paper_id' is duplicated")
            seen.add(p.paper_id)
        if not self.papers:
            raise CorpusError(f"{location}: the corpus holds no valid paper")

    @classmethod
    def from_records(cls, records: Iterable[tuple[dict, str]], *, revision: str, location: str,
                     skip_invalid: bool = False) -> Corpus:
        papers, skipped = [], []
        for rec, where in records:
            try:
                papers.append(parse_paper(rec, where))
            except CorpusError as e:
                if not skip_invalid:
                    raise
                pid = rec.get("paper_id", where) if isinstance(rec, dict) else where
                skipped.append((str(pid), str(e)))
        return cls(papers, revision=revision, location=location, skipped=skipped)

    @classmethod
    def from_path(cls, path: str | Path, *, skip_invalid: bool = False) -> Corpus:
        """Load a local snapshot (``.jsonl``, ``.jsonl.gz`` or ``.parquet``)."""
        p = Path(path)
        if not p.is_file():
            raise CorpusError(f"{p}: corpus file not found (the local snapshot here is "
                              f"{DEFAULT_CORPUS_HINT}, relative to the project root)")
        return cls.from_records(_iter_records(p), revision=file_revision(p),
                                location=str(p.resolve()), skip_invalid=skip_invalid)

    @classmethod
    def from_hub(cls, **kwargs) -> Corpus:
        """Load the pinned Hugging Face snapshot; see `environment.deshuffle.hub.load_hub`."""
        from environment.deshuffle.hub import load_hub

        return load_hub(**kwargs)

    def sources(self) -> list[str]:
        return sorted({p.source for p in self.papers})

    def select(self, source: str | None) -> tuple[Paper, ...]:
        """Papers of one source (or all), in corpus order."""
        if source is None:
            return self.papers
        return tuple(p for p in self.papers if p.source == source)

    def __len__(self) -> int:
        return len(self.papers)
