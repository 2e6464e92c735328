"""Shared fixtures: the real local corpus (never a copy), environments registered the way a
third party registers one (an entry point of an installed distribution), sandboxes, and
contracts built through the real freeze."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from environment.deshuffle import Corpus, DeshuffleConfig, DeshuffleTaskset
from environment.deshuffle.env import find_corpus
from environment.deshuffle.generate import DEFAULT_CORPUS
from environment.protocol import ConfigError, LoadHints

pytest_plugins = ["tests.dockerd", "tests.podmand"]  # the suite's own dockerd and rootless podman service

ROOT = Path(__file__).resolve().parents[1]


def _corpus_path() -> Path:
    """The corpus the README's main job reads, found the same way: beside the checkout
    (``../shared/corpus/``), else in ``$VALIDATE_DATA_DIR`` (a checkout elsewhere, /tmp say)."""
    try:
        return find_corpus(DEFAULT_CORPUS, LoadHints())
    except ConfigError:
        return ROOT.parent / "shared/corpus/papers.jsonl.gz"  # the fixture says what is missing


CORPUS_PATH = Path(os.path.abspath(_corpus_path()))
HINTS = LoadHints(search=(CORPUS_PATH,))

# Environments and a sandbox backend that live in tests/, registered through entry-point groups
# exactly as a third-party distribution registers its own: a dist-info folder on sys.path.
TEST_DIST = Path(__file__).resolve().parent / "_dist"
ENTRY_POINTS = """[validate.environments]
toy = tests.toyenv:ToyEnvironment
deshuffle-hostile = tests.hostile:HostileDeshuffle

toy-insandbox = tests.toykind:ToyInSandbox

[validate.backends]
toy = tests.toybackend:ToyBackend

[validate.executors]
toy-reversed = tests.toyexecutor:ReversedJsonExecutor

[validate.attempt_kinds]
toy-insandbox = tests.toykind:InSandboxKind
"""


def _install_test_dist() -> Path:
    info = TEST_DIST / "validate_test_environments-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: validate-test-environments\nVersion: 0.0.0\n"
    )
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    for p in (str(TEST_DIST), str(ROOT)):
        if p not in sys.path:
            sys.path.append(p)
    return TEST_DIST


_install_test_dist()


#: The command line, run by this very interpreter (no reliance on what PATH holds).
VALIDATE = [sys.executable, "-m", "validate.cli"]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a `validate` subprocess: it sees the test environments too."""
    path = os.pathsep.join([str(TEST_DIST), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, **extra}


@pytest.fixture(scope="session")
def corpus_path() -> Path:
    assert CORPUS_PATH.is_file(), (f"the local corpus is neither at {CORPUS_PATH} nor in $VALIDATE_DATA_DIR: "
                                   f"set VALIDATE_DATA_DIR to the folder holding papers.jsonl.gz")
    return CORPUS_PATH


@pytest.fixture(scope="session")
def corpus(corpus_path) -> Corpus:
    return Corpus.from_path(corpus_path)


@pytest.fixture(scope="session")
def taskset3(corpus) -> DeshuffleTaskset:
    return DeshuffleTaskset(DeshuffleConfig(min_papers=1, max_papers=3, include_headers=True), corpus)


# --- harness fixtures -------------------------------------------------------------------

from validate.contract.manifest import check_environment, freeze  # noqa: E402
from validate.core import environments  # noqa: E402
from validate.core.paths import DEFAULT_IMAGE, RunPaths  # noqa: E402
from validate.evidence.patches import code_state  # noqa: E402
from validate.run.context import RunContext  # noqa: E402
from validate.run.executors import make_executor  # noqa: E402
from validate.run.phases import PoolPhase, pool  # noqa: E402
from validate.sandbox import Limits, open_sandbox  # noqa: E402


def _confining_backends() -> list[str]:
    """The backends this project registers (pyproject.toml; not a test's) that confine the
    agent, network included: each is tested under the marker of its own name."""
    from importlib.metadata import entry_points

    from validate.sandbox import backend_class

    ours = {ep.name for ep in entry_points(group="validate.backends")
            if ep.dist is not None and ep.dist.name == "deshuffle-validate"}
    return sorted(name for name in ours if backend_class(name).isolates_network)


def _has_sessions(name: str) -> bool:
    from validate.sandbox import backend_class

    return getattr(backend_class(name), "live_sessions", True)


SANDBOX_BACKENDS = [pytest.param(name, marks=getattr(pytest.mark, name)) for name in _confining_backends()]
assert SANDBOX_BACKENDS, (
    "no confining sandbox backend is registered: is the project installed? (pip install -e .)"
)
#: Those of them with live sessions (docker-gvisor refuses them: tests/test_gvisor.py).
SESSION_SANDBOX_BACKENDS = [p for p in SANDBOX_BACKENDS if _has_sessions(p.values[0])]


@pytest.fixture(scope="session")
def sandboxes():
    opened: dict[str, object] = {}

    def get(backend: str):
        if backend not in opened:
            # One label per session: another session's sweep must not take this one's sandboxes.
            opened[backend] = open_sandbox(backend, image=DEFAULT_IMAGE, run_label=f"pytest-{os.getpid()}")
        return opened[backend]

    yield get
    for sb in opened.values():
        sb.close()


def make_manifest(sandbox, *, idx, env_name="deshuffle-papers", controls=None, limits=None, ceilings=None,
                  exception_rule="strict", infra_retries=2, min_task_count=None, oracle_repeats=1,
                  verifier_mode="trusted", **config):
    """A contract through the real freeze; a task-directory dataset's with its trial profile
    (`verifier_mode`, as `validate freeze --verifier-mode` records it)."""
    from validate.api import trial_profile

    env = environments.get(env_name)
    cfg = env.Config.model_validate({"corpus": str(CORPUS_PATH), **config} if env_name.startswith("deshuffle")
                                    else config)
    trial = {"trial": trial_profile(verifier_mode)} if env.attempt_kind == "trial" else {}
    return freeze(name="pytest", env_name=env_name, config=cfg, hints=HINTS, idx=idx, rule="test selection",
                  facts=sandbox.facts(), controls=controls, ceilings=ceilings, exception_rule=exception_rule,
                  min_task_count=min_task_count, git_commit=code_state().label, limits=limits or Limits(),
                  infra_retries=infra_retries, oracle_repeats=oracle_repeats, **trial)


def make_ctx(manifest, sandbox, run_dir, concurrency: int = 4, executor: str = "threads") -> RunContext:
    env, _, taskset = check_environment(manifest, HINTS)
    return RunContext(env=env, manifest=manifest, taskset=taskset, sandbox=sandbox, paths=RunPaths(run_dir),
                      run_id=run_dir.name, code=code_state(), hints=HINTS, backoff_s=(0.05, 0.2),
                      executor=make_executor(executor, concurrency))


AGENTS_DIR = ROOT / "tests" / "agents"


def hostile(name: str):
    """A hostile agent of tests/agents/ (or a deshuffle agent), as the hostile environment declares it."""
    env = environments.get("deshuffle-hostile")
    specs = {a.name: a for a in env.agents(env.Config())}
    return specs[name.replace("_", "-")]


@pytest.fixture(scope="session")
def passed_pool(tmp_path_factory, sandboxes):
    """A pool of 5 deshuffle tasks on bwrap whose dataset verdict is PASS (its smoke test run
    for real): what an eval is frozen on. Built once per session; the tests only read it."""
    base = tmp_path_factory.mktemp("evalpool")
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[0, 1, 2, 3, 4], max_papers=2)
    summary = pool(make_ctx(manifest, sandbox, base / "pool"), PoolPhase(manifest_dir=base, smoke_sample=1),
                   log=lambda m: None)
    assert summary.dataset_verdict.verdict == "PASS", summary.dataset_verdict.headline
    return base / "pool"


@pytest.fixture(scope="session")
def reported_pool(tmp_path_factory, sandboxes):
    """A pool of 4 deshuffle tasks on bwrap (smoke test skipped) with its report, the same one
    tests/test_audit.py and tests/test_view.py each made: built once per session; a module
    copies it (``shutil.copytree``) before writing anything, and takes its contract from the
    copy's manifest.json (`validate.contract.manifest.load_manifest`)."""
    from validate.report.run import write_report

    run_dir = tmp_path_factory.mktemp("reportedpool") / "pool"
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=[0, 1, 2, 3], max_papers=2)
    pool(make_ctx(manifest, sandbox, run_dir), PoolPhase())
    write_report(run_dir)
    return run_dir
