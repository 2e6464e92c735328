"""Audit of the ledgers a resume kept (``earlier/<key>/``) for a report rendered before it.

Such a copy is not the run's current evidence, so a forger could put any ledgers there and
render a report from them. It is evidence of this run only if it is an earlier state of it:

- every attempt in it is among the run's own attempts (a resume only adds attempts; only the
  ``superseded`` flag of an old one may change), and the run's attempts are audited;
- every task verdict's findings are the run's own for that task (the run's are held to the
  environment);
- everything the audit re-derives holds on it: the full audit (`validate.audit.run.audit`, or
  `validate.audit.eval.audit` for an eval run; the caller hands it down, so this module
  imports neither) runs on a scratch run directory made of exactly that copy, the contract,
  the patch and the smoke entries it names.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from validate.core.paths import ATTEMPTS, SMOKE, SMOKE_RESULT, TASKS, RunPaths
from validate.evidence.journal import write_checksums


def _rows(path: Path, drop: tuple[str, ...]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in drop} for row in pq.read_table(path).to_pylist()]


def _key(row: dict) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def _among_the_runs(paths: RunPaths, src: Path, r) -> bool:
    now = {_key(x) for x in _rows(paths.attempts, ("superseded",))}
    stray = [x for x in _rows(src / ATTEMPTS, ("superseded",)) if _key(x) not in now]
    if stray:
        r.problems.append(f"{src / ATTEMPTS}: {len(stray)} attempt(s) that are not among the run's own "
                          f"(e.g. {stray[0].get('task_id')}/{stray[0].get('agent')} try "
                          f"{stray[0].get('attempt')}): not an earlier state of this run")
    wrong = []
    if (src / TASKS).is_file():  # a validation run's verdicts (an eval run has none)
        findings = {(x["phase"], x["task_id"]): _key({"f": x["findings"]}) for x in _rows(paths.tasks, ())}
        wrong = [x["task_id"] for x in _rows(src / TASKS, ())
                 if findings.get((x["phase"], x["task_id"])) != _key({"f": x["findings"]})]
    if wrong:
        r.problems.append(f"{src / TASKS}: the findings of {len(wrong)} task(s) (e.g. {wrong[0]}) are not "
                          f"the run's own")
    return not stray and not wrong


def _scratch(paths: RunPaths, src: Path, names: list[str], into: Path) -> Path:
    """A run directory of the kept copy: its files, the patch, and the smoke entries it names."""
    root = into / paths.root.name  # the run's own name: run ids are directory names
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / name, root / name)
        parts = Path(name).parts
        if parts[0] == SMOKE and len(parts) == 3:
            shutil.copytree(paths.smoke / parts[1], root / SMOKE / parts[1], dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(SMOKE_RESULT))
    for own in (paths.manifest, paths.patch):  # never rewritten by a resume (it refuses another)
        if own.is_file() and not (root / own.name).exists():
            shutil.copyfile(own, root / own.name)
    write_checksums(RunPaths(root))  # our own copy: its seal is not the question here
    return root


def check_earlier(paths: RunPaths, src: Path, names: list[str], r, audit: Callable) -> bool:
    """Whether the copy at `src` (the files `names`) is an earlier state of this run whose
    derived files all hold under `audit` (the full audit of this run's kind: a run's or an
    eval run's); every problem is recorded, naming `src`."""
    if not _among_the_runs(paths, src, r):
        return False
    tmp = Path(tempfile.mkdtemp(prefix="validate-earlier-"))
    try:
        root = _scratch(paths, src, names, tmp)
        found = audit(root)
        r.problems += [f"{src} (the ledgers of an earlier report): {p.replace(str(root), str(src))}"
                       for p in found.problems]
        return not found.problems
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
