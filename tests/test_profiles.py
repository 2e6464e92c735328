"""`validate freeze --like` and `validate compare-profiles`, as a user runs them: one dataset
contract on two execution profiles (bwrap, which isolates the network, and subprocess, which
does not, so every task that needs isolation is unsupported there), the tasks whose verdict
differs, a sealed entry the audit of either run computes again, and refusals naming the field."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest

from tests.conftest import CORPUS_PATH, VALIDATE, subprocess_env

pytestmark = pytest.mark.bwrap


def cli(*args, cwd):
    return subprocess.run([*VALIDATE, *args], cwd=cwd, capture_output=True, text=True, timeout=900,
                          env=subprocess_env())


def refused(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in needles), (needles, r.stderr)


@pytest.fixture(scope="module")
def two_profiles(tmp_path_factory):
    """Contract A on bwrap, the same contract on subprocess (`--like`), each run with every agent."""
    tmp = tmp_path_factory.mktemp("profiles")
    corpus = ("--corpus", str(CORPUS_PATH), "--max-papers", "2")
    r = cli("freeze", "--name", "a", "--backend", "bwrap", "--allow-patch", "--idx", "0,1,2", *corpus,
            cwd=tmp)
    assert r.returncode == 0, r.stderr
    r = cli("freeze", "--name", "b", "--like", "manifests/a.json", "--backend", "subprocess", "--allow-patch",
            "--timeout-s", "20", cwd=tmp)
    assert r.returncode == 0, r.stderr
    for name in ("a", "b"):
        r = cli("run", "--manifest", f"manifests/{name}.json", "--run-dir", f"ledgers/{name}",
                "--allow-patch", "-c", "2", cwd=tmp)
        assert r.returncode in (0, 1), r.stderr  # 1: the dataset verdict is not "compatible" (B's is not)
    return tmp


def test_like_keeps_the_dataset_contract_and_changes_only_the_profile(two_profiles):
    a, b = (json.loads((two_profiles / f"manifests/{n}.json").read_text()) for n in ("a", "b"))
    for field in ("environment", "selection", "tasks", "task_list_sha256", "expectations", "min_task_count",
                  "salt"):
        assert a[field] == b[field], field
    assert (a["execution"]["backend"], b["execution"]["backend"]) == ("bwrap", "subprocess")
    assert b["execution"]["limits"]["timeout_s"] == 20 != a["execution"]["limits"]["timeout_s"]
    assert b["execution"]["limits"]["memory_mb"] == a["execution"]["limits"]["memory_mb"]  # not given: A's
    assert a["sha256"] != b["sha256"]


def test_the_comparison_lists_every_task_whose_verdict_differs_with_both_sides(two_profiles):
    r = cli("compare-profiles", "ledgers/a", "ledgers/b", cwd=two_profiles)
    assert r.returncode == 0, r.stderr
    entries = sorted((two_profiles / "ledgers/compare-profiles/a--b").iterdir())
    assert len(entries) == 1
    record = json.loads((entries[0] / "compare.json").read_text())
    ta, tb = (pd.read_parquet(two_profiles / f"ledgers/{n}/tasks.parquet").set_index("task_id")
              for n in ("a", "b"))
    differ = sorted(t for t in ta.index if (ta.loc[t, "verdict"], ta.loc[t, "reason"]) !=
                    (tb.loc[t, "verdict"], tb.loc[t, "reason"]))
    assert differ, "the subprocess profile should exclude the tasks that need network isolation"
    assert sorted(d["task_id"] for d in record["differences"]) == differ
    assert record["same"] + len(differ) == record["a"]["tasks"] == len(ta)
    for d in record["differences"]:
        assert d["a"][0] == ta.loc[d["task_id"], "verdict"] and d["b"][1] == tb.loc[d["task_id"], "reason"]
    assert "backend" in [f for f, _, _ in record["profile"]]
    md = (entries[0] / "compare.md").read_text()
    assert f"{record['same']}/{len(ta)} tasks got the same verdict" in md and differ[0] in md
    assert f"{len(differ)}/{len(ta)} differ" in r.stdout


def test_the_audit_of_either_run_computes_the_comparison_again(two_profiles):
    for run in ("a", "b"):
        r = cli("audit", f"ledgers/{run}", cwd=two_profiles)
        assert "1 profile comparisons re-rendered and equal" in r.stdout + r.stderr, r.stdout + r.stderr
    entry = next((two_profiles / "ledgers/compare-profiles/a--b").iterdir())
    md = entry / "compare.md"
    original = md.read_bytes()
    try:
        md.write_bytes(original.replace(b"tasks got the same verdict", b"tasks got the same verdicT"))
        r = cli("audit", "ledgers/a", cwd=two_profiles)
        assert r.returncode != 0 and "compare.md" in r.stdout + r.stderr
    finally:
        md.write_bytes(original)


def test_contracts_that_differ_in_what_is_validated_are_refused_naming_the_field(two_profiles):
    corpus = ("--corpus", str(CORPUS_PATH), "--max-papers", "2")
    r = cli("freeze", "--name", "c", "--backend", "subprocess", "--allow-patch", "--idx", "0,1,2", *corpus,
            cwd=two_profiles)
    assert r.returncode == 0, r.stderr
    r = cli("run", "--manifest", "manifests/c.json", "--run-dir", "ledgers/c", "--allow-patch",
            cwd=two_profiles)
    assert r.returncode in (0, 1), r.stderr
    refused(cli("compare-profiles", "ledgers/a", "ledgers/c", cwd=two_profiles), "salt", "freeze --like")


def test_like_refuses_options_of_the_dataset_contract(two_profiles):
    refused(cli("freeze", "--name", "d", "--like", "manifests/a.json", "--idx", "0", "--backend",
                "subprocess", cwd=two_profiles), "--idx", "--like")
    refused(cli("freeze", "--name", "d", "--like", "manifests/nope.json", "--backend", "subprocess",
                cwd=two_profiles), "--like")
    refused(cli("compare-profiles", "ledgers/a", "ledgers/nope", cwd=two_profiles), "RUN_B")


def test_the_one_line_summary_counts_the_per_task_image_fields_and_names_the_rest():
    from validate.cli.main import _field_groups

    fields = ["backend", "seccomp", "task_images.base_map.bases.debian.image_id", "task_images.tasks.a.image",
              "task_images.tasks.a.key", "task_images.tasks.b.image", "task_images.build_policy"]
    assert _field_groups(fields) == ("backend, seccomp, task_images.base_map.* (1 fields), "
                                     "task_images.tasks.* (3 fields), task_images.build_policy")
    assert _field_groups([]) == "none"
