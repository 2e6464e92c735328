"""This harness as the bench measures it: through its CLI only, its outcomes read from its files.

Nothing here imports the harness's trial code: ``validate image build``, ``validate freeze
--env harbor`` and ``validate run`` run as the checkout's own executables against the
bench's daemon, so a re-run measures whatever the default contract is then. What a run
decided is read from its run directory (the attempts and tasks Parquet files, named by
`validate.core.paths`); what a freeze built, from its manifest (the base-image map).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from harbor_anchor import BenchError, Measurement
from validate.core.paths import ATTEMPTS, TASKS

ROOT = Path(__file__).resolve().parents[2]
VALIDATE = Path(sys.executable).parent / "validate"
#: How `validate freeze` reports each task image on its progress line ("task images: 2/6 csv-to-json: built").
IMAGE_LINE = re.compile(r"^task images: \d+/\d+ \S+: (built|cached)\b", re.MULTILINE)


def _validate(daemon, argv: list[str], log: Path, ok: tuple[int, ...] = (0,)) -> int:
    """`validate ARGV` against the bench's daemon, its output to `log`; BenchError unless the exit is `ok`."""
    if not VALIDATE.is_file():
        raise BenchError(
            f"no {VALIDATE}: run the bench with the checkout's venv (.venv/bin/python bench/...)"
        )
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        rc = subprocess.run([str(VALIDATE), *argv], cwd=ROOT, env=daemon.env(), stdin=subprocess.DEVNULL,
                            stdout=out, stderr=subprocess.STDOUT).returncode
    if rc not in ok:
        tail = log.read_text(errors="replace")[-2000:]
        raise BenchError(f"validate {argv[0]} exited {rc} (log {log}); it ends: {tail}")
    return rc


def freeze(daemon, dataset: Path, work: Path, name: str) -> Path:
    """The default contract of `dataset` on the bench's daemon (every task image built or found)."""
    manifest = work / "manifests" / f"{name}.json"
    _validate(daemon, ["freeze", "--env", "harbor", "--dataset", str(dataset), "--name", name,
                       "--out", str(manifest), "--allow-patch"], work / "logs" / f"freeze-{name}.log")
    return manifest


#: A one-task dataset of the bench's own: freezing it imports the harness's bases, whatever
#: the dataset measured.
PREPARE_TASK = {
    "task.toml": '[task]\nname = "bench/prepare"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n',
    "instruction.md": "Write `ok` to `/app/out.txt`.\n",
    "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
    "solution/solve.sh": "#!/bin/sh\necho ok > /app/out.txt\n",
    "tests/test.sh": "#!/bin/sh\nif grep -qx ok /app/out.txt; then r=1; else r=0; fi\n"
                     "echo $r > /logs/verifier/reward.txt\n",
}


def prepare(daemon, work: Path, log) -> dict:
    """The sandbox image and the harness's bases in the daemon; returns the base-image map."""
    log("  validate image build (the sandbox image into the daemon) ...")
    _validate(daemon, ["image", "build"], work / "logs" / "image-build.log")
    log("  validate freeze of a one-task dataset of the bench's (imports the offline bases) ...")
    for rel, text in PREPARE_TASK.items():
        path = work / "prepare-dataset" / "prepare" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if rel.endswith(".sh") else 0o644)
    manifest = json.loads(freeze(daemon, work / "prepare-dataset", work, "prepare").read_text())
    return manifest["execution"]["task_images"]["base_map"]


def run_ours(daemon, dataset: Path, work: Path, name: str, c: int, agents: str | None) -> Measurement:
    """Freeze + run (agents `agents`, or the contract's default: all), timed apart and together."""
    t0 = time.perf_counter()
    manifest = freeze(daemon, dataset, work, name)
    t1 = time.perf_counter()
    run_dir = work / "runs" / name
    _validate(daemon, ["run", "--manifest", str(manifest), "--run-dir", str(run_dir), "-c", str(c),
                       "--allow-patch", *(["--agents", agents] if agents else [])],
              work / "logs" / f"run-{name}.log", ok=(0, 1))
    t2 = time.perf_counter()
    trials, played, outcomes, median_s = read_attempts(run_dir / ATTEMPTS)
    verdicts, details = read_tasks(run_dir / TASKS)
    said = IMAGE_LINE.findall((work / "logs" / f"freeze-{name}.log").read_text(errors="replace"))
    return Measurement(side="ours-oracle-nop" if agents else "ours-default", trials=trials, played=played,
                       wall_s=t2 - t0, outcomes=outcomes, verdicts=verdicts, details=details,
                       parts_s={"freeze": t1 - t0, "run": t2 - t1},
                       images={k: said.count(k) for k in ("built", "cached")},
                       phases_s={"attempt": median_s} if median_s is not None else {}, where=str(run_dir))


def attempt_text(row: dict) -> str:
    """An attempt's outcome: its reward when it finished ok, else why not (the error class, or its status)."""
    if row["status"] == "ok":
        return f"{row['reward']}"
    return row["error_class"] or row["status"]


def read_attempts(path: Path) -> tuple[int, int, dict[str, dict[str, str]], float | None]:
    """(attempt rows, rows that ran — a runtime recorded, task → agent → outcome(s) of the live rows,
    the median runtime of those that ran)."""
    rows = pq.read_table(path).to_pylist()
    out: dict[str, dict[str, list[str]]] = {}
    for row in sorted(rows, key=lambda r: (r["task_id"], r["agent"], r["sample"], r["attempt"])):
        if not row["superseded"]:
            texts = out.setdefault(row["task_id"], {}).setdefault(row["agent"], [])
            if attempt_text(row) not in texts:
                texts.append(attempt_text(row))
    runtimes = [r["runtime_s"] for r in rows if r["runtime_s"] is not None]
    median_s = statistics.median(runtimes) if runtimes else None
    joined = {t: {a: "/".join(v) for a, v in agents.items()} for t, agents in out.items()}
    return len(rows), len(runtimes), joined, median_s


def read_tasks(path: Path) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    rows = pq.read_table(path).to_pylist()
    return ({r["task_id"]: (r["verdict"], r["reason"] or "") for r in rows},
            {r["task_id"]: r["detail"] or "" for r in rows})
