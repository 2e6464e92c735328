"""The contract's task secret closes the replay check on deshuffle-papers' shuffle.

With the public source, a guessed true order was checked by replaying the generator on it:
from the heuristic baseline's answer, every order within two moves was tried and the one
that replayed to the displayed order was the gold. These tests run that very search
(`replaylib`, which the source-peek control uses in the sandbox) on tasks of real frozen
contracts: it finds the gold when handed the contract's secret and nothing without it; the
real source-peek agent in a real bwrap sandbox, without it, finds nothing; and the secret
travels from the manifest to every place that regenerates tasks.
"""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest

from environment.deshuffle import PARAGRAPHS_FILE, DeshuffleConfig, DeshuffleTaskset
from environment.deshuffle.baseline import parse_paragraphs, solve
from environment.deshuffle.env import AGENTS, DeshuffleEnvironment
from tests.conftest import HINTS, make_ctx, make_manifest
from validate.contract.manifest import check_environment, derive, task_secret

spec = importlib.util.spec_from_file_location("replaylib", AGENTS / "replaylib.py")
replaylib = importlib.util.module_from_spec(spec)
pytestmark = pytest.mark.bwrap
spec.loader.exec_module(replaylib)

#: The task of the local corpus (default config: one paper, no headers) whose baseline answer
#: is within two moves of the gold, whatever the shuffle: found by running the baseline on
#: idx 0..59 (it is the only one there).
NEAR = 29


def texts_of(task) -> dict[int, bytes]:
    """Label → the unit's JSON text as the agent reads it off paragraphs.jsonl."""
    out = {}
    for line in task.files[PARAGRAPHS_FILE].split(b"\n"):
        if line:
            head, _, rest = line.partition(b', "text": ')
            out[int(head.split(b":")[1])] = rest[:-1]
    return out


def flat(task) -> list[int]:
    return [label for paper in task.gold for label in paper]


def baseline_answer(task) -> list[int]:
    return solve(parse_paragraphs(task.files[PARAGRAPHS_FILE].decode()), 1)[0]


@pytest.fixture(scope="module")
def contract(sandboxes):
    """A real frozen contract (its own random salt) over the default config, and its taskset."""
    manifest = make_manifest(sandboxes("bwrap"), idx=[0, 1, 2, 3, NEAR], controls=["source-peek"])
    _, _, taskset = check_environment(manifest, HINTS)
    return manifest, taskset


def test_replaylib_tracks_the_generator(contract, corpus):
    """`replaylib` is the generator's shuffle exactly (several papers and headers too), so the
    control's failure is the secret's doing, not a drift of its copy."""
    manifest, taskset = contract
    secret = task_secret(manifest.salt)
    for task in taskset.tasks(0, 4):
        assert replaylib.confirms(flat(task), texts_of(task), (secret, 0, task.idx))
        assert not replaylib.confirms(flat(task), texts_of(task), ("", 0, task.idx))
    several = DeshuffleTaskset(DeshuffleConfig(min_papers=2, max_papers=3, include_headers=True, seed=7),
                               corpus, secret="5e" * 32)
    for task in several.tasks(0, 5):
        assert replaylib.confirms(flat(task), texts_of(task), ("5e" * 32, 7, task.idx))
        assert not replaylib.confirms(flat(task), texts_of(task), ("5e" * 32, 7, task.idx + 1))


def test_the_attack_finds_the_gold_with_the_secret_and_nothing_without(contract):
    manifest, taskset = contract
    task = taskset.task(NEAR)
    start, texts = baseline_answer(task), texts_of(task)
    assert start != flat(task)
    found, tried = replaylib.search(start, texts, [(task_secret(manifest.salt), 0, NEAR)], moves=2)
    assert found == flat(task) and tried > 1
    assert taskset.score(task, f"\\boxed{{{json.dumps(found)}}}".encode()).reward == 1.0
    # Without the secret the same search goes through the whole two-move neighbourhood in vain.
    everything = sum(1 for _ in replaylib.neighbourhood(start, 2))
    assert replaylib.search(start, texts, [("", 0, NEAR)], moves=2, budget=10**6) == (None, everything)
    # A secret one bit off is as good as none.
    wrong = format(int(task_secret(manifest.salt), 16) ^ 1, "064x")
    assert replaylib.search(start, texts, [(wrong, 0, NEAR)], moves=2, budget=10**6)[0] is None


def test_source_peek_finds_nothing_in_bwrap_without_the_secret(contract, sandboxes, tmp_path):
    manifest, _ = contract
    from validate.run.phases import RunPhase, run_agents

    run_agents(make_ctx(manifest, sandboxes("bwrap"), tmp_path / "run"), RunPhase(agents="controls"))
    a = pd.read_parquet(tmp_path / "run/attempts.parquet")
    assert len(a) == len(manifest.tasks) and (a["agent"] == "source-peek").all()
    assert (a["status"] == "no_reply").all() and (a["reward"].fillna(0.0) == 0.0).all()
    for row in a.itertuples():
        # It did search (the replays it tried are counted) and confirmed nothing.
        assert "no order confirmed" in row.stderr and int(row.stderr.split()[1]) >= 500, row.stderr


def test_every_contract_regenerates_its_tasks_with_its_own_secret(contract, sandboxes):
    """Freeze and verify agree (same hashes); a child contract inherits the secret; another
    contract of the same config and idx shuffles differently; no secret replays nothing."""
    manifest, taskset = contract
    env = DeshuffleEnvironment()
    child = derive(manifest, env, taskset, name="child", idx=[NEAR], rule="test")
    assert child.salt == manifest.salt and child.tasks[0] == manifest.tasks[-1]
    _, _, again = check_environment(child, HINTS)
    assert again.task(NEAR).files == taskset.task(NEAR).files
    other = make_manifest(sandboxes("bwrap"), idx=[NEAR], controls=["source-peek"])
    assert other.tasks[0].id == manifest.tasks[-1].id and other.tasks[0].hash != manifest.tasks[-1].hash
    plain = env.load(DeshuffleConfig(corpus=str(HINTS.search[0])), HINTS).task(NEAR)
    assert plain.files != taskset.task(NEAR).files
    assert replaylib.confirms(flat(plain), texts_of(plain), ("", 0, NEAR))  # why a contract needs its secret
