"""Fuzz the corpus loaders: over 10,000 generated corpus lines, and only success or CorpusError.

Every line is built from the real corpus (shrunk records, wrong types in every field, mutated
bytes) or from nothing (random bytes, NaN, huge and deep values, invalid UTF-8, over-long
lines), then packed into small corpus files in tmp_path: JSON Lines (with BOMs, CRLF, blank
lines, duplicated ids, empty and only-blank files), gzip (sound, truncated, corrupted, not
gzip at all) and Parquet (sound and corrupted). Each file is loaded through the local loader
and, for a share of them, through the hub's per-file reader. Where a line's kind is known the
outcome is checked exactly (which papers load, which are skipped, that it fails); where it is
not (random mutations), only that nothing but `CorpusError` comes out. A loaded corpus must
also survive a round trip through UTF-8 JSON Lines. Seeded (`random.Random(SEED)`), so a
failure names a case that replays.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environment.deshuffle import Corpus, CorpusError
from environment.deshuffle.corpus import CorpusLimits
from environment.deshuffle.hub import iter_hub_file
from tests.conftest import CORPUS_PATH

SEED = 20_240_611
N_FILES = 3_200
MIN_LINES = 10_000
#: Small enough that over-long lines, line counts and bombs are cheap to reach.
LIMITS = CorpusLimits(max_file_bytes=8 << 20, max_decompressed_bytes=4 << 20,
                      max_line_bytes=256 << 10, max_lines=2_000)

VALID, INVALID, REFUSED, UNKNOWN = "valid", "invalid", "refused", "unknown"
# VALID: a paper that must load. INVALID: JSON that is not a paper (skipped under
# skip_invalid). REFUSED: a line the reader refuses even under skip_invalid (not UTF-8, not
# strict JSON, over a cap). UNKNOWN: a random mutation, any outcome but a traceback.

WRONG_TYPES = [None, True, 0, -7, 1.5, 10 ** 300, "", "   ", "\ud800", [], {}, ["x"], {"text": "x"},
               [[["deep"]]], [1, 2, 3]]
BAD_UTF8 = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\xc0\xaf"]


@dataclass
class Line:
    raw: bytes
    kind: str
    pid: str | None = None  # the paper id a VALID line must load as


@dataclass
class Case:
    name: str
    lines: list[Line] = field(default_factory=list)
    blob: bytes = b""
    must_fail: bool = False  # a fault of the file itself (truncated gzip, not gzip, ...)
    unknown: bool = False  # the file's bytes were mutated after packing


def _seeds() -> list[dict]:
    out = []
    with gzip.open(CORPUS_PATH, "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            rec["paragraphs"] = [dict(p, text=p["text"][:300]) for p in rec["paragraphs"][:4]]
            out.append(rec)
    return out


class Gen:
    """Corpus lines of known kind; ids are made unique so duplicates happen only on purpose."""

    def __init__(self, rng: random.Random, seeds: list[dict]) -> None:
        self.rng, self.seeds, self.n = rng, seeds, 0

    def record(self) -> dict:
        self.n += 1
        rec = json.loads(json.dumps(self.rng.choice(self.seeds)))
        rec["paper_id"] = f"{rec['paper_id']}#{self.n}"
        return rec

    def dump(self, value: object) -> bytes:
        # backslashreplace writes a lone surrogate as its JSON escape, so the line stays UTF-8
        return json.dumps(value, ensure_ascii=self.rng.random() < 0.5).encode("utf-8", "backslashreplace")

    def valid(self) -> Line:
        r, rec = self.rng, self.record()
        tweak = r.randrange(8)
        if tweak == 0:
            rec["paragraphs"][0]["section"] = None
        elif tweak == 1:
            rec["paragraphs"][0]["text"] += " a\u2028b\u2029c \U0001f600 \x00"
        elif tweak == 2:
            rec["extra"] = json.loads("[" * 60 + "]" * 60)
        elif tweak == 3:
            rec["extra"] = [10 ** 4000, 1e308, "\ud800", "x" * r.randrange(50_000)]
        elif tweak == 4:
            rec["title"] = None
        elif tweak == 5:
            rec = dict(reversed(list(rec.items())))
        return Line(self.dump(rec), VALID, rec["paper_id"])

    def wrong_type(self) -> Line:
        r, rec = self.rng, self.record()
        value = r.choice(WRONG_TYPES)
        spot = r.choice(["paper_id", "source", "license", "title", "paragraphs", "para", "text",
                         "section", "missing"])
        if spot == "missing":
            del rec[r.choice(["paper_id", "source", "license", "paragraphs"])]
        elif spot == "para":
            rec["paragraphs"][r.randrange(len(rec["paragraphs"]))] = r.choice([None, 1, "x", [], ["x"]])
        elif spot in ("text", "section"):
            para = rec["paragraphs"][r.randrange(len(rec["paragraphs"]))]
            para[spot] = value if value is not None or spot == "text" else 3
            if spot == "section" and isinstance(para[spot], str) and para[spot] != "\ud800":
                para[spot] = 3  # a string section is valid; keep the line invalid
        elif spot == "title" and (value is None or (isinstance(value, str) and value != "\ud800")):
            rec["title"] = 7
        elif spot == "paragraphs" and value == {"text": "x"}:
            rec["paragraphs"] = "x"
        else:
            rec[spot] = value
        if spot == "license" and value == "":
            rec["license"] = "CC-BY-NC-4.0"
        return Line(self.dump(rec), INVALID)

    def not_object(self) -> Line:
        return Line(self.dump(self.rng.choice([[self.record()], "paper", 42, None, True, []])), INVALID)

    def refused(self) -> Line:
        r, rec = self.rng, self.record()
        k = r.randrange(6)
        if k == 0:
            rec[r.choice(["paper_id", "extra", "title"])] = r.choice(
                [float("nan"), float("inf"), -float("inf")]
            )
            return Line(self.dump(rec), REFUSED)
        if k == 1:
            digits = "9" * r.randrange(4301, 6000)
            return Line(self.dump(rec)[:-1] + b', "n": ' + digits.encode() + b"}", REFUSED)
        if k == 2:
            depth = r.randrange(20_000, 100_001)
            return Line(b'{"paper_id": ' + b"[" * depth + b"]" * depth + b"}", REFUSED)
        if k == 3:
            raw = self.dump(rec)
            at = raw.index(b'"text": "') + 9
            return Line(raw[:at] + r.choice(BAD_UTF8) + raw[at:], REFUSED)
        if k == 4:  # over the line cap by a little or a lot
            pad = LIMITS.max_line_bytes + r.choice([1, 2, 1000, 300_000])
            return Line(b'{"x": "' + b"a" * (pad - 9) + b'"}', REFUSED)
        return Line(b'{"paper_id": ' + b"[" * r.randrange(1, 50), REFUSED)  # cut short: not JSON

    def random_bytes(self) -> Line:
        r = self.rng
        raw = r.randbytes(r.randrange(1, 120)).replace(b"\n", b" ")
        return Line(raw, UNKNOWN)

    def mutated(self) -> Line:
        r = self.rng
        raw = bytearray(self.dump(self.record()))
        for _ in range(r.randrange(1, 6)):
            if not raw:
                break
            op, at = r.randrange(4), r.randrange(len(raw))
            if op == 0:
                raw[at] = r.randrange(256)
            elif op == 1:
                raw.insert(at, r.choice(b'{}[]",:\\0e-.\x00\xff \t'))
            elif op == 2:
                del raw[at:at + r.randrange(1, 50)]
            else:
                raw = raw[:at]
        return Line(bytes(raw).replace(b"\n", b" "), UNKNOWN)

    def bad_unicode(self) -> Line:
        """A lone surrogate (valid JSON escape, not Unicode) in one of the text fields."""
        rec = self.record()
        para = self.rng.choice(rec["paragraphs"])
        where, key = self.rng.choice([(rec, "paper_id"), (rec, "source"), (rec, "license"),
                                      (rec, "title"), (para, "text"), (para, "section")])
        where[key] = (where[key] or "x") + self.rng.choice(["\ud800", "\udfff", "\udc80x"])
        return Line(self.dump(rec), INVALID)

    def line(self, known_only: bool = False) -> Line:
        """A line of any kind; `known_only` leaves out those whose outcome no one can tell."""
        kinds = [self.valid, self.wrong_type, self.bad_unicode, self.not_object, self.refused,
                 self.random_bytes, self.mutated]
        weights = [40, 20, 5, 3, 10, 0 if known_only else 10, 0 if known_only else 17]
        return self.rng.choices(kinds, weights)[0]()


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def build_case(gen: Gen, i: int) -> Case:
    r = gen.rng
    shape = r.choices(["jsonl", "gz", "parquet", "empty", "blank", "many-blank", "bomb"],
                      [70, 16, 6, 2, 2, 2, 2])[0]
    if shape == "parquet":
        return _parquet_case(gen, i)
    case = Case(f"c{i}.jsonl.gz" if shape in ("gz", "bomb") else f"c{i}.jsonl")
    if shape == "bomb":  # blank lines past the decompressed-bytes cap, from a small file
        n = LIMITS.max_decompressed_bytes // (64 << 10) + 1
        case.blob, case.must_fail = _gzip((b" " * ((64 << 10) - 1) + b"\n") * n), True
        return case
    if shape in ("jsonl", "gz"):
        known_only = r.random() < 0.5
        case.lines = [gen.line(known_only) for _ in range(r.randrange(1, 8))]
        if r.random() < 0.1:
            valid = [ln for ln in case.lines if ln.kind == VALID]
            if valid:
                case.lines.insert(r.randrange(len(case.lines) + 1), r.choice(valid))
    eol = b"\r\n" if r.random() < 0.2 else b"\n"
    body = b"".join(ln.raw + eol + (r.choice([b"", b"  \t", b"\r"]) + eol if r.random() < 0.1 else b"")
                    for ln in case.lines)
    if shape == "blank":
        body = b" \n\t\n\r\n\n" * r.randrange(1, 5)
    elif shape == "many-blank":
        body, case.must_fail = b"\n" * (LIMITS.max_lines + r.randrange(1, 50)), True
    if body and r.random() < 0.1:
        body = body.rstrip(b"\r\n")
    if r.random() < 0.1:
        body = b"\xef\xbb\xbf" + body
    case.blob = body
    if shape == "gz":
        case.blob = _gzip(body)
        damage = r.random()
        if damage < 0.1:
            case.blob, case.must_fail = case.blob[:r.randrange(len(case.blob))], True
        elif damage < 0.15:
            case.blob, case.must_fail = body or b"x", True  # plain text under a .gz name
        elif damage < 0.25:
            case.blob, case.unknown = _flip(r, case.blob), True
    return case


def _flip(r: random.Random, blob: bytes) -> bytes:
    raw = bytearray(blob)
    for _ in range(r.randrange(1, 8)):
        raw[r.randrange(len(raw))] = r.randrange(256)
    return bytes(raw)


def _parquet_case(gen: Gen, i: int) -> Case:
    r = gen.rng
    recs = [gen.record() for _ in range(r.randrange(1, 6))]
    lines = [Line(b"", VALID, rec["paper_id"]) for rec in recs]
    if r.random() < 0.3:
        j = r.randrange(len(recs))
        recs[j]["license"], lines[j] = "CC-BY-ND-4.0", Line(b"", INVALID)
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(recs), buf)
    case = Case(f"c{i}.parquet", lines, buf.getvalue())
    if r.random() < 0.4:
        case.blob, case.unknown = (_flip(r, case.blob) if r.random() < 0.7
                                   else case.blob[:r.randrange(len(case.blob))]), True
    return case


def expected(case: Case, skip: bool, via_hub: bool = False) -> list[str] | None:
    """The paper ids that must load, None where the load must fail; raises LookupError if unknown.

    Through the hub an INVALID line may be valid (it maps bare ids and string paragraphs).
    """
    kinds = {ln.kind for ln in case.lines}
    if case.must_fail or REFUSED in kinds:
        return None
    if case.unknown or UNKNOWN in kinds or (via_hub and INVALID in kinds):
        raise LookupError
    ids = [ln.pid for ln in case.lines if ln.kind == VALID]
    if not skip and (INVALID in kinds or len(set(ids)) < len(ids)):
        return None
    ids = list(dict.fromkeys(ids))
    return ids or None


def round_trip(corpus: Corpus, tmp_path) -> None:
    path = tmp_path / "round-trip.jsonl"
    path.write_bytes(b"".join(json.dumps(p.model_dump(), ensure_ascii=False).encode("utf-8") + b"\n"
                              for p in corpus.papers))
    assert Corpus.from_path(path, limits=LIMITS).papers == corpus.papers


def check_case(case: Case, tmp_path, skip: bool, via_hub: bool) -> str:
    """Load one case; only success or CorpusError, and the outcome the oracle knows, if it does."""
    path = tmp_path / case.name
    path.write_bytes(case.blob)
    try:
        if via_hub:
            corpus = Corpus.from_records(iter_hub_file(f"fuzz/{case.name}", path, LIMITS),
                                         revision="fuzz", location=f"hf:fuzz/{case.name}", skip_invalid=skip)
        else:
            corpus = Corpus.from_path(path, skip_invalid=skip, limits=LIMITS)
    except CorpusError as e:
        msg = str(e)
        assert case.name in msg, f"{case.name}: the error does not name the file: {msg[:300]}"
        assert len(msg) < 1500, f"{case.name}: a {len(msg):,}-character error message"
        outcome = None
    except Exception as e:  # noqa: BLE001 - the point of the test
        raise AssertionError(f"{case.name} (skip_invalid={skip}, hub={via_hub}): "
                             f"{type(e).__name__}: {str(e)[:300]}") from e
    else:
        assert len({p.paper_id for p in corpus.papers}) == len(corpus)
        round_trip(corpus, tmp_path)
        outcome = [p.paper_id for p in corpus.papers]
    try:
        want = expected(case, skip, via_hub)
    except LookupError:
        want = "any"
    if want != "any":
        assert outcome == want, (f"{case.name} (skip_invalid={skip}, hub={via_hub}): "
                                 f"loaded {outcome}, expected {want}")
    return ("loaded" if outcome is not None else "failed") + (" (unknown)" if want == "any" else "")


def run_fuzz(seed: int, n_files: int, work_dir: Path) -> dict[str, int]:
    """Build and load `n_files` cases in `work_dir`; the outcome counts, plus ``lines`` thrown in."""
    rng = random.Random(seed)
    gen = Gen(rng, _seeds())
    counts: dict[str, int] = {"lines": 0}
    for i in range(n_files):
        case = build_case(gen, i)
        counts["lines"] += max(len(case.lines), 1)
        skip, via_hub = rng.random() < 0.5, rng.random() < 0.25
        outcome = check_case(case, work_dir, skip, via_hub)
        counts[outcome] = counts.get(outcome, 0) + 1
        (work_dir / case.name).unlink()
    return counts


def test_fuzz_corpus_loaders(tmp_path):
    t0, c0 = time.perf_counter(), time.process_time()
    counts = run_fuzz(SEED, N_FILES, tmp_path)
    print(f"\n{counts['lines']:,} corpus lines in {N_FILES:,} files in {time.perf_counter() - t0:.1f} s "
          f"({time.process_time() - c0:.1f} s CPU): {counts}")
    assert counts["lines"] >= MIN_LINES
    for outcome in ("loaded", "failed"):  # the oracle decided plenty of cases both ways
        assert counts.get(outcome, 0) > N_FILES // 10, counts


@pytest.mark.parametrize("skip", [False, True])
def test_fuzz_expectations_are_not_vacuous(skip):
    """The oracle itself: a valid-only case loads, a refused line always fails."""
    ok = Case("a.jsonl", [Line(b"", VALID, "x:1"), Line(b"", VALID, "x:2")])
    assert expected(ok, skip) == ["x:1", "x:2"]
    bad = Case("b.jsonl", [Line(b"", VALID, "x:1"), Line(b"", INVALID)])
    assert expected(bad, skip) == (["x:1"] if skip else None)
    assert expected(Case("c.jsonl", [Line(b"", VALID, "x:1"), Line(b"", REFUSED)]), skip) is None
