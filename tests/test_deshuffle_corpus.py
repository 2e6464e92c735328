"""Corpus loading: formats, revisions, record validation, and the offline hub failure."""

from __future__ import annotations

import gzip
import json
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environment.deshuffle import HUB_REVISION, Corpus, CorpusError
from environment.deshuffle.hub import map_hub_record


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


def test_hub_unreachable_fails_fast_with_guidance(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(CorpusError) as e:
        Corpus.from_hub(cache_dir=tmp_path)
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert HUB_REVISION in msg and "PrimeIntellect/deshuffle-papers-v1-corpus" in msg
    assert "--corpus" in msg and "local snapshot" in msg


def test_hub_field_mapping():
    rec = map_hub_record({"id": "2101.1", "source": "arxiv", "licence": "CC0-1.0",
                          "paragraphs": ["a", "b"]})
    assert rec["paper_id"] == "arxiv:2101.1" and rec["license"] == "CC0-1.0"
    assert rec["paragraphs"] == [{"text": "a"}, {"text": "b"}]
