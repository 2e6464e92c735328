"""Shared fixtures: the real local corpus (never a copy), and the taskset over it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from environment.deshuffle import Corpus, DeshuffleConfig, DeshuffleTaskset

pytest_plugins = ["tests.dockerd"]  # the suite's own dockerd: it never touches the machine's

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


# --- harness fixtures -------------------------------------------------------------------

from validate.agents import CONTROLS, AgentSpec, resolve  # noqa: E402
from validate.contract import CorpusSpec, EnvironmentSpec, freeze  # noqa: E402
from validate.paths import DEFAULT_IMAGE, RunPaths  # noqa: E402
from validate.runner import RunContext  # noqa: E402
from validate.sandbox import Limits, open_sandbox  # noqa: E402

AGENTS_DIR = Path(__file__).resolve().parent / "agents"
SANDBOX_BACKENDS = [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bwrap", marks=pytest.mark.bwrap)]


def hostile(name: str) -> AgentSpec:
    """An agent program of tests/agents/, run as a control (it must never pass)."""
    return AgentSpec(name=name, program=str(AGENTS_DIR / f"{name.replace('-', '_')}.py"), expect="reject",
                     description=f"hostile test agent {name}")


@pytest.fixture(scope="session")
def sandboxes():
    opened: dict[str, object] = {}

    def get(backend: str):
        if backend not in opened:
            opened[backend] = open_sandbox(backend, image=DEFAULT_IMAGE, run_label="pytest")
        return opened[backend]

    yield get
    for sb in opened.values():
        sb.close()


def make_manifest(corpus, corpus_path, sandbox, *, idx, limits=None, infra_retries=2, **config):
    from environment.deshuffle import DeshuffleConfig

    env = EnvironmentSpec(config=DeshuffleConfig(**config),
                          corpus=CorpusSpec(kind="local", location=str(corpus_path), revision=corpus.revision))
    return freeze(name="pytest", env=env, idx=idx, rule="test selection", facts=sandbox.facts(), corpus=corpus,
                  control_max_reward=dict.fromkeys(CONTROLS), limits=limits or Limits(),
                  infra_retries=infra_retries)


def make_ctx(manifest, sandbox, taskset, run_dir, phase="controls") -> RunContext:
    return RunContext(manifest=manifest, sandbox=sandbox, taskset=taskset, paths=RunPaths(run_dir),
                      run_id=run_dir.name, phase=phase, image_digest=manifest.execution.image_digest,
                      backoff_s=(0.05, 0.2))


__all__ = ["CONTROLS", "hostile", "make_ctx", "make_manifest", "resolve"]
