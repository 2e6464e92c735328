"""twohop-env's dataset: counts, ids, determinism, gold recomputed, invented names, identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from environment.protocol import ConfigError, LoadHints, Task, Taskset
from environment.twohop import TwohopConfig, TwohopEnvironment
from environment.twohop.dataset import CATEGORY_COUNTS, FACTS_FILE, build_dataset, facts_text
from environment.twohop.solver import UNKNOWN, resolve
from environment.twohop.universe import TYPES, parse_facts

ENV = TwohopEnvironment()


@pytest.fixture(scope="module")
def taskset():
    return ENV.load(TwohopConfig())


@pytest.fixture(scope="module")
def tasks(taskset):
    return [taskset.task(i) for i in range(taskset.size)]


def test_counts_per_category_are_the_seeds(tasks):
    assert Counter(t.family for t in tasks) == Counter(CATEGORY_COUNTS)
    assert CATEGORY_COUNTS == {"twohop": 10, "threehop": 6, "distractor": 6, "broken": 5, "aggregate": 5,
                               "reverse": 4}


def test_ids_are_th_000_to_th_035_under_the_config_digest(taskset, tasks):
    digest = TwohopConfig().digest
    assert [t.id for t in tasks] == [f"twohop-env/{digest}/th-{i:03d}" for i in range(36)]
    assert [r["task_id"] for r in taskset.dataset.rows()] == [f"th-{i:03d}" for i in range(36)]


def test_numbering_is_shuffled_across_categories(tasks):
    """th-NNN must not say the category: no category occupies a contiguous block."""
    families = [t.family for t in tasks]
    blocks = sum(1 for a, b in zip(families, families[1:], strict=False) if a != b) + 1
    assert blocks > 2 * len(CATEGORY_COUNTS)


def test_the_taskset_and_tasks_satisfy_the_seam(taskset, tasks):
    assert isinstance(taskset, Taskset)
    assert all(isinstance(t, Task) for t in tasks)
    assert taskset.size == 36 and taskset.metric_names == ("parsed_ok", "exact_match")
    assert taskset.revision.startswith("sha256:") and len(taskset.revision) == 71


def test_expected_outputs_are_the_reference_solvers(taskset, tasks):
    facts = parse_facts(facts_text(tasks[0].files[FACTS_FILE].decode()))
    assert facts == list(taskset.dataset.universe.facts)
    for t, row in zip(tasks, taskset.dataset.rows(), strict=True):
        assert resolve(facts, t.question).rows == t.rows
        assert json.loads(row["expected_output"]) == {"rows": list(t.rows)}
        assert json.loads(t.answer_key) == {"rows": list(t.rows)}
        assert row["prompt"] == t.prompt and row["category"] == t.family
    assert [t.rows for t in tasks if t.family == "broken"] == [(UNKNOWN,)] * 5
    assert all(t.rows != (UNKNOWN,) for t in tasks if t.family != "broken")
    assert all(len(t.rows) >= 2 for t in tasks if t.family == "aggregate")
    assert all(len(t.rows) == 1 for t in tasks if t.family != "aggregate")
    assert all(list(t.rows) == sorted(t.rows) for t in tasks)


def test_the_dataset_hashes_the_protocols_canonical_json(taskset):
    from environment.protocol import canonical_json, sha256_tag

    assert taskset.revision == sha256_tag(canonical_json(taskset.dataset.rows()))


def test_the_universe_is_invented_and_well_typed(taskset):
    u = taskset.dataset.universe
    names = [*u.people, *u.organisations, *u.cities, *u.countries]
    assert len(names) == len(set(names))
    words = [w for n in names for w in n.split(" ") if w not in {"Foundry", "Collective", "Works", "Labs",
                                                                 "Trust", "Guild", "Systems", "Partners"}]
    assert len(words) == len(set(words)), "a word is reused across names"
    for a in words:
        assert a[0].isupper() and a != a.lower()
        assert not any(a.lower() in b.lower() for b in words if b != a), f"{a} hides inside another name"
    for f in u.facts:
        subject_type, object_type = TYPES[f.relation]
        assert f.subject in u.of_type(subject_type) and f.object in u.of_type(object_type)
    subjects = Counter((f.relation, f.subject) for f in u.facts)
    assert max(subjects.values()) == 1, "every relation is functional in its subject"


def test_every_task_shows_the_same_minimal_meta(taskset, tasks):
    n_facts = len(taskset.dataset.universe.facts)
    assert {json.dumps(t.meta, sort_keys=True) for t in tasks} == {json.dumps({"n_facts": n_facts})}
    assert all(t.requires_network_isolation for t in tasks)
    assert len({t.files[FACTS_FILE] for t in tasks}) == 1


def test_broken_prompts_read_like_answerable_ones(tasks):
    def template(t):
        return t.prompt.replace(t.question.subject, "{}")

    answerable = {template(t) for t in tasks if t.family != "broken"}
    assert all(template(t) in answerable for t in tasks if t.family == "broken")


_DUMP = ("import hashlib, sys; from environment.twohop.dataset import build_dataset, canonical_json; "
         "d = build_dataset(int(sys.argv[1])); "
         "print(d.revision, hashlib.sha256(canonical_json(d.rows())).hexdigest())")


@pytest.mark.parametrize("seed", [0, 7, 123456789])
def test_bytes_are_identical_across_processes_and_hash_seeds(seed):
    outs = set()
    for hash_seed in ("0", "1", "4242", "random"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outs.add(subprocess.run([sys.executable, "-c", _DUMP, str(seed)], env=env, capture_output=True,
                                text=True, check=True).stdout)
    assert len(outs) == 1
    assert outs.pop().split()[0] == build_dataset(seed).revision


def test_other_seeds_build_other_universes_that_pass_every_check():
    revisions = set()
    for seed in range(1, 9):
        ts = ENV.load(TwohopConfig(seed=seed))
        revisions.add(ts.revision)
        tasks = [ts.task(i) for i in range(ts.size)]
        assert Counter(t.family for t in tasks) == Counter(CATEGORY_COUNTS)
        assert [f for t in tasks for f in ENV.findings(t)] == []
        assert not [f for f in ENV.dataset_findings(ts, tasks) if f.blocking]
    assert len(revisions) == 8 and ENV.load(TwohopConfig()).revision not in revisions


def test_ids_and_hashes_differ_between_configs():
    a, b = ENV.load(TwohopConfig()), ENV.load(TwohopConfig(seed=1))
    ids_a = {a.task(i).id for i in range(36)}
    assert not ids_a & {b.task(i).id for i in range(36)}
    assert len({a.task(i).hash for i in range(36)} | {b.task(i).hash for i in range(36)}) == 72


def test_the_hash_covers_the_gold(taskset):
    import dataclasses

    t = taskset.task(3)
    assert t.hash == taskset.task(3).hash
    assert dataclasses.replace(t, rows=("Somewhere",)).hash != t.hash
    assert dataclasses.replace(t, prompt=t.prompt + " ").hash != t.hash


def test_a_contract_with_another_revision_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="revision"):
        ENV.load(TwohopConfig(), LoadHints(revision="sha256:" + "0" * 64))
    assert ENV.load(TwohopConfig(), LoadHints(revision=build_dataset(0).revision)).size == 36


def test_bad_config_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match="seed"):
        ENV.load({"seed": -1})
    with pytest.raises(ConfigError, match="colour"):
        ENV.load({"colour": "blue"})
    with pytest.raises(IndexError, match="idx"):
        ENV.load(TwohopConfig()).task(36)


def test_build_verify_prints_the_seeds_summary(tmp_path, tasks):
    chains = sum(len(resolve(t.universe.facts, t.question).chains) for t in tasks if t.family != "broken")
    assert chains > 31, "an aggregate contributes one chain per person listed"
    out = tmp_path / "tasks.jsonl"
    proc = subprocess.run([sys.executable, "-m", "environment.twohop.build", "--verify", "--out", str(out)],
                          capture_output=True, text=True)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "twohop 10, threehop 6, distractor 6, broken 5, aggregate 5, reverse 4" in proc.stdout
    assert f"36/36, {chains} chains proved multi-hop" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == build_dataset(0).rows()
    bad = subprocess.run([sys.executable, "-m", "environment.twohop.build", "--seed", "-1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--seed" in bad.stderr and "Traceback" not in bad.stderr
