"""Fresh-materialisation smoke test (`validate smoke`): package, install elsewhere, rerun, compare.

1. Build the sdist and the wheel from the source checkout (``python -m build
   --no-isolation``, so no network is needed).
2. Create a virtualenv in a fresh temporary directory (no system site-packages) and install
   the wheel into it; dependencies come from pip's configured index.
3. Check the installed package cannot see the source tree: ``validate`` and ``environment``
   must import from the virtualenv, and no ``sys.path`` entry may lie under the checkout.
4. Derive a small sample of the frozen set (evenly spaced tasks), and rerun the oracle and
   the controls on it with the *installed* ``validate run`` through the contract's
   execution profile.
5. Pass iff every rerun attempt equals the frozen run's: same task hash, workspace hash,
   reply hash and reward, and no infrastructure error.

The result (``smoke/result.json``) and the rerun's ledgers are added to the run directory,
and its checksums are rewritten.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from pydantic import BaseModel

import validate
from validate.contract import Manifest, derive, write_manifest
from validate.errors import ValidateError
from validate.evidence import atomic_write, write_checksums
from validate.paths import RunPaths

KEY = ["task_id", "agent"]
COMPARED = ["task_hash", "workspace_sha256", "reply_sha256", "reward"]


class SmokeResult(BaseModel):
    passed: bool
    summary: str
    sample_idx: list[int]
    wheel: str
    wheel_sha256: str
    sdist: str
    sdist_sha256: str
    imported_from: dict[str, str]
    compared: int
    mismatches: list[str]


def source_root() -> Path:
    root = Path(validate.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        raise ValidateError("smoke: run it from a source checkout (no pyproject.toml beside the validate package)")
    return root


def _sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise ValidateError(f"smoke: `{' '.join(map(str, argv[:4]))} …` failed (exit {proc.returncode}): "
                            f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    return proc


def _sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def sample(frozen: Manifest, n: int) -> list[int]:
    idx = frozen.selection.idx
    if n >= len(idx):
        return list(idx)
    return sorted({idx[round(i * (len(idx) - 1) / max(n - 1, 1))] for i in range(n)})


def build_and_install(tmp: Path, log) -> tuple[Path, Path, Path]:
    src = source_root()
    dist = tmp / "dist"
    log("building the sdist and the wheel ...")
    _sh([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(dist), str(src)])
    wheel = next(dist.glob("*.whl"))
    sdist = next(dist.glob("*.tar.gz"))
    venv = tmp / "venv"
    log("installing the wheel into a fresh virtualenv ...")
    _sh([sys.executable, "-m", "venv", str(venv)])
    _sh([str(venv / "bin/pip"), "install", "--quiet", "--disable-pip-version-check", str(wheel)], cwd=tmp)
    return wheel, sdist, venv


def isolation(venv: Path, work: Path) -> dict[str, str]:
    probe = ("import json, sys, validate, environment; print(json.dumps({'validate': validate.__file__, "
             "'environment': environment.__file__, 'sys.path': sys.path}))")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(work)}
    got = json.loads(_sh([str(venv / "bin/python"), "-c", probe], cwd=work, env=env).stdout)
    src = str(source_root())
    leaks = [p for p in [got["validate"], got["environment"], *got["sys.path"]] if p and p.startswith(src)]
    if leaks or not got["validate"].startswith(str(venv)):
        raise ValidateError(f"smoke: the installed package can see the source tree: {leaks or got['validate']}")
    return {"validate": got["validate"].replace(str(venv), "<venv>"),
            "environment": got["environment"].replace(str(venv), "<venv>")}


def compare(frozen_run: Path, rerun: Path) -> tuple[int, list[str]]:
    def final(root: Path) -> pd.DataFrame:
        a = pd.read_parquet(root / "attempts.parquet")
        return a[~a["superseded"]].set_index(KEY)

    before, after = final(frozen_run), final(rerun)
    mismatches = []
    for key, row in after.iterrows():
        if row["status"] == "infrastructure_error":
            mismatches.append(f"{key}: infrastructure error in the rerun: {row['error_message']}")
            continue
        if key not in before.index:
            mismatches.append(f"{key}: not in the frozen run")
            continue
        old = before.loc[key]
        for col in COMPARED:
            if not (pd.isna(old[col]) and pd.isna(row[col])) and old[col] != row[col]:
                mismatches.append(f"{key}: {col} {old[col]!r} → {row[col]!r}")
    return len(after), mismatches


def smoke(frozen: Manifest, run_dir: Path, corpus_path: Path, n: int, log=print) -> SmokeResult:
    """Run the smoke test of `frozen` against the evidence in `run_dir`; record the result there."""
    tmp = Path(tempfile.mkdtemp(prefix="deshuffle-smoke-"))
    try:
        wheel, sdist, venv = build_and_install(tmp, log)
        work = tmp / "work"
        (work / "manifests").mkdir(parents=True)
        location = Path(frozen.environment.corpus.location)
        if frozen.environment.corpus.kind == "local" and not location.is_absolute():
            # The manifest names the corpus by a relative path; lay it out the same way here.
            (work / location).parent.mkdir(parents=True, exist_ok=True)
            (work / location).symlink_to(corpus_path.resolve())
        imported = isolation(venv, work)
        from validate.contract import load_corpus

        idx = sample(frozen, n)
        child = derive(frozen, name=f"{frozen.name}.smoke", idx=idx, corpus=load_corpus(frozen.environment.corpus),
                       rule=f"smoke: {len(idx)} evenly spaced tasks of {frozen.name}")
        write_manifest(child, work / "manifests/smoke.json")
        log(f"rerunning {len(idx)} tasks × {len(child.expectations.agents())} agents with the installed package ...")
        env = {"PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(work)}
        proc = subprocess.run([str(venv / "bin/validate"), "run", "--manifest", "manifests/smoke.json",
                               "--run-dir", "run", "--phase", "controls", "-c", "2"],
                              cwd=work, env=env, capture_output=True, text=True)
        if not (work / "run/attempts.parquet").exists():
            raise ValidateError(f"smoke: the installed `validate run` left no evidence (exit {proc.returncode}): "
                                f"{proc.stderr.strip()[-1500:]}")
        n_cmp, mismatches = compare(run_dir, work / "run")
        passed = proc.returncode == 0 and not mismatches
        result = SmokeResult(
            passed=passed, sample_idx=idx, wheel=wheel.name, wheel_sha256=_sha(wheel), sdist=sdist.name,
            sdist_sha256=_sha(sdist), imported_from=imported, compared=n_cmp, mismatches=mismatches,
            summary=(f"{n_cmp - len(mismatches)}/{n_cmp} attempts of the installed wheel ({wheel.name}) in a fresh "
                     f"virtualenv equal the frozen run's (task, workspace and reply hashes, reward); "
                     f"`validate run` exit {proc.returncode}"))
        dest = run_dir / "smoke"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        for name in ("attempts.parquet", "tasks.parquet", "exclusions.parquet", "run.json", "checksums"):
            shutil.copy(work / "run" / name, dest / name)
        shutil.copy(work / "manifests/smoke.json", dest / "manifest.json")
        atomic_write(dest / "result.json", result.model_dump_json(indent=2).encode() + b"\n")
        write_checksums(RunPaths(run_dir))
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
