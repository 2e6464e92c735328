"""curator's dataset: the real specs, the seeded builder, the splits and the validator."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from environment.curator.build import build_rows, dataset_bytes, eval_spec_ids, revision
from environment.curator.themes import SPECS_DIR, TIERS, load_specs
from environment.curator.validate_dataset import (
    dataset_findings,
    dataset_report,
    random_expectation,
    row_findings,
    table,
    theme_leaks,
)
from environment.protocol import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def specs():
    return load_specs()


@pytest.fixture(scope="module")
def rows(specs):
    return build_rows(specs, 0)


def test_spec_counts(specs):
    assert len(specs) >= 40
    tiers = Counter(s.difficulty for s in specs)
    domains = Counter(s.domain for s in specs)
    assert set(tiers) == set(TIERS) and min(tiers.values()) >= 10, tiers
    assert len(domains) >= 5, domains
    for s in specs:
        assert 8 <= len(s.members) <= 10 and 1 <= len(s.intruders) <= 3, s.spec_id
        assert all(i.why.strip() for i in s.intruders)


def test_rows_structure(rows, specs):
    assert len(rows) == len(specs)
    for r in rows:
        items = r["info"]["items"]
        assert 8 <= len(items) <= 12
        assert [it["id"] for it in items] == [chr(65 + k) for k in range(len(items))]
        gold = [it["id"] for it in items if it["is_intruder"]]
        assert 1 <= len(gold) <= 2
        assert r["answer"] == ",".join(sorted(gold))
        assert [m["role"] for m in r["prompt"]] == ["system", "user"]
        assert set(r["info"]) == {"spec_id", "theme", "decoy", "difficulty", "domain", "split", "items"}
        assert all(("why" in it) == it["is_intruder"] for it in items)
        assert row_findings(r) == []
    # both intruder counts occur, so the builder's draw is not stuck at one value
    assert {len(r["answer"].split(",")) for r in rows} == {1, 2}


def test_build_is_deterministic_across_processes(rows):
    code = ("from environment.curator.build import build_rows, revision;"
            "from environment.curator.themes import load_specs;"
            "print(revision(build_rows(load_specs(), {seed})))")
    for seed in (0, 7):
        out = subprocess.run([sys.executable, "-c", code.format(seed=seed)], cwd=ROOT, capture_output=True,
                             text=True, check=True,
                             env={"PYTHONHASHSEED": str(seed + 11), "PATH": "/usr/bin"})
        assert out.stdout.strip() == revision(build_rows(load_specs(), seed))
    assert revision(rows) != revision(build_rows(load_specs(), 1))  # the seed matters


def test_build_cli_writes_the_revisioned_jsonl(tmp_path, rows):
    out = tmp_path / "curator.jsonl"
    subprocess.run([sys.executable, "-m", "environment.curator.build", "-o", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    assert out.read_bytes() == dataset_bytes(rows)
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows


def test_splits_hold_out_a_fifth_of_each_tier_theme_disjoint(specs, rows):
    held = eval_spec_ids(specs)
    for tier in TIERS:
        ids = [s.spec_id for s in specs if s.difficulty == tier]
        assert len(held & set(ids)) == int(0.2 * len(ids) + 0.5)
    train = {r["info"]["spec_id"] for r in rows if r["info"]["split"] == "train"}
    evals = {r["info"]["spec_id"] for r in rows if r["info"]["split"] == "eval"}
    assert evals == held and not train & evals and train | evals == {s.spec_id for s in specs}
    train_titles = {it["title"] for r in rows if r["info"]["split"] == "train" for it in r["info"]["items"]}
    eval_titles = {it["title"] for r in rows if r["info"]["split"] == "eval" for it in r["info"]["items"]}
    assert not train_titles & eval_titles
    # the split is the spec's, not the seed's
    assert [r["info"]["split"] for r in build_rows(specs, 3)] == [r["info"]["split"] for r in rows]


def test_validator_on_the_real_dataset(rows, capsys):
    rep = dataset_report(rows)
    with capsys.disabled():
        print("\n" + table(rep))
    assert rep.leaks == 0 and rep.near_duplicates == []
    assert rep.position_p > 0.01
    assert rep.baselines["tfidf"] <= rep.baselines["random"]
    assert rep.baselines["length"] <= rep.baselines["random"]
    assert dataset_findings(rows) == []


def test_shortcuts_stay_below_random_across_seeds(specs):
    """Not one lucky sample: the mean over 20 builder seeds."""
    reps = [dataset_report(build_rows(specs, seed)) for seed in range(20)]
    mean = {k: sum(r.baselines[k] for r in reps) / len(reps) for k in ("random", "tfidf", "length")}
    assert mean["tfidf"] < mean["random"] and mean["length"] < mean["random"], mean


def test_random_expectation_is_exact():
    assert random_expectation(10, 1) == pytest.approx((0.1, 0.1))
    mean, exact = random_expectation(10, 2)
    assert exact == pytest.approx(1 / 45)
    assert mean == pytest.approx(1 / 45 + (16 / 45) / 3)


def _row(rows, spec_id):
    return json.loads(json.dumps(next(r for r in rows if r["info"]["spec_id"] == spec_id)))


def test_validator_catches_a_planted_leak(rows):
    row = _row(rows, "music-woodwinds")
    member = next(it for it in row["info"]["items"] if not it["is_intruder"])
    member["description"] += " A woodwind."
    assert theme_leaks(row) == ["woodwind"]
    # the prompt no longer matches the edited item either: both are caught
    assert [f.kind for f in row_findings(row)] == ["malformed_row", "theme_word_leak"]


def test_validator_catches_structural_faults(rows):
    row = _row(rows, "games-no-chance")
    row["answer"] = "Z"
    row["info"]["items"][0]["id"] = "Q"
    kinds = [f.detail for f in row_findings(row)]
    assert any("answer" in d for d in kinds) and any("ids" in d for d in kinds)


def test_validator_blocks_a_length_shortcut(rows):
    planted = json.loads(json.dumps(rows))
    for r in planted:
        for it in r["info"]["items"]:
            if it["is_intruder"]:
                it["description"] = it["description"] * 4
    kinds = {f.kind: f for f in dataset_findings(planted)}
    assert "shortcut_beats_random" in kinds and "length" in kinds["shortcut_beats_random"].detail


def test_validator_blocks_positions_and_duplicates(rows):
    planted = json.loads(json.dumps(rows))
    for r in planted:  # every intruder moved to the front
        items = sorted(r["info"]["items"], key=lambda it: not it["is_intruder"])
        for k, it in enumerate(items):
            it["id"] = chr(65 + k)
        r["info"]["items"] = items
    planted[1]["info"]["theme"] = planted[0]["info"]["theme"]
    kinds = {f.kind for f in dataset_findings(planted)}
    assert {"intruder_position_imbalance", "near_duplicate_theme"} <= kinds


def test_validate_dataset_command_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "environment.curator.validate_dataset"], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| Theme-word leaks | 0 |" in out.stdout and "TF-IDF odd-one-out" in out.stdout


def test_bad_spec_is_named_with_its_field(tmp_path):
    good = json.loads((SPECS_DIR / "food-citrus.json").read_text())
    bad = dict(good, members=good["members"][:3])
    (tmp_path / "food-citrus.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=r"food-citrus.json: field members"):
        load_specs(tmp_path)
    (tmp_path / "food-citrus.json").write_text(json.dumps(dict(good, spec_id="other")))
    with pytest.raises(ConfigError, match="file name stem"):
        load_specs(tmp_path)
    (tmp_path / "food-citrus.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable JSON"):
        load_specs(tmp_path)


def test_an_item_in_two_themes_is_refused(tmp_path):
    a = json.loads((SPECS_DIR / "food-citrus.json").read_text())
    b = json.loads((SPECS_DIR / "food-true-berries.json").read_text())
    b["members"][0]["title"] = a["members"][0]["title"]
    (tmp_path / "food-citrus.json").write_text(json.dumps(a))
    (tmp_path / "food-true-berries.json").write_text(json.dumps(b))
    with pytest.raises(ConfigError, match="appears in both"):
        load_specs(tmp_path)
