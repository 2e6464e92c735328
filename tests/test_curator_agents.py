"""Every curator agent, run for real: a subprocess ``python3 -S agent.py`` as the sandbox's
user, on every task, in an attempt directory laid out by the harness's own
`validate.run.workspace.lay_out` (workspace, agent dir with agentlib and support files, answer
key only for agents that see it, the source tree only for the one that sees it), with the
sandbox's environment variables pointing at those directories. Scored in intruders-only mode."""

from __future__ import annotations

import shutil
from statistics import mean

import pytest

from environment.curator import CuratorConfig, CuratorEnvironment
from environment.curator.env import AGENTS, PACKAGE_DIR
from environment.curator.validate_dataset import dataset_report, random_expectation
from tests.agent_play import attempt_base, run_agent
from validate.agents import source_files

pytestmark = pytest.mark.slow
ENV = CuratorEnvironment()
BY_NAME = {a.name: a for a in AGENTS}


@pytest.fixture(scope="module")
def taskset():
    return ENV.load(CuratorConfig())


@pytest.fixture(scope="module")
def tasks(taskset):
    return [taskset.task(i) for i in range(taskset.size)]


@pytest.fixture(scope="module")
def base():
    root = attempt_base()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def play(name, tasks, taskset, base, source=None):
    agent = BY_NAME[name]
    return [taskset.score(t, run_agent(agent, t, base, source)) for t in tasks]


def chance(tasks) -> float:
    return mean(random_expectation(len(t.row["info"]["items"]), len(t.gold))[0] for t in tasks)


def test_every_agent_is_declared_with_what_it_tests():
    roles = {a.name: a.role for a in AGENTS}
    assert roles["oracle"] == "oracle" and roles["probe-half"] == "probe"
    assert {n for n, r in roles.items() if r == "control"} == {
        "empty", "random-count", "tfidf-outlier", "length-outlier", "decoy-theme", "source-peek"}
    for a in AGENTS:
        assert a.program.is_file() and all(p.is_file() for p in a.support) and a.tests
    assert BY_NAME["source-peek"].sees_source and not BY_NAME["source-peek"].sees_answer_key
    assert not BY_NAME["empty"].sees_answer_key


def test_oracle_reaches_full_reward_everywhere(tasks, taskset, base):
    scores = play("oracle", tasks, taskset, base)
    assert all(s.reward == 1.0 and s.metrics["format_ok"] == 1.0 for s in scores)


def test_probe_lands_strictly_between(tasks, taskset, base):
    scores = play("probe-half", tasks, taskset, base)
    assert all(s.reward == 0.5 and s.metrics["format_ok"] == 1.0 for s in scores)


def test_empty_and_decoy_controls_earn_nothing(tasks, taskset, base):
    for name in ("empty", "decoy-theme"):
        scores = play(name, tasks, taskset, base)
        ceiling = BY_NAME[name].ceiling or 1.0
        assert all(s.reward == 0.0 < ceiling for s in scores), name
    decoy = play("decoy-theme", tasks[:5], taskset, base)
    assert all(s.metrics["format_ok"] == 1.0 for s in decoy)  # right format, wrong belief


@pytest.mark.parametrize("name, validator_key", [("tfidf-outlier", "tfidf"), ("length-outlier", "length")])
def test_shortcut_controls_are_the_validator_baselines_and_stay_under_random(name, validator_key, tasks,
                                                                             taskset, base, capsys):
    scores = play(name, tasks, taskset, base)
    got = mean(s.metrics["intruder_jaccard"] for s in scores)
    assert got == pytest.approx(dataset_report([t.row for t in tasks]).baselines[validator_key])
    assert got < chance(tasks)
    hits = sum(s.reward >= 1.0 for s in scores)
    with capsys.disabled():
        print(f"\n{name}: mean reward {got:.3f} (random told the count {chance(tasks):.3f}); "
              f"{hits}/{len(scores)} tasks exactly right")
    assert hits / len(scores) <= 0.1


def test_random_control_earns_chance(tasks, taskset, base, capsys):
    scores = play("random-count", tasks, taskset, base)
    got = mean(s.reward for s in scores)
    hits = sum(s.reward >= 1.0 for s in scores)
    with capsys.disabled():
        print(f"\nrandom-count: mean reward {got:.3f} (expected {chance(tasks):.3f}); "
              f"{hits}/{len(scores)} exact")
    assert all(s.metrics["format_ok"] == 1.0 for s in scores)
    assert abs(got - chance(tasks)) < 0.1  # 45 seeded draws around the exact expectation
    # a lucky exact guess is the only way over the pass threshold
    assert all(s.reward < 1.0 or s.metrics["exact_match"] == 1.0 for s in scores)


def test_source_peek_cannot_beat_random_with_the_code(tasks, taskset, base):
    source = source_files(ENV)
    rels = {rel for rel, _ in source}
    assert "taskset.py" in rels and "agents/source_peek.py" in rels
    assert not any(rel.startswith("specs/") for rel in rels)
    # nor any other file naming an intruder (a review of the dataset did, by name)
    from environment.curator.themes import load_specs

    texts = {rel: path.read_text(encoding="utf-8") for rel, path in source}
    named = sorted({(spec.spec_id, i.title, rel) for spec in load_specs() for i in spec.intruders
                    for rel, text in texts.items() if i.title in text})
    assert named == []
    scores = play("source-peek", tasks, taskset, base, source=source)
    assert mean(s.reward for s in scores) <= chance(tasks)
    assert sum(s.reward >= 1.0 for s in scores) <= 0.15 * len(scores)


def test_source_peek_is_a_real_control_it_reads_specs_when_they_are_in_view(tasks, taskset, base):
    """With the whole package (specs included) it answers every task: the hand-authored gold
    is data, which is why `source_files` leaves ``specs/`` out (see the report)."""
    full = sorted((p.relative_to(PACKAGE_DIR).as_posix(), p) for p in PACKAGE_DIR.rglob("*.json"))
    scores = play("source-peek", tasks[:10], taskset, base, source=full)
    assert all(s.metrics["exact_match"] == 1.0 for s in scores)


def test_source_files_are_the_code_without_the_specs():
    rels = [rel for rel, _ in ENV.source_files()]
    assert "env.py" in rels and "taskset.py" in rels and not any(r.startswith("specs/") for r in rels)
    assert dict(ENV.source_files())["taskset.py"].read_bytes() == (PACKAGE_DIR / "taskset.py").read_bytes()
