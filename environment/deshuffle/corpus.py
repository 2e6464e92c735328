"""The paper corpus: read and validate a snapshot, fix an order and an immutable revision.

A corpus is a list of full papers, each a list of body paragraphs in reading order. Two
sources are supported:

- a local snapshot, a ``.jsonl``, ``.jsonl.gz`` or ``.parquet`` file of paper records; its
  revision is ``sha256:<hex of the file bytes>``;
- the Hugging Face dataset ``PrimeIntellect/deshuffle-papers-v1-corpus`` pinned at
  `HUB_REVISION`, loaded by `environment.deshuffle.hub.load_hub` (which builds on this module;
  this module never imports it).

A corpus file is hostile input. Every way it can be unusable ends in one `CorpusError`
whose message names the file (and the line or row, paper and field where there is one) and
says how to fix it; nothing else escapes, and no `Corpus` exists until every record passed.
What the reader accepts:

- JSON Lines as strict UTF-8 (one leading BOM tolerated), ``\\n`` or ``\\r\\n`` line ends,
  blank lines skipped, RFC 8259 JSON only (``NaN``/``Infinity`` refused, integers of at
  most `MAX_INT_DIGITS` digits, nesting only as deep as the decoder's recursion allows);
  U+2028/U+2029 are ordinary characters inside a string, never line breaks;
- text free of lone surrogates (they cannot be written back out as UTF-8);
- at most what `CorpusLimits` allows: file size, decompressed bytes (a gzip or Parquet
  "bomb" is stopped at the cap, not inflated), line length, line count.

A record that parses but is not a valid paper (missing or empty text, no paragraphs, a
licence outside CC BY / CC0, a wrong type, a duplicated ``paper_id``) is an error naming
the paper and the field or, with ``skip_invalid=True``, a skip counted in `Corpus.skipped`.
A file that cannot be read as a whole (not gzip, truncated, not Parquet, over a cap, a line
that is not JSON) is always an error: skipping would load half a corpus without saying so.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from environment.protocol import EnvError

#: CC BY (any version, or unstated) and CC0; CC BY-SA, -NC, -ND are outside it.
_LICENCE_OK = re.compile(r"^(CC-BY(-\d(\.\d)?)?( \(.*\))?|CC0(-1\.0)?)$")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BOM = b"\xef\xbb\xbf"
_JSON_SPACE = b" \t\r\n"  # RFC 8259 whitespace; anything else on a line must be JSON

DEFAULT_CORPUS_HINT = "../shared/corpus/papers.jsonl.gz"
#: Python's own limit for int(str); a longer JSON integer is refused with a clear message.
MAX_INT_DIGITS = 4300
_RECORD_SHAPE = ('{"paper_id", "source", "license", "title", '
                 '"paragraphs": [{"text", "section"}, ...]}')
_FIX_RECORD = "fix or remove that record"


class CorpusError(EnvError, ValueError):
    """A corpus file or record that cannot be used; the message names file, paper and field."""


class CorpusLimits(BaseModel):
    """What one corpus file may cost to read; past any of these the load stops with an error.

    The defaults are about 100 times the local snapshot (2.7 MB gzip, 9.6 MB of JSON Lines,
    163 KB longest line, 208 lines) and keep a hostile file to about a gigabyte of memory.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_file_bytes: int = Field(
        default=1 << 30, gt=0, description="Largest corpus file on disk, in bytes (bounds hashing too).")
    max_decompressed_bytes: int = Field(
        default=1 << 30, gt=0, description="Most bytes read after decompression: JSON Lines bytes, or for "
                                   "Parquet the estimated memory of the decoded records (text plus "
                                   "a fixed cost per value); stops a decompression bomb.")
    max_line_bytes: int = Field(
        default=16 << 20, gt=0, description="Longest JSON line, in bytes, without its line end.")
    max_lines: int = Field(
        default=1_000_000, gt=0, description="Most lines (blank ones included) or Parquet rows.")


DEFAULT_LIMITS = CorpusLimits()


def _valid_unicode(v: str) -> str:
    m = _SURROGATE.search(v)
    if m:
        raise ValueError(f"holds a lone surrogate U+{ord(m.group()):04X} at character {m.start()}, "
                         "which is not Unicode text; re-export the record from its source")
    return v


#: A string that can be written back out as UTF-8.
Text = Annotated[str, AfterValidator(_valid_unicode)]


class Paragraph(BaseModel):
    """One body paragraph."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    text: Text = Field(min_length=1, description="The paragraph's text; never empty or blank.")
    section: Text = Field("", description="Innermost section heading, ``\"\"`` where none.")

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
    """One full paper: identity, licence and body paragraphs in reading order."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    paper_id: Text = Field(min_length=1, max_length=256,
                           description="``<source>:<id>``, unique in the corpus.")
    source: Text = Field(min_length=1, max_length=64,
                         description="``arxiv``, ``biorxiv``, ``medrxiv``, ``plos``, ...")
    license: Text = Field(description="SPDX-like licence, CC BY or CC0 only.")
    paragraphs: tuple[Paragraph, ...] = Field(
        min_length=1, description="Body paragraphs in reading order; at least one.")
    title: Text | None = Field(None, description="The paper's title, where known.")

    @field_validator("paper_id", "source")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("is blank")
        return v

    @model_validator(mode="after")
    def _id_names_its_source(self) -> Paper:
        # a task's family is its anchor paper's id prefix; it must be the paper's source
        if not self.paper_id.startswith(self.source + ":"):
            raise ValueError(f"paper_id {_show(self.paper_id)} does not start with its source "
                             f"{_show(self.source)} and a colon (the form is <source>:<id>)")
        return self

    @field_validator("license")
    @classmethod
    def _permissive(cls, v: str) -> str:
        if not _LICENCE_OK.match(v):
            raise ValueError(f"licence {_show(v)} is outside CC BY / CC0; "
                             "only CC-BY[-x.y] and CC0[-1.0] papers may be used")
        return v


def _show(v: object, limit: int = 60) -> str:
    """A short, safe rendering of a hostile value for an error message."""
    if isinstance(v, str):
        r = repr(v[:limit])
        return r + f"... ({len(v):,} characters)" if len(v) > limit else r
    return f"<a {type(v).__name__}>"


def _pid_label(record: dict) -> str:
    pid = record.get("paper_id")
    if isinstance(pid, str) and pid:
        return pid if len(pid) <= 60 and pid.isprintable() else _show(pid)
    return "<no paper_id>" if pid in (None, "") else f"<paper_id is {_show(pid)}>"


def _field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_paper(record: object, where: str) -> Paper:
    """Validate one raw record; the error names `where`, the paper, the field and the fix."""
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: a record must be a JSON object, got {type(record).__name__}; "
                          f"each line holds one paper {_RECORD_SHAPE}")
    try:
        return Paper.model_validate(record)
    except ValidationError as e:
        err = e.errors(include_url=False, include_input=False)[0]
        msg = err["msg"].removeprefix("Value error, ")
        raise CorpusError(f"{where}: paper {_pid_label(record)}: field '{_field_path(err['loc'])}': "
                          f"{msg}; {_FIX_RECORD}") from None


# --- reading files ------------------------------------------------------------------------


class _Refused(EnvError, ValueError):
    """Raised from inside the JSON decoder for input that is not strict JSON."""


def _refuse_constant(name: str) -> object:
    raise _Refused(f"{name} is not JSON (RFC 8259 has no NaN or Infinity); write null or a string")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"a {len(digits):,}-digit number is longer than {MAX_INT_DIGITS:,} digits; "
                       "no corpus field is a number, remove it")
    return int(digits)


def _decode_line(raw: bytes, where: str) -> object:
    """One JSON Lines line (without its BOM) to a Python value, or a CorpusError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        hint = ("the file is gzip-compressed: name it .jsonl.gz" if raw.startswith(b"\x1f\x8b")
                else "save the file as UTF-8")
        raise CorpusError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1} "
                          f"of the line); {hint}") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int)
    except _Refused as e:
        raise CorpusError(f"{where}: {e}") from None
    except json.JSONDecodeError as e:
        raise CorpusError(f"{where}: not JSON: {e.msg} (column {e.colno}); each line holds one "
                          f"paper {_RECORD_SHAPE}") from None
    except RecursionError:
        raise CorpusError(f"{where}: JSON nested deeper than the reader allows; a paper record "
                          f"is 3 levels deep: {_RECORD_SHAPE}") from None


def _read_line(fh: io.BufferedIOBase, path: Path, lineno: int, limits: CorpusLimits) -> bytes:
    """Read one line of at most ``max_line_bytes`` (+ its line end), turning stream faults into errors."""
    try:
        return fh.readline(limits.max_line_bytes + 2)
    except EOFError:
        raise CorpusError(f"{path}: the gzip stream ends early, while reading line {lineno} (the file is "
                          "truncated); download or compress it again") from None
    except (OSError, zlib.error) as e:
        if path.name.endswith(".gz"):
            raise CorpusError(f"{path}: not a readable gzip file ({e}); compress it with gzip, "
                              "or name an uncompressed file .jsonl") from None
        raise CorpusError(f"{path}: cannot be read ({e})") from None


def _over(path: Path, what: str, field: str) -> CorpusError:
    return CorpusError(f"{path}: {what}; reading stopped there. If the file is genuine, load it "
                       f"with a higher CorpusLimits.{field}")


def _jsonl_records(path: Path, fh: io.BufferedIOBase, limits: CorpusLimits) -> Iterator[tuple[object, str]]:
    total = 0
    lineno = 0
    while raw := _read_line(fh, path, lineno + 1, limits):
        lineno += 1
        total += len(raw)
        if total > limits.max_decompressed_bytes:
            raise _over(path, f"over the cap of {limits.max_decompressed_bytes:,} decompressed bytes "
                        f"by line {lineno} (a decompression bomb?)", "max_decompressed_bytes")
        if len(raw) - (2 if raw.endswith(b"\r\n") else raw.endswith(b"\n")) > limits.max_line_bytes:
            raise _over(path, f"line {lineno} is longer than the cap of {limits.max_line_bytes:,} "
                        "bytes", "max_line_bytes")
        if lineno > limits.max_lines:
            raise _over(path, f"more lines than the cap of {limits.max_lines:,}", "max_lines")
        if lineno == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        if raw.strip(_JSON_SPACE):
            where = f"{path} line {lineno}"
            yield _decode_line(raw, where), where


#: The only Parquet columns read (the `Paper` fields and the hub's aliases); others are skipped.
_PARQUET_COLUMNS = ("paper_id", "id", "source", "license", "licence", "title", "paragraphs")
#: Rough memory of one decoded Python value, beyond its text; prices lists of empty values.
_VALUE_BYTES = 64


def _pylist_bytes(arr, where: str) -> int:
    """Estimate the memory ``arr.to_pylist()`` would take, without building it.

    Decoding is where a Parquet bomb goes off: dictionary indices, run-length levels and
    empty strings cost nothing on disk but a Python object each once decoded.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    total, stack = 0, [arr]
    while stack:
        a = stack.pop()
        t = a.type
        total += _VALUE_BYTES * len(a)
        if pa.types.is_dictionary(t):
            d = a.dictionary
            binary = pa.types.is_string(t.value_type) or pa.types.is_binary(t.value_type)
            per = (pc.max(pc.binary_length(d)).as_py() or 0) if binary else _pylist_bytes(d, where)
            total += len(a) * (per + _VALUE_BYTES)
        elif (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
              or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)):
            total += pc.sum(pc.binary_length(a)).as_py() or 0
        elif (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
              or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
            stack.append(pc.list_flatten(a))
        elif pa.types.is_struct(t):
            stack.extend(a.flatten())
        elif not (pa.types.is_null(t) or pa.types.is_boolean(t) or pa.types.is_integer(t)
                  or pa.types.is_floating(t)):
            raise CorpusError(f"{where}: a value of Arrow type {t}, which no corpus field has; "
                              "write strings, or lists of strings or of {text, section} structs")
    return total


def _parquet_records(path: Path, limits: CorpusLimits) -> Iterator[tuple[object, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        meta = pf.metadata
        columns = [c for c in pf.schema_arrow.names if c in _PARQUET_COLUMNS]
        if meta.num_rows > limits.max_lines:
            raise _over(path, f"{meta.num_rows:,} rows, over the cap of {limits.max_lines:,}",
                        "max_lines")
        row = decoded = 0
        for batch in pf.iter_batches(batch_size=64, columns=columns):
            span = f"rows {row}-{row + batch.num_rows - 1}"
            decoded += sum(_pylist_bytes(col, f"{path} {span}, column '{name}'")
                           for name, col in zip(batch.schema.names, batch.columns, strict=True))
            if decoded > limits.max_decompressed_bytes:
                raise _over(path, f"over the cap of {limits.max_decompressed_bytes:,} decoded bytes "
                            f"by row {row + batch.num_rows - 1} (a decompression bomb?)",
                            "max_decompressed_bytes")
            for rec in batch.to_pylist():
                yield rec, f"{path} row {row}"
                row += 1
    except CorpusError:
        raise
    except (pa.ArrowException, OSError, ValueError, TypeError, OverflowError, KeyError,
            IndexError, MemoryError) as e:
        raise CorpusError(f"{path}: not a readable Parquet file of paper records "
                          f"({type(e).__name__}: {str(e)[:200]}); write it again with pyarrow or "
                          "pandas, or use .jsonl / .jsonl.gz") from None


def iter_records(path: str | Path, limits: CorpusLimits = DEFAULT_LIMITS,
                 ) -> Iterator[tuple[object, str]]:
    """Yield ``(raw record, where)`` from one corpus file, where = ``<path> line N`` or ``row N``.

    The file's name and size are checked now (before anyone hashes a huge file); the records
    are not validated (see `parse_paper`); every fault met while reading is a `CorpusError`.
    """
    path = Path(path)
    if not path.name.endswith((".parquet", ".jsonl.gz", ".jsonl")):
        raise CorpusError(f"{path}: unsupported corpus file; use .jsonl, .jsonl.gz or .parquet")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise CorpusError(f"{path}: cannot be read ({e.strerror})") from None
    if size > limits.max_file_bytes:
        raise _over(path, f"the file is {size:,} bytes, over the cap of {limits.max_file_bytes:,}",
                    "max_file_bytes")
    if path.name.endswith(".parquet"):
        return _parquet_records(path, limits)
    return _jsonl_file_records(path, limits)


def _jsonl_file_records(path: Path, limits: CorpusLimits) -> Iterator[tuple[object, str]]:
    try:
        fh = gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")
    except OSError as e:
        raise CorpusError(f"{path}: cannot be read ({e.strerror})") from None
    with fh:
        yield from _jsonl_records(path, fh, limits)


#: The old private name, kept for callers written before `iter_records` was public.
_iter_records = iter_records


def file_revision(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise CorpusError(f"{path}: cannot be read ({e.strerror})") from None
    return f"sha256:{h.hexdigest()}"


class Corpus:
    """Validated papers in a fixed order, with an immutable `revision`.

    `location` says where the papers came from (a path, or ``hf:<repo>``); `skipped` lists
    ``(paper_id, reason)`` for records dropped under ``skip_invalid=True`` (the record's place,
    ``<path> line N``, where it has no usable string id).
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
                raise CorpusError(f"{location}: paper {p.paper_id}: field 'paper_id' is duplicated; "
                                  "paper ids must be unique, remove one of the two records")
            seen.add(p.paper_id)
        if not self.papers:
            why = (f"all {len(self.skipped)} records were invalid, the first: {self.skipped[0][1]}"
                   if self.skipped else "the file is empty or holds only blank lines")
            raise CorpusError(f"{location}: the corpus holds no valid paper ({why}); point the "
                              f"corpus at a snapshot of paper records, e.g. {DEFAULT_CORPUS_HINT}")

    @classmethod
    def from_records(cls, records: Iterable[tuple[object, str]], *, revision: str, location: str,
                     skip_invalid: bool = False) -> Corpus:
        """Validate ``(raw record, where)`` pairs; a duplicated id names both places."""
        papers: list[Paper] = []
        skipped: list[tuple[str, str]] = []
        first_seen: dict[str, str] = {}
        for rec, where in records:
            try:
                paper = parse_paper(rec, where)
                assert isinstance(rec, dict)  # parse_paper refuses any other record
                if paper.paper_id in first_seen:
                    raise CorpusError(
                        f"{where}: paper {_pid_label(rec)}: field 'paper_id' is duplicated (first at "
                        f"{first_seen[paper.paper_id]}); paper ids must be unique, {_FIX_RECORD}")
            except CorpusError as e:
                if not skip_invalid:
                    raise
                pid = rec.get("paper_id") if isinstance(rec, dict) else None
                skipped.append((pid if isinstance(pid, str) and 0 < len(pid) <= 256 else where, str(e)))
                continue
            first_seen[paper.paper_id] = where
            papers.append(paper)
        return cls(papers, revision=revision, location=location, skipped=skipped)

    @classmethod
    def from_path(cls, path: str | Path, *, skip_invalid: bool = False,
                  limits: CorpusLimits = DEFAULT_LIMITS) -> Corpus:
        """Load a local snapshot (``.jsonl``, ``.jsonl.gz`` or ``.parquet``)."""
        p = Path(path)
        if not p.is_file():
            raise CorpusError(f"{p}: corpus file not found (the local snapshot here is "
                              f"{DEFAULT_CORPUS_HINT}, relative to the project root)")
        records = iter_records(p, limits)
        return cls.from_records(records, revision=file_revision(p), location=str(p.resolve()),
                                skip_invalid=skip_invalid)

    def sources(self) -> list[str]:
        return sorted({p.source for p in self.papers})

    def select(self, source: str | None) -> tuple[Paper, ...]:
        """Papers of one source (or all), in corpus order."""
        if source is None:
            return self.papers
        return tuple(p for p in self.papers if p.source == source)

    def __len__(self) -> int:
        return len(self.papers)
