"""Corpus loading: formats, revisions, record validation, and the offline hub failure."""

from __future__ import annotations

import gzip
import json
import re
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environment.deshuffle import HUB_REVISION, Corpus, CorpusError
from environment.deshuffle.corpus import DEFAULT_LIMITS, CorpusLimits
from environment.deshuffle.hub import iter_hub_file, load_hub, map_hub_record


def good(pid="arxiv:1", **over):
    rec = {"paper_id": pid, "source": "arxiv", "license": "CC-BY-4.0",
           "paragraphs": [{"text": "First.", "section": "Intro"}, {"text": "Second.", "section": ""}]}
    rec.update(over)
    return rec


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_real_corpus(corpus):
    assert len(corpus) == 208
    assert corpus.revision == "sha256:22aa9e884032c97d8b27ae760bada917298754efb14693504048e26537f14c77"
    assert corpus.sources() == ["arxiv", "biorxiv", "medrxiv", "plos"]
    assert sum(len(p.paragraphs) for p in corpus.papers) == 9976


def test_three_formats_give_same_papers(tmp_path):
    recs = [good("arxiv:1"), good("arxiv:2", license="CC0-1.0")]
    a = Corpus.from_path(write_jsonl(tmp_path / "c.jsonl", recs))
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in recs))
    b = Corpus.from_path(tmp_path / "c.jsonl.gz")
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "c.parquet")
    c = Corpus.from_path(tmp_path / "c.parquet")
    assert a.papers == b.papers == c.papers
    assert len({a.revision, b.revision, c.revision}) == 3


@pytest.mark.parametrize("record,message", [
    (good(paragraphs=[]), "paper arxiv:1: field 'paragraphs'"),
    (good(paragraphs=[{"text": ""}]), "paper arxiv:1: field 'paragraphs\\[0\\].text'"),
    (good(paragraphs=[{"text": "ok"}, {"section": "x"}]), "paper arxiv:1: field 'paragraphs\\[1\\].text'"),
    (good(paragraphs=[{"text": "   "}]), "paper arxiv:1: field 'paragraphs\\[0\\].text'"),
    (good(license="CC-BY-NC-4.0"), "paper arxiv:1: field 'license'.*outside CC BY / CC0"),
    (good(license="CC-BY-SA-4.0"), "field 'license'"),
    ({k: v for k, v in good().items() if k != "license"}, "field 'license'"),
])
def test_invalid_record_names_paper_and_field(tmp_path, record, message):
    path = write_jsonl(tmp_path / "c.jsonl", [good("arxiv:0"), record])
    with pytest.raises(CorpusError, match=message) as e:
        Corpus.from_path(path)
    assert "line 2" in str(e.value)


def test_skip_invalid_counts_and_reports(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [good("arxiv:0"), good("arxiv:1", license="GPL"),
                                              good("arxiv:2", paragraphs=[])])
    c = Corpus.from_path(path, skip_invalid=True)
    assert [p.paper_id for p in c.papers] == ["arxiv:0"]
    assert [pid for pid, _ in c.skipped] == ["arxiv:1", "arxiv:2"]
    assert "license" in c.skipped[0][1] and "paragraphs" in c.skipped[1][1]


def test_bad_files(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        Corpus.from_path(tmp_path / "missing.jsonl")
    (tmp_path / "c.csv").write_text("x")
    with pytest.raises(CorpusError, match="unsupported"):
        Corpus.from_path(tmp_path / "c.csv")
    (tmp_path / "bad.jsonl").write_text('{"paper_id": \n')
    with pytest.raises(CorpusError, match="line 1: not JSON"):
        Corpus.from_path(tmp_path / "bad.jsonl")
    with pytest.raises(CorpusError, match="duplicated"):
        Corpus.from_path(write_jsonl(tmp_path / "d.jsonl", [good("arxiv:1"), good("arxiv:1")]))
    # a task's family is read from its anchor paper's id: the id must name the paper's source
    with pytest.raises(CorpusError, match="does not start with its source"):
        Corpus.from_path(write_jsonl(tmp_path / "s.jsonl", [good("plos:1")]))


def test_hub_unreachable_fails_fast_with_guidance(tmp_path):
    """A hub that accepts the connection and never answers (a loopback socket this test
    opens; never the real hub, whose reachability depends on the machine)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        t0 = time.monotonic()
        with pytest.raises(CorpusError) as e:
            load_hub(cache_dir=tmp_path, timeout_s=2.0, endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}")
        assert time.monotonic() - t0 < 10  # the timeout holds: no retry loop or hang
    msg = str(e.value)
    assert HUB_REVISION in msg and "PrimeIntellect/deshuffle-papers-v1-corpus" in msg
    assert "--corpus" in msg and "local snapshot" in msg


def test_hub_field_mapping():
    rec = map_hub_record({"id": "2101.1", "source": "arxiv", "licence": "CC0-1.0",
                          "paragraphs": ["a", "b"]})
    assert rec["paper_id"] == "arxiv:2101.1" and rec["license"] == "CC0-1.0"
    assert rec["paragraphs"] == [{"text": "a"}, {"text": "b"}]


# --- hostile files: every fault is a CorpusError naming the file, the place and the fix -------

GOOD_LINE = json.dumps(good("arxiv:0")).encode() + b"\n"


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


#: name, file bytes, what the error must say. These ended in a traceback (exit 3) before.
ISSUE_FILES = [
    ("utf8.jsonl", GOOD_LINE + b'{"paper_id": "arxiv:\xff"}\n',
     r"utf8\.jsonl line 2: not UTF-8 \(byte 0xff at byte 21 of the line\); save the file as UTF-8"),
    ("truncated.jsonl.gz",
     _gz(b"".join(json.dumps(good(f"arxiv:{i}")).encode() + b"\n" for i in range(50)))[:-9],
     r"truncated\.jsonl\.gz: the gzip stream ends early.*truncated.*compress it again"),
    ("plain.jsonl.gz", GOOD_LINE,
     r"plain\.jsonl\.gz: not a readable gzip file.*name an uncompressed file \.jsonl"),
    ("garbage.parquet", b"PAR1" + bytes(range(256)) * 4,
     r"garbage\.parquet: not a readable Parquet file.*use \.jsonl / \.jsonl\.gz"),
    ("deep.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n", r"deep\.jsonl line 1: JSON nested deeper"),
    ("digits.jsonl", b'{"paper_id": ' + b"7" * 5000 + b"}\n",
     r"digits\.jsonl line 1: a 5,000-digit number is longer than 4,300 digits; .* remove it"),
    ("nan.jsonl", GOOD_LINE[:-2] + b', "n_paragraphs": NaN}\n',
     r"nan\.jsonl line 1: NaN is not JSON.*write null or a string"),
    ("inf.jsonl", b'{"title": -Infinity}\n', r"inf\.jsonl line 1: -Infinity is not JSON"),
    ("packed.jsonl", _gz(GOOD_LINE),
     r"packed\.jsonl line 1: not UTF-8.*gzip-compressed: name it \.jsonl\.gz"),
    ("bom2.jsonl", GOOD_LINE + b"\xef\xbb\xbf" + GOOD_LINE, r"bom2\.jsonl line 2: not JSON"),
    ("empty.parquet", b"", r"empty\.parquet: not a readable Parquet file"),
]


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("name,data,message", ISSUE_FILES, ids=[f[0] for f in ISSUE_FILES])
def test_unreadable_file_is_a_corpus_error_even_when_skipping(tmp_path, name, data, message, skip):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(CorpusError, match=message):
        Corpus.from_path(tmp_path / name, skip_invalid=skip)


@pytest.mark.parametrize("name,data,message", ISSUE_FILES[:7], ids=[f[0] for f in ISSUE_FILES[:7]])
def test_cli_exits_2_naming_the_file(tmp_path, name, data, message):
    (tmp_path / name).write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "validate.cli", "freeze", "--name", "x", "--corpus", name],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert name in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("field_path,message", [
    (("paragraphs", 0, "section"), r"field 'paragraphs\[0\]\.section': .*lone surrogate U\+D800"),
    (("title",), r"field 'title': .*lone surrogate U\+D800"),
    (("paragraphs", 1, "text"), r"field 'paragraphs\[1\]\.text'"),
])
def test_lone_surrogate_is_refused_naming_the_field(tmp_path, field_path, message):
    rec = good("arxiv:1")
    target = rec
    for part in field_path[:-1]:
        target = target[part]
    target[field_path[-1]] = "ok \ud800"
    path = write_jsonl(tmp_path / "s.jsonl", [good("arxiv:0"), rec])  # json.dumps escapes it: valid JSON
    with pytest.raises(CorpusError, match=r"s\.jsonl line 2: paper arxiv:1: " + message):
        Corpus.from_path(path)
    assert [p.paper_id for p in Corpus.from_path(path, skip_invalid=True).papers] == ["arxiv:0"]


def test_line_separators_inside_text_load_and_round_trip(tmp_path):
    text = "before\u2028after\u2029para\x85next\x0bvt\x0cff\x1crs end"
    recs = [good("arxiv:1", paragraphs=[{"text": text, "section": "S\u2028T"}]), good("arxiv:2")]
    raw = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()
    assert "\u2028".encode() in raw  # the separators are in the file as themselves, not escaped
    (tmp_path / "u.jsonl").write_bytes(raw)
    (tmp_path / "u.jsonl.gz").write_bytes(_gz(raw))
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "u.parquet")
    loaded = [Corpus.from_path(tmp_path / n) for n in ("u.jsonl", "u.jsonl.gz", "u.parquet")]
    for c in loaded:
        assert [p.paper_id for p in c.papers] == ["arxiv:1", "arxiv:2"]
        assert c.papers[0].paragraphs[0].text == text and c.papers[0].paragraphs[0].section == "S\u2028T"
    back = tmp_path / "back.jsonl"
    back.write_bytes(b"".join(json.dumps(p.model_dump(), ensure_ascii=False).encode() + b"\n"
                              for p in loaded[0].papers))
    assert Corpus.from_path(back).papers == loaded[0].papers


def test_bom_crlf_blank_lines_and_no_final_newline_are_accepted(tmp_path):
    body = (b"\xef\xbb\xbf" + json.dumps(good("arxiv:1")).encode() + b"\r\n \t\r\n\r\n"
            + json.dumps(good("arxiv:2")).encode())
    (tmp_path / "w.jsonl").write_bytes(body)
    (tmp_path / "w.jsonl.gz").write_bytes(_gz(body))
    for name in ("w.jsonl", "w.jsonl.gz"):
        assert [p.paper_id for p in Corpus.from_path(tmp_path / name).papers] == ["arxiv:1", "arxiv:2"]
    # form feed: not JSON space
    (tmp_path / "x.jsonl").write_bytes(body.replace(b"\r\n\r\n", b"\r\n\x0c\r\n"))
    with pytest.raises(CorpusError, match=r"x\.jsonl line 3: not JSON"):
        Corpus.from_path(tmp_path / "x.jsonl")


@pytest.mark.parametrize("name,data", [("e.jsonl", b""), ("b.jsonl", b" \n\n\t\r\n"),
                                       ("e.jsonl.gz", _gz(b"")), ("bom.jsonl", b"\xef\xbb\xbf\n")])
def test_empty_or_blank_file_names_the_file_and_the_fix(tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(CorpusError, match=re.escape(name) + r": the corpus holds no valid paper \(the file "
                       r"is empty or holds only blank lines\); point the corpus at"):
        Corpus.from_path(tmp_path / name)


def test_all_invalid_under_skip_says_why(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [good("arxiv:1", license="GPL"), good("arxiv:2", paragraphs=[])])
    with pytest.raises(CorpusError,
                       match=r"all 2 records were invalid, the first: .*a\.jsonl line 1: paper arxiv:1"):
        Corpus.from_path(path, skip_invalid=True)


def test_duplicate_id_names_both_lines(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [good("arxiv:1"), good("arxiv:2"), good("arxiv:1")])
    with pytest.raises(CorpusError, match=r"d\.jsonl line 3: paper arxiv:1: field 'paper_id' is duplicated "
                                          r"\(first at .*d\.jsonl line 1\); paper ids must be unique"):
        Corpus.from_path(path)
    c = Corpus.from_path(path, skip_invalid=True)
    assert [p.paper_id for p in c.papers] == ["arxiv:1", "arxiv:2"] and c.skipped[0][0] == "arxiv:1"


def test_wrong_types_name_the_field_and_stay_short(tmp_path):
    recs = [good("arxiv:0"), good("arxiv:1", paper_id=["arxiv:1"]), good("arxiv:2", title=7),
            good("arxiv:3", source="  "), good("arxiv:4", license="X" * 1_000_000),
            good("arxiv:5", paragraphs={"text": "x"}), good("arxiv:6", paragraphs=["bare string"]),
            good("y" * 5000), [good("arxiv:8")]]
    c = Corpus.from_path(write_jsonl(tmp_path / "t.jsonl", recs), skip_invalid=True)
    assert [p.paper_id for p in c.papers] == ["arxiv:0"]
    want = ["paper <paper_id is <a list>>: field 'paper_id'", "paper arxiv:2: field 'title'",
            "paper arxiv:3: field 'source': is blank", "paper arxiv:4: field 'license': licence 'XXX",
            "paper arxiv:5: field 'paragraphs'", "paper arxiv:6: field 'paragraphs[0]'",
            "field 'paper_id': String should have at most 256 characters",
            "a record must be a JSON object, got list"]
    reasons = [r for _, r in c.skipped]
    assert len(reasons) == len(want)
    assert [pid for pid, _ in c.skipped][:3] == [f"{tmp_path / 't.jsonl'} line 2", "arxiv:2", "arxiv:3"]
    for lineno, (reason, needle) in enumerate(zip(reasons, want, strict=True), 2):
        assert f"t.jsonl line {lineno}: " in reason and needle in reason, reason[:300]
        assert len(reason) < 600, reason[:700]
        assert reason.endswith("fix or remove that record") or "JSON object" in reason


# --- caps: what a hostile file can cost -------------------------------------------------------

def gz_bomb(path, chunk: bytes, expanded_bytes: int):
    """A small .gz that expands to `expanded_bytes`: one compressed member, repeated (RFC 1952)."""
    member = _gz(chunk)
    with open(path, "wb") as fh:
        for _ in range(expanded_bytes // len(chunk)):
            fh.write(member)
    return path


# The child's own peak: Linux carries ru_maxrss over fork and exec from a (large) parent, so
# the peak is reset first (clear_refs 5) and read back as VmHWM.
_LOAD_AND_MEASURE = """
import json, re, sys
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
from environment.deshuffle import Corpus, CorpusError
try:
    Corpus.from_path(sys.argv[1])
    msg = None
except CorpusError as e:
    msg = str(e)
with open("/proc/self/status") as f:
    peak_kb = int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1))
print(json.dumps({"error": msg, "max_rss_mb": peak_kb / 1024}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("chunk,message", [
    (b"\0" * (1 << 20), r"line 1 is longer than the cap of 16,777,216 bytes; reading stopped there\. "
                        r"If the file is genuine, load it with a higher CorpusLimits\.max_line_bytes"),
    (b"\n" * (1 << 20), r"more lines than the cap of 1,000,000; .*CorpusLimits\.max_lines"),
    ((b" " * ((64 << 10) - 1) + b"\n") * 16,
     r"over the cap of 1,073,741,824 decompressed bytes by line 16385 \(a decompression bomb\?\); "
     r".*CorpusLimits\.max_decompressed_bytes"),
], ids=["one-endless-line", "endless-blank-lines", "wide-blank-lines"])
def test_gzip_bomb_stops_at_the_default_caps_in_bounded_memory(tmp_path, chunk, message):
    bomb = gz_bomb(tmp_path / "bomb.jsonl.gz", chunk, 4 << 30)
    assert bomb.stat().st_size < 10 << 20  # under 10 MB on disk, 4 GiB once inflated
    r = subprocess.run([sys.executable, "-c", _LOAD_AND_MEASURE, str(bomb)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["error"] and re.search(r"bomb\.jsonl\.gz: " + message, out["error"]), out["error"]
    assert out["max_rss_mb"] < 400, out  # the 16 MiB line cap, not the 4 GiB the file expands to


def test_caps_are_exact_and_say_which_limit_to_raise(tmp_path):
    line = json.dumps(good("arxiv:1"))
    limits = CorpusLimits(max_line_bytes=len(line))
    (tmp_path / "fits.jsonl").write_text(line + "\r\n")  # the cap counts the record, not its line end
    assert len(Corpus.from_path(tmp_path / "fits.jsonl", limits=limits)) == 1
    (tmp_path / "long.jsonl").write_text(line + " \n")
    with pytest.raises(CorpusError, match=rf"long\.jsonl: line 1 is longer than the cap of {len(line)} "
                                          r"bytes.*CorpusLimits\.max_line_bytes"):
        Corpus.from_path(tmp_path / "long.jsonl", limits=limits)
    with pytest.raises(CorpusError,
                       match=r"long\.jsonl: the file is \d+ bytes, over the cap of 10; .*max_file_bytes"):
        Corpus.from_path(tmp_path / "long.jsonl", limits=CorpusLimits(max_file_bytes=10))
    many = write_jsonl(tmp_path / "many.jsonl", [good(f"arxiv:{i}") for i in range(4)])
    assert len(Corpus.from_path(many, limits=CorpusLimits(max_lines=4))) == 4
    with pytest.raises(CorpusError, match=r"more lines than the cap of 3;.*max_lines"):
        Corpus.from_path(many, limits=CorpusLimits(max_lines=3))
    with pytest.raises(CorpusError, match=r"decompressed bytes by line 2 .*max_decompressed_bytes"):
        Corpus.from_path(many, limits=CorpusLimits(max_decompressed_bytes=len(line) + 2))
    with pytest.raises(ValueError):
        CorpusLimits(max_lines=0)


@pytest.mark.slow
def test_parquet_bombs_are_priced_before_they_are_decoded(tmp_path):
    def lists(values, n_rows):  # n_rows lists splitting `values` evenly, built without Python lists
        step = len(values) // n_rows
        return pa.ListArray.from_arrays(pa.array(range(0, len(values) + 1, step), pa.int32()), values)

    pq.write_table(pa.table({"paragraphs": lists(pa.nulls(20_000_000), 20)}), tmp_path / "nulls.parquet")
    pq.write_table(pa.table({"paragraphs": lists(pa.repeat("", 20_000_000), 20)}),
                   tmp_path / "empties.parquet")
    n = 2_000  # every row's title is the one 1 MiB dictionary value: 2 GiB once decoded
    titles = pa.DictionaryArray.from_arrays(pa.repeat(0, n).cast(pa.int32()), pa.array(["x" * (1 << 20)]))
    pq.write_table(pa.table({"title": titles, "paper_id": pa.array([f"a:{i}" for i in range(n)])}),
                   tmp_path / "dict.parquet")
    cases = [("nulls.parquet", DEFAULT_LIMITS), ("empties.parquet", DEFAULT_LIMITS),
             ("dict.parquet", CorpusLimits(max_decompressed_bytes=64 << 20))]
    for name, limits in cases:
        assert (tmp_path / name).stat().st_size < 2 << 20
        with pytest.raises(CorpusError, match=re.escape(name) + r": over the cap of "
                           rf"{limits.max_decompressed_bytes:,} decoded bytes by row \d+ \(a decompression "
                           r"bomb\?\).*max_decompressed_bytes"):
            Corpus.from_path(tmp_path / name, skip_invalid=True, limits=limits)
    pq.write_table(pa.table({"paper_id": pa.array(["a:1"] * 5)}), tmp_path / "rows.parquet")
    with pytest.raises(CorpusError, match=r"rows\.parquet: 5 rows, over the cap of 4;.*max_lines"):
        Corpus.from_path(tmp_path / "rows.parquet", limits=CorpusLimits(max_lines=4))


def test_parquet_reads_only_corpus_columns_and_names_a_bad_one(tmp_path):
    recs = [good("arxiv:1"), good("arxiv:2")]
    table = pa.Table.from_pylist(recs).append_column("published", pa.array([1, 2], pa.timestamp("s")))
    pq.write_table(table, tmp_path / "extra.parquet")  # a column no paper field reads is never decoded
    assert [p.paper_id for p in Corpus.from_path(tmp_path / "extra.parquet").papers] == ["arxiv:1", "arxiv:2"]
    bad = pa.Table.from_pylist(recs).set_column(3, "title", pa.array([1, 2], pa.timestamp("s")))
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(CorpusError, match=r"bad\.parquet rows 0-1, column 'title': a value of Arrow type "
                                          r"timestamp\[\w+\], which no corpus field has"):
        Corpus.from_path(tmp_path / "bad.parquet")


# --- the hub path --------------------------------------------------------------------------

def test_hub_mapping_never_turns_a_wrong_type_into_an_id():
    base = {"source": "arxiv", "license": "CC0-1.0", "paragraphs": ["a"]}
    assert map_hub_record({**base, "id": 5})["paper_id"] == "arxiv:5"
    for bad in (True, [1], {"x": 1}, 1.5):
        rec = map_hub_record({**base, "id": bad})
        assert rec["paper_id"] == bad
        with pytest.raises(CorpusError, match=r"hub line 1: paper <paper_id is <a \w+>>: field 'paper_id'"):
            Corpus.from_records([(rec, "hub line 1")], revision="r", location="hf:x")
    assert map_hub_record({**base, "id": "7", "source": ["arxiv"]})["paper_id"] == "7"


def test_hub_file_fault_names_the_hub_file(tmp_path):
    lines = b"".join(json.dumps(good(f"arxiv:{i}")).encode() + b"\n" for i in range(3))
    (tmp_path / "part-0.jsonl.gz").write_bytes(_gz(lines)[:-5])
    with pytest.raises(CorpusError, match=r"^hf:repo@rev/data/part-0\.jsonl\.gz: .*part-0\.jsonl\.gz: "
                                          r"the gzip stream ends early"):
        Corpus.from_records(iter_hub_file("repo@rev/data/part-0.jsonl.gz", tmp_path / "part-0.jsonl.gz"),
                            revision="r", location="hf:repo")
    (tmp_path / "part-1.jsonl").write_bytes(json.dumps({"id": "9", "source": "plos", "licence": "CC-BY-4.0",
                                                        "paragraphs": ["one", "two"]}).encode() + b"\n")
    c = Corpus.from_records(iter_hub_file("repo@rev/part-1.jsonl", tmp_path / "part-1.jsonl"),
                            revision="r", location="hf:repo")
    assert c.papers[0].paper_id == "plos:9" and [p.text for p in c.papers[0].paragraphs] == ["one", "two"]
