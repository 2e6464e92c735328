"""Task generation: structure, config validation, headers and cross-process determinism."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from environment.deshuffle import (
    PARAGRAPHS_FILE,
    DeshuffleConfig,
    DeshuffleTaskset,
    analyze_ordering,
)
from environment.protocol import config_digest
from tests.conftest import ROOT


def lines(task):
    return [json.loads(x) for x in task.files[PARAGRAPHS_FILE].decode().splitlines()]


def test_task_structure(taskset3):
    for task in taskset3.tasks(0, 60):
        rows = lines(task)
        assert [r["label"] for r in rows] == list(range(1, len(rows) + 1))
        assert sorted(x for t in task.gold for x in t) == list(range(1, len(rows) + 1))
        assert len(task.gold) == task.n_papers == len(task.paper_ids) == len(set(task.paper_ids))
        assert 1 <= task.n_papers <= 3
        assert f"{task.n_papers} research papers" in task.prompt or task.n_papers == 1
        assert "\\boxed{" in task.prompt
        assert task.id == f"deshuffle-papers/{config_digest(taskset3.config)}/{task.idx}"
        assert task.family == task.paper_ids[0].split(":")[0] and task.meta == {"n_papers": task.n_papers,
                                                                                 "n_units": len(rows)}
        assert task.hash.startswith("sha256:") and len(task.hash) == 71
        oracle = task.gold[0] if task.n_papers == 1 else task.gold
        assert analyze_ordering(f"\\boxed{{{json.dumps(oracle)}}}", task.gold)[0] == 1.0


def test_the_shuffle_cannot_be_replayed_from_seed_and_idx(corpus):
    """The shuffle's stream is keyed by the papers' true-order text: the same (seed, idx) over
    a paper whose text differs by one character shuffles differently, and the old stream
    keyed by (seed, idx) alone does not give the order."""
    import hashlib
    import random

    ts = DeshuffleTaskset(DeshuffleConfig(), corpus)
    task = ts.task(0)
    m = task.n_labels
    old = random.Random(int.from_bytes(hashlib.sha256(b"deshuffle-papers:0:0").digest()[:8], "big"))
    old.random()
    units = list(range(m))
    for i in range(m - 1, 0, -1):
        j = int(old.random() * (i + 1))
        units[i], units[j] = units[j], units[i]
    replay = [0] * m
    for label, unit in enumerate(units, 1):
        replay[unit] = label
    assert tuple(replay) != task.gold[0]


def test_gold_never_leaks_into_files_or_prompt(taskset3):
    task = taskset3.task(3)
    assert "gold" not in task.prompt
    assert set(task.files) == {PARAGRAPHS_FILE}
    assert json.dumps(list(task.gold)) not in task.files[PARAGRAPHS_FILE].decode()


def test_anchor_and_paper_text_in_true_order(corpus):
    ts = DeshuffleTaskset(DeshuffleConfig(), corpus)
    n = len(corpus)
    for idx in (0, 1, n - 1, n, n + 1, 5 * n + 7):
        task = ts.task(idx)
        paper = corpus.papers[idx % n]
        assert task.paper_ids == (paper.paper_id,)
        text = {r["label"]: r["text"] for r in lines(task)}
        assert [text[x] for x in task.gold[0]] == [p.text for p in paper.paragraphs]
    assert ts.task(0).hash != ts.task(n).hash  # beyond N: a fresh shuffle of the same paper


def test_headers_are_units_before_their_section(corpus):
    ts = DeshuffleTaskset(DeshuffleConfig(include_headers=True), corpus)
    task = ts.task(0)
    paper = corpus.papers[0]
    text = {r["label"]: r["text"] for r in lines(task)}
    ordered = [text[x] for x in task.gold[0]]
    expected, current = [], ""
    for p in paper.paragraphs:
        if p.section and p.section != current:
            expected.append(p.section)
        current = p.section
        expected.append(p.text)
    assert ordered == expected and len(expected) > len(paper.paragraphs)


def test_paper_count_is_uniform_over_range(corpus):
    ts = DeshuffleTaskset(DeshuffleConfig(min_papers=1, max_papers=3), corpus)
    counts = [0, 0, 0]
    for task in ts.tasks(0, 600):
        counts[task.n_papers - 1] += 1
    assert all(150 < c < 250 for c in counts), counts


def test_source_filter(corpus):
    ts = DeshuffleTaskset(DeshuffleConfig(source="arxiv", max_papers=2), corpus)
    for task in ts.tasks(0, 20):
        assert all(pid.startswith("arxiv:") for pid in task.paper_ids)


@pytest.mark.parametrize("kwargs,field", [
    ({"min_papers": 0}, "min_papers"),
    ({"min_papers": 3, "max_papers": 2}, "max_papers"),
    ({"seed": "x"}, "seed"),
    ({"colour": 1}, "colour"),
])
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as e:
        DeshuffleConfig(**kwargs)
    assert field in str(e.value)


def test_taskset_errors_name_the_field(corpus):
    with pytest.raises(ValueError, match="source.*arxiv, biorxiv, medrxiv, plos"):
        DeshuffleTaskset(DeshuffleConfig(source="nature"), corpus)
    with pytest.raises(ValueError, match="max_papers: 40 exceeds the 39 papers"):
        DeshuffleTaskset(DeshuffleConfig(source="arxiv", max_papers=40), corpus)


def test_hash_depends_on_everything_seen(corpus):
    a = DeshuffleTaskset(DeshuffleConfig(seed=0), corpus).task(5)
    b = DeshuffleTaskset(DeshuffleConfig(seed=1), corpus).task(5)
    c = DeshuffleTaskset(DeshuffleConfig(seed=0, include_headers=True), corpus).task(5)
    assert len({a.hash, b.hash, c.hash}) == 3


SNIPPET = """
import hashlib, json, sys
from environment.deshuffle import Corpus, DeshuffleConfig, DeshuffleTaskset
ts = DeshuffleTaskset(DeshuffleConfig(min_papers=1, max_papers=3, seed=11, include_headers=True),
                      Corpus.from_path(sys.argv[1]))
out = [[t.hash, hashlib.sha256(t.files["paragraphs.jsonl"]).hexdigest()] for t in ts.tasks(0, 40)]
print(json.dumps(out))
"""


def test_byte_identical_across_processes(corpus_path):
    runs = []
    for hashseed in ("1", "2"):  # different str hash randomisation in each process
        out = subprocess.run([sys.executable, "-c", SNIPPET, str(corpus_path)], cwd=ROOT,
                             capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": hashseed, "PATH": "/usr/bin:/bin"})
        runs.append(json.loads(out.stdout))
    assert runs[0] == runs[1]
    assert len({h for h, _ in runs[0]}) == 40
