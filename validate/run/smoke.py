"""Fresh-materialisation smoke test: package, install elsewhere, rerun, compare.

1. Build the sdist and the wheel from a copy of the source checkout in the temporary
   directory (``python -m build --no-isolation``, so no network is needed for the build
   itself). Never in the checkout: setuptools leaves ``build/`` and ``*.egg-info`` in the tree
   it builds, and a ``build/`` left there carries modules since deleted into the next wheel.
2. Create a virtualenv in a fresh temporary directory (no system site-packages) and install
   the wheel into it; dependencies come from pip's configured index.
3. Check the installed package cannot see the source tree: ``validate`` and ``environment``
   must import from the virtualenv, and no ``sys.path`` entry may lie under the checkout.
4. Derive a small sample of the frozen set (evenly spaced tasks) and rerun the oracle and
   every control on it with the *installed* ``validate run`` through the contract's execution
   profile. A task-directory dataset's sample is first materialised as a package in the
   temporary directory and rerun from there alone (`validate.taskdir.smoke_package`); the entry keeps it.
5. Pass iff every rerun attempt equals the frozen run's: same task hash, workspace hash,
   reply hash and reward (within the contract's smoke tolerance for a judged scorer), and no
   exception.

Each smoke test is a new entry ``smoke/<UTC time>/`` of the run directory (its result, the
sample's contract and the rerun's ledgers); nothing earlier is touched. The run's checksums
are rewritten to cover it. ``result.json`` is `smoke_result` of the two ledgers, the sample
contract and the facts of the build (wheel, sdist, where they imported from, the rerun's exit
code), serialised by `result_json`: the audit derives it again and compares it byte for byte.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pydantic import BaseModel, ConfigDict, Field

import validate
from environment.protocol import sha256_tag
from validate.contract.manifest import Manifest, derive, load_manifest, write_manifest
from validate.core.errors import ValidateError
from validate.core.paths import ATTEMPTS, MANIFEST, SMOKE_RESULT, SMOKE_RUN
from validate.core.records import EXCEPTION_STATUSES
from validate.evidence.journal import atomic_write, new_entry, write_checksums
from validate.run.context import RunContext
from validate.taskdir.smoke_package import PACKAGE, is_task_directories, materialise_sample

if TYPE_CHECKING:
    import pandas as pd

#: An attempt's place in both runs: an oracle played several times (``oracle_repeats``) has a
#: row per sample, each compared with the same sample of the frozen run.
KEY = ["task_id", "agent", "sample"]
#: Environment variables the rerun inherits: where the daemon, the image and the data are.
PASSED_ENV = ("DOCKER_HOST", "VALIDATE_IMAGE_DIR", "VALIDATE_DATA_DIR", "PIP_INDEX_URL",
              "PIP_EXTRA_INDEX_URL", "PIP_CACHE_DIR", "PIP_NO_CACHE_DIR", "PIP_CONFIG_FILE", "http_proxy",
              "https_proxy")


class SmokeResult(BaseModel):
    passed: bool
    summary: str
    sample_idx: list[int]
    manifest_sha256: str = Field(description="The sample's child contract (its parent is the frozen one).")
    wheel: str
    wheel_sha256: str
    sdist: str
    sdist_sha256: str
    imported_from: dict[str, str]
    compared: int
    mismatches: list[str]
    rerun_exit_code: int


def source_root() -> Path:
    root = Path(validate.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        raise ValidateError("smoke: run it from a source checkout (no pyproject.toml beside the "
                            "validate package)")
    return root


def _sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise ValidateError(f"smoke: `{' '.join(map(str, argv[:4]))} …` failed (exit {proc.returncode}): "
                            f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    return proc


def sample(frozen: Manifest, n: int) -> list[int]:
    idx = frozen.selection.idx
    if n >= len(idx):
        return list(idx)
    return sorted({idx[round(i * (len(idx) - 1) / max(n - 1, 1))] for i in range(n)})


def source_copy(src: Path, dest: Path) -> Path:
    """The checkout's files to build from, copied to `dest`: git's tracked files as they are in the
    working tree (the code a run records: its commit and the diff of tracked files); outside a
    git checkout, the tree without build products, caches, virtualenvs and run data."""
    try:
        listed = subprocess.run(["git", "-C", str(src), "ls-files", "-z"], capture_output=True,
                                check=True).stdout
        names = [n for n in os.fsdecode(listed).split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
    if not names:
        shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(
            "build", "dist", "*.egg-info", ".git", ".venv", "venv", "__pycache__", ".*_cache", "ledgers"))
        return dest
    for name in names:
        # a tracked file deleted in the tree is skipped
        if (src / name).is_file() or (src / name).is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / name, dest / name, follow_symlinks=False)
    return dest


def build_and_install(tmp: Path, log) -> tuple[Path, Path, Path]:
    import importlib.util

    if importlib.util.find_spec("build") is None or importlib.util.find_spec("wheel") is None:
        raise ValidateError("smoke: building the wheel needs the [smoke] extra: pip install "
                            "'deshuffle-validate[smoke]'")
    src = source_copy(source_root(), tmp / "src")
    dist = tmp / "dist"
    log("smoke: building the sdist and the wheel ...")
    _sh([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(dist),
         str(src)])
    wheel, sdist = next(dist.glob("*.whl")), next(dist.glob("*.tar.gz"))
    venv = tmp / "venv"
    log("smoke: installing the wheel into a fresh virtualenv ...")
    _sh([sys.executable, "-m", "venv", str(venv)])
    _sh([str(venv / "bin/pip"), "install", "--quiet", "--disable-pip-version-check", str(wheel)], cwd=tmp,
        env=_env(venv, tmp))
    return wheel, sdist, venv


def _env(venv: Path, home: Path, extra: tuple[str, ...] = ()) -> dict[str, str]:
    env = {k: os.environ[k] for k in (*PASSED_ENV, *extra) if k in os.environ}
    return {**env, "PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home)}


def isolation(venv: Path, work: Path) -> dict[str, str]:
    probe = ("import json, sys, validate, environment; print(json.dumps({'validate': validate.__file__, "
             "'environment': environment.__file__, 'sys.path': sys.path}))")
    import json

    got = json.loads(_sh([str(venv / "bin/python"), "-c", probe], cwd=work, env=_env(venv, work)).stdout)
    src = str(source_root())
    leaks = [p for p in [got["validate"], got["environment"], *got["sys.path"]] if p and p.startswith(src)]
    if leaks or not got["validate"].startswith(str(venv)):
        raise ValidateError("smoke: the installed package can see the source tree: "
                            f"{leaks or got['validate']}")
    return {"validate": got["validate"].replace(str(venv), "<venv>"),
            "environment": got["environment"].replace(str(venv), "<venv>")}


def compare(frozen_run: Path, rerun: Path, tolerance: float) -> tuple[int, list[str]]:
    import pandas as pd  # lazy: a run's driver never loads pandas; only reading a run back does
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    def final(table: pa.Table) -> pd.DataFrame:
        a = table.to_pandas()
        return a[~a["superseded"]].set_index(KEY)

    after = final(pq.read_table(rerun / ATTEMPTS))
    # Only the sample's tasks of the frozen run: a 10,000-task pool's attempts are not read whole.
    ids = pa.array(sorted(set(after.index.get_level_values(0))), pa.string())
    before = final(pq.read_table(frozen_run / ATTEMPTS, filters=pc.field("task_id").isin(ids)))
    sample_contract = load_manifest(rerun / MANIFEST)
    expected = [(t.id, agent) for t in sample_contract.tasks
                for agent in sample_contract.expectations.required(t.skip)]
    played = {(task_id, agent) for task_id, agent, _ in after.index}
    mismatches = [f"{key}: missing from the rerun" for key in expected if key not in played]
    for key, row in after.iterrows():
        if row["status"] in EXCEPTION_STATUSES:
            mismatches.append(f"{key}: {row['status']} in the rerun: {row['error_message']}")
            continue
        if key not in before.index:
            mismatches.append(f"{key}: not in the frozen run")
            continue
        old = before.loc[cast(tuple, key)]  # a (task_id, agent, sample) label of the index
        for col in ("task_hash", "workspace_sha256", "reply_sha256"):
            if not (pd.isna(old[col]) and pd.isna(row[col])) and old[col] != row[col]:
                mismatches.append(f"{key}: {col} {old[col]!r} → {row[col]!r}")
        if (
            pd.isna(old["reward"]) != pd.isna(row["reward"])
            or abs((old["reward"] or 0) - (row["reward"] or 0)) > tolerance
        ):
            mismatches.append(f"{key}: reward {old['reward']!r} → {row['reward']!r} (tolerance {tolerance})")
    return len(after), mismatches


#: The fields of result.json that record the build and the rerun's process, not derivable
#: from the ledgers (the seal is their only guard); every other field is derived.
PROCESS_FIELDS = ("wheel", "wheel_sha256", "sdist", "sdist_sha256", "imported_from", "rerun_exit_code")


def smoke_result(frozen_run: Path, rerun: Path, sample_manifest: Path, tolerance: float,
                 process: dict) -> SmokeResult:
    """The result of a smoke test from its evidence alone: the frozen run's and the rerun's
    attempts, the sample's contract, the scorer's tolerance and the `PROCESS_FIELDS`."""
    child = load_manifest(sample_manifest)
    n_cmp, mismatches = compare(frozen_run, rerun, tolerance)
    return SmokeResult(
        passed=not mismatches and n_cmp > 0, sample_idx=list(child.selection.idx),
        manifest_sha256=child.sha256, compared=n_cmp, mismatches=mismatches, **process,
        summary=(f"{n_cmp - len(mismatches)}/{n_cmp} attempts of the installed wheel ({process['wheel']}) in "
                 "a fresh virtualenv equal the frozen run's (task, workspace and reply hashes, reward"
                 f"{f' within {tolerance}' if tolerance else ''})"))


def result_json(result: SmokeResult) -> bytes:
    """result.json's bytes (as `validate.evidence.journal.write_json` writes a model)."""
    return result.model_dump_json(indent=2).encode() + b"\n"


class SmokePhase(BaseModel):
    """``validate smoke`` (and a pool's last step): rerun a sample of the frozen set from an installed
    wheel."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sample: int = Field(default=5, ge=1, description="Evenly spaced tasks of the frozen set to rerun.")


def smoke(ctx: RunContext, frozen: Manifest, cfg: SmokePhase, log=print) -> SmokeResult:
    """Smoke-test `frozen` against the evidence of `ctx`'s run; record it as a new entry there."""
    n = cfg.sample
    tmp = Path(tempfile.mkdtemp(prefix="validate-smoke-"))
    try:
        wheel, sdist, venv = build_and_install(tmp, log)
        (tmp / "work").mkdir()
        imported = isolation(venv, tmp / "work")
        idx = sample(frozen, n)
        places = [*getattr(ctx.taskset, "data_files", ()), *ctx.hints.search]
        if is_task_directories(ctx.taskset):  # rerun from the sample's package, and nothing else
            child, package_dir = materialise_sample(ctx, frozen, idx, tmp)
            places = [package_dir]
        else:
            child = derive(frozen, ctx.env, ctx.taskset, name=f"{frozen.name}.smoke", idx=idx,
                           rule=f"smoke: {len(idx)} evenly spaced tasks of {frozen.name}")
        write_manifest(child, tmp / "smoke.json")
        log(
            f"smoke: rerunning {len(idx)} tasks × the oracle and every control with the installed package ..."
        )
        data = [a for p in dict.fromkeys(Path(p).resolve() for p in places) for a in ("--data", str(p))]
        proc = subprocess.run([str(venv / "bin/validate"), "run", "--manifest", str(tmp / "smoke.json"),
                               "--run-dir", str(tmp / SMOKE_RUN), "--phase", "smoke", "--agents", "all", "-c",
                               "2", *data],
                              env=_env(venv, tmp / "work", ctx.manifest.environment.scorer.env_vars),
                              capture_output=True, text=True)
        if not (tmp / SMOKE_RUN / ATTEMPTS).exists():
            raise ValidateError("smoke: the installed `validate run` left no evidence (exit "
                                f"{proc.returncode}): {proc.stderr.strip()[-1500:]}")
        process = dict(wheel=wheel.name, wheel_sha256=sha256_tag(wheel.read_bytes()), sdist=sdist.name,
                       sdist_sha256=sha256_tag(sdist.read_bytes()), imported_from=imported,
                       rerun_exit_code=proc.returncode)
        entry = new_entry(ctx.paths.smoke)  # only now: a smoke test that failed to run leaves no entry
        shutil.copy(tmp / "smoke.json", entry / MANIFEST)
        shutil.copytree(tmp / SMOKE_RUN, entry / SMOKE_RUN, ignore=shutil.ignore_patterns(".*"))
        if is_task_directories(ctx.taskset):
            shutil.copytree(tmp / PACKAGE, entry / PACKAGE, symlinks=True)
        # From the entry's own copies, exactly as the audit will derive it again.
        result = smoke_result(ctx.paths.root, entry / SMOKE_RUN, entry / MANIFEST,
                              ctx.manifest.environment.scorer.smoke_tolerance, process)
        atomic_write(entry / SMOKE_RESULT, result_json(result))
        write_checksums(ctx.paths)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
