"""Shared fixtures: the real local corpus (never a copy), and the taskset over it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from environment.deshuffle import Corpus, DeshuffleConfig, DeshuffleTaskset

ROOT = Path(__file__).resolve().parents[1]
CORPUS_PATH = Path(os.environ.get("DESHUFFLE_CORPUS", ROOT.parent / "shared/corpus/papers.jsonl.gz"))


@pytest.fixture(scope="session")
def corpus_path() -> Path:
    assert CORPUS_PATH.is_file(), f"the local corpus is missing at {CORPUS_PATH} (set DESHUFFLE_CORPUS)"
    return CORPUS_PATH


@pytest.fixture(scope="session")
def corpus(corpus_path) -> Corpus:
    return Corpus.from_path(corpus_path)


@pytest.fixture(scope="session")
def taskset3(corpus) -> DeshuffleTaskset:
    return DeshuffleTaskset(DeshuffleConfig(min_papers=1, max_papers=3, include_headers=True), corpus)
