"""Bad input a hostile tester found, each through the `validate` command as a user types it:
exit 2, one line naming the option or field and the fix, no traceback, nothing written, and
refused before anything runs (each of these once exited 0, 1 or 3, some after every attempt)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import CORPUS_PATH, ROOT, VALIDATE, subprocess_env


def cli(*args, cwd):
    return subprocess.run([*VALIDATE, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=subprocess_env())


def refused(r: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2 with exactly one line on stderr holding every needle, and nothing on stdout."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert all(n in lines[0] for n in needles), (needles, r.stderr)
    assert r.stdout == ""


FREEZE = ("freeze", "--name", "x", "--data", str(CORPUS_PATH), "--max-papers", "2", "--backend", "bwrap",
          "--allow-patch")


def test_freeze_to_an_unwritable_out_path(tmp_path):
    r = cli(*FREEZE, "--idx-stop", "2", "--out", "/proc/o.json", cwd=tmp_path)
    refused(r, "--out", "/proc/o.json", "writable directory")
    assert list(tmp_path.iterdir()) == []


def test_freeze_a_min_count_above_the_tasks_selected(tmp_path):
    refused(cli(*FREEZE, "--idx-stop", "2", "--min-count", "5", cwd=tmp_path), "--min-count", "5", "2 tasks",
            "give 1 to 2")
    refused(cli(*FREEZE, "--idx-stop", "2", "--min-count", "0", cwd=tmp_path), "--min-count", "≥ 1")
    assert list(tmp_path.iterdir()) == []


def test_freeze_an_index_given_twice(tmp_path):
    refused(cli(*FREEZE, "--idx", "1,1", cwd=tmp_path), "--idx", "each index once", "1 given more than once")
    assert list(tmp_path.iterdir()) == []


def test_freeze_a_corpus_whose_every_task_has_a_blocking_finding(tmp_path):
    """One-paragraph papers: every task is invalid before any agent runs, so the pool could only
    FAIL after playing every agent; freeze refuses the selection instead of claiming success."""
    papers = [{"paper_id": f"arxiv:x-bom{i}", "source": "arxiv", "license": "CC-BY-4.0",
               "paragraphs": [{"text": f"\ufeffThe only paragraph of paper {i}.", "section": "Body"}]}
              for i in range(3)]
    (tmp_path / "one.jsonl").write_text("".join(json.dumps(p) + "\n" for p in papers), encoding="utf-8")
    r = cli("freeze", "--name", "one", "--corpus", "one.jsonl", "--max-papers", "1", "--backend", "bwrap",
            "--allow-patch", cwd=tmp_path)
    refused(r, "selection", "all 20 selected tasks have a blocking finding", "single unit",
            "select other tasks")
    assert not (tmp_path / "manifests").exists()


@pytest.mark.bwrap
def test_run_into_a_run_dir_whose_name_is_not_utf8(tmp_path):
    assert cli(*FREEZE, "--idx-stop", "2", cwd=tmp_path).returncode == 0
    r = subprocess.run([*VALIDATE, "run", "--manifest", "manifests/x.json", "--run-dir", b"ledgers/\xff",
                        "--allow-patch"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=subprocess_env())
    refused(r, "--run-dir", "not valid UTF-8")
    assert not (tmp_path / "ledgers").exists()  # refused before anything ran: not even a journal
    refused(cli("run", "--manifest", "manifests/x.json", "--run-dir", "ledgers/-x", "--allow-patch",
                cwd=tmp_path),
            "--run-dir", "'-x'", "plain file name")
    assert not (tmp_path / "ledgers").exists()


def test_audit_of_a_missing_directory_or_signature_file(tmp_path):
    refused(cli("audit", "no-such-run", cwd=tmp_path), "RUN_DIR", "no-such-run", "no such directory")
    refused(cli("eval", "audit", "no-such-run", cwd=tmp_path), "RUN_DIR", "no such directory")
    (tmp_path / "run").mkdir()
    refused(cli("audit", "run", "--signature", "allowed_signers", cwd=tmp_path), "--signature",
            "allowed_signers", "no such file")


def test_eval_freeze_with_a_base_url_that_is_not_http(tmp_path):
    args = ("eval", "freeze", "--name", "e", "--pool-run", "nowhere", "--model", "m", "--model-revision", "r")
    refused(cli(*args, "--base-url", "ftp://x", cwd=tmp_path), "--base-url", "'ftp://x'", "http:// or https://")
    refused(cli(*args, "--base-url", "http://", cwd=tmp_path), "--base-url", "names no host")
    assert list(tmp_path.iterdir()) == []


#: Every command that reads a dataset manifest, given the committed eval contract instead.
EVAL_CONTRACT = str(ROOT / "manifests" / "eval-harbor-t1.0.json")
HARBOR_POOL = next(p for p in sorted((ROOT / "ledgers").iterdir())
                   if p.name.startswith("harbor-sample-pool-"))
DATASET_COMMANDS = {
    "verify": ("verify", "--manifest", EVAL_CONTRACT),
    "run": ("run", "--manifest", EVAL_CONTRACT, "--allow-patch"),
    "pool": ("pool", "--manifest", EVAL_CONTRACT, "--allow-patch"),
    "pilot": ("pilot", "--manifest", EVAL_CONTRACT, "--allow-patch"),
    "freeze --like": ("freeze", "--name", "x", "--like", EVAL_CONTRACT, "--allow-patch"),
    "eval freeze --manifest": ("eval", "freeze", "--name", "e", "--pool-run", str(HARBOR_POOL), "--manifest",
                               EVAL_CONTRACT, "--model", "m", "--model-revision", "r", "--base-url",
                               "http://127.0.0.1:9/v1", "--allow-patch"),
    "eval run --manifest": ("eval", "run", "--contract", EVAL_CONTRACT, "--manifest", EVAL_CONTRACT,
                            "--allow-patch"),
}


@pytest.mark.parametrize("command", sorted(DATASET_COMMANDS))
def test_an_eval_contract_given_to_a_dataset_command_is_named_and_pointed_to_the_eval_commands(
    tmp_path, command
):
    refused(cli(*DATASET_COMMANDS[command], cwd=tmp_path), EVAL_CONTRACT, "is an eval contract",
            "not a dataset manifest", "validate eval run --contract")
    assert list(tmp_path.iterdir()) == []


SAMPLE = ROOT / "examples" / "harbor-sample"


def _dataset(tmp_path):
    """A one-task Harbor dataset of the sample's csv-to-json, and a listing of every file in it."""
    import shutil

    d = tmp_path / "D"
    shutil.copytree(SAMPLE / "csv-to-json", d / "csv-to-json")
    return d, lambda: sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.mark.docker
@pytest.mark.parametrize("out", ["m.json", "sub/m.json"])
def test_freeze_refuses_an_output_inside_the_dataset(tmp_path, out):
    """The build logs beside such a manifest (``m.build-logs/``) were read back as the dataset's
    one task, and the real task left out: refused before anything is built or written."""
    d, listing = _dataset(tmp_path)
    before = listing()
    (d / "sub").mkdir()
    r = cli("freeze", "--env", "harbor", "--name", "m", "--dataset", str(d), "--backend", "docker",
            "--allow-patch", "--out", str(d / out), cwd=tmp_path)
    refused(r, "--out", str(d / out), "inside the dataset", str(d))
    (d / "sub").rmdir()
    assert listing() == before


@pytest.mark.bwrap
def test_freeze_like_refuses_an_output_inside_the_dataset(tmp_path):
    d, listing = _dataset(tmp_path)
    assert cli("freeze", "--env", "harbor", "--name", "m0", "--dataset", str(d), "--backend", "bwrap",
               "--allow-patch", "--out", str(tmp_path / "m0.json"), cwd=tmp_path).returncode == 0
    before = listing()
    r = cli("freeze", "--name", "m", "--like", str(tmp_path / "m0.json"), "--backend", "bwrap",
            "--allow-patch", "--out", str(d / "m.json"), cwd=tmp_path)
    refused(r, "--out", str(d / "m.json"), "inside the dataset")
    assert listing() == before
