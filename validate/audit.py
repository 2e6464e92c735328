"""Re-check a run directory without rerunning an agent (`validate audit RUN_DIR`).

Nothing the run wrote about itself is trusted; everything is re-derived:

1. Seal: every file is listed in ``checksums`` and matches it, none missing or extra; with
   ``--signature``, ``checksums.sig`` verifies (OpenSSH, `validate.signing`).
2. Contracts: each manifest's sha256 matches its content; the frozen child, the pilot
   variants and each smoke sample point at their parent by hash; ``run.json`` names them.
3. Attempts: every attempt's task id and hash are the contract's for its phase, its agent
   and role are the contract's, its ``as_expected`` and ``superseded`` flags recompute.
4. Verdicts: every contract task has exactly one verdict, and each equals the verdict
   function applied to that task's attempts and findings (the findings re-derived from the
   environment when its data is at hand); the exclusion ledger lists exactly the excluded
   tasks; the frozen set is exactly the oracle's exception-free passes.
5. Counts: run.json's counts, facts and dataset verdict recompute; each smoke entry's
   comparison recomputes; each report's verdict line and Counts table, parsed from
   report.md and report.html (not searched for a string), equal the ledgers'.

Any failure names its file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from validate.contract import ContractError, Manifest, load_manifest
from validate.errors import EvidenceError
from validate.evidence import file_sha256, sealed_files
from validate.paths import RunPaths
from validate.records import Attempt, Exclusion, TaskVerdict, arrow_schema
from validate.verdicts import Outcome, as_expected, decide


@dataclass
class AuditResult:
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)


def check_seal(paths: RunPaths, r: AuditResult) -> None:
    """Check 1, the seal (every run directory's, the eval audit's too): ``checksums`` lists
    exactly the sealed files, each line well formed, every sha256 matching."""
    if not paths.checksums.exists():
        r.problems.append(f"{paths.checksums}: missing")
        return
    listed: dict[str, str] = {}
    for lineno, line in enumerate(paths.checksums.read_text(errors="replace").split("\n")[:-1], 1):
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name:
            r.problems.append(f"{paths.checksums} line {lineno}: malformed")
            continue
        listed[name] = digest
    present = {p.relative_to(paths.root).as_posix() for p in sealed_files(paths)}
    for name in sorted(set(listed) - present):
        r.problems.append(f"{paths.root / name}: listed in checksums but missing")
    for name in sorted(present - set(listed)):
        r.problems.append(f"{paths.root / name}: present but not listed in checksums")
    for name in sorted(set(listed) & present):
        if file_sha256(paths.root / name) != listed[name]:
            r.problems.append(f"{paths.root / name}: sha256 does not match checksums (changed after the run)")
    r.checked.append(f"checksums over {len(present)} files")


def _manifests(paths: RunPaths, r: AuditResult) -> dict[str, Manifest]:
    found: dict[str, Manifest] = {}
    files = [paths.manifest, paths.frozen_manifest, *sorted(paths.variants.glob("*.json")),
             *sorted(paths.smoke.glob("*/manifest.json"))]
    for p in files:
        if p.exists():
            try:
                found[p.relative_to(paths.root).as_posix()] = load_manifest(p)
            except ContractError as e:
                r.problems.append(str(e))
    root = found.get("manifest.json")
    frozen = found.get("frozen-manifest.json")
    for name, m in found.items():
        parent = None if name == "manifest.json" else frozen if name.startswith("smoke/") else root
        if name != "manifest.json" and (parent is None or m.parent_sha256 != parent.sha256):
            r.problems.append(f"{paths.root / name}: parent_sha256 {m.parent_sha256} is not its parent's sha256")
    if frozen is not None and root is not None:
        pool = {t.id: t.hash for t in root.tasks}
        if any(pool.get(t.id) != t.hash for t in frozen.tasks):
            r.problems.append(f"{paths.frozen_manifest}: freezes a task that is not in the pool with that hash")
    r.checked.append(f"{len(found)} manifests and their hash chain")
    return found


def _tables(paths: RunPaths, r: AuditResult) -> dict[str, pd.DataFrame]:
    out = {}
    for path, model in ((paths.attempts, Attempt), (paths.tasks, TaskVerdict), (paths.exclusions, Exclusion)):
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - any read failure is the finding
            r.problems.append(f"{path}: unreadable Parquet ({type(e).__name__}: {e})")
            continue
        names = [n for n in table.schema.names if not n.startswith("metric_")]
        expected = [n for n in arrow_schema(model).names if not n.startswith("metric_")]
        if names != expected:
            r.problems.append(f"{path}: columns {names} differ from the {model.__name__} model's {expected}")
            continue
        out[path.name] = table.to_pandas()
    return out


def check_attempt_keys(a: pd.DataFrame, r: AuditResult, where: Path) -> None:
    """Each (phase, task, agent, sample, try) once, and exactly the earlier tries superseded."""
    if a.duplicated(["phase", "task_id", "agent", "sample", "attempt"]).any():
        r.problems.append(f"{where}: an attempt key (phase, task, agent, sample, try) repeats")
    latest = a.groupby(["phase", "task_id", "agent", "sample"])["attempt"].transform("max")
    if ((a["attempt"] < latest) != a["superseded"]).any():
        r.problems.append(f"{where}: superseded flags do not follow the try numbers")


def _attempts(a: pd.DataFrame, by_phase: dict[str, Manifest], r: AuditResult, where: Path) -> None:
    check_attempt_keys(a, r, where)
    for phase, group in a.groupby("phase"):
        m = by_phase.get(phase)
        if m is None:
            r.problems.append(f"{where}: attempts of phase {phase!r}, which no contract of this run covers")
            continue
        hashes = {t.id: t.hash for t in m.tasks}
        rules = m.expectations.rules()
        wrong = group[[hashes.get(t) != h for t, h in zip(group["task_id"], group["task_hash"])]]
        if len(wrong):
            row = wrong.iloc[0]
            r.problems.append(f"{where}: {len(wrong)} attempt(s) of phase {phase} name a task hash that is not the "
                              f"contract's for that task, e.g. {row['task_id']} {row['task_hash']}")
        for row in group.itertuples():
            rule = rules.get(row.agent)
            if rule is None or rule.role != row.role:
                r.problems.append(f"{where}: attempt {row.task_id}/{row.agent} try {row.attempt}: agent or role "
                                  f"{row.role!r} is not the contract's")
                break
            reward = None if pd.isna(row.reward) else float(row.reward)
            if row.role != "model" and as_expected(rule, row.status, reward, m.expectations.pass_threshold) \
                    != bool(row.as_expected):
                r.problems.append(f"{where}: attempt {row.task_id}/{row.agent} try {row.attempt}: as_expected "
                                  f"{row.as_expected} does not follow from its status and reward")
                break


def _findings_from_env(paths: RunPaths, manifests: dict[str, Manifest], data: tuple, r: AuditResult):
    """A function task entry → findings, re-derived from the environment, or None."""
    from environment.protocol import LoadHints
    from validate.contract import check_environment, load_taskset

    root = manifests.get("manifest.json")
    try:
        env, _, taskset = check_environment(root, LoadHints(search=tuple(data)))
    except Exception as e:  # noqa: BLE001 - the environment or its data may be missing here
        r.unchecked.append(f"findings were taken from tasks.parquet, not re-derived: {e}")
        return None
    sets = {root.environment.config.__repr__(): taskset}

    def findings(manifest: Manifest, idx: int):
        key = manifest.environment.config.__repr__()
        if key not in sets:
            config = env.Config.model_validate(manifest.environment.config)
            sets[key] = load_taskset(env, config, manifest.hints(data))
        return env.findings(sets[key].task(idx))

    r.checked.append("findings re-derived from the environment")
    return findings


def _verdicts(ev_tasks: pd.DataFrame, attempts: pd.DataFrame, summary, manifests, regen, r: AuditResult,
              where: Path) -> None:
    from environment.protocol import Finding

    skipped = 0
    for g in summary.groups:
        tasks_m, exp_m = manifests.get(g.manifest), manifests.get(g.expectations)
        if tasks_m is None or exp_m is None:
            r.problems.append(f"{where}: group {g.phase} names a contract file this run lacks")
            skipped += 1
            continue
        mine = ev_tasks[ev_tasks["phase"] == g.phase]
        if sorted(mine["task_id"]) != sorted(t.id for t in tasks_m.tasks) or mine["task_id"].duplicated().any():
            r.problems.append(f"{where}: phase {g.phase}: the verdicts do not cover each of the contract's "
                              f"{len(tasks_m.tasks)} tasks exactly once")
        exp = exp_m.expectations
        sub = attempts[attempts["phase"].isin(g.attempt_phases) & (attempts["sample"] == 0)]
        outcomes = {tid: [Outcome(x.agent, int(x.attempt), x.status, None if pd.isna(x.reward) else float(x.reward),
                                  x.error_class, x.error_message) for x in grp.itertuples()]
                    for tid, grp in sub.groupby("task_id")}
        idx_of = {t.id: t.idx for t in tasks_m.tasks}
        skip_of = {t.id: t.skip for t in tasks_m.tasks}
        bad = 0
        for v in mine.itertuples():
            stored = [Finding(**f) for f in v.findings]
            findings = stored if regen is None or v.task_id not in idx_of else regen(tasks_m, idx_of[v.task_id])
            if regen is not None and [f.model_dump() for f in findings] != [f.model_dump() for f in stored]:
                r.problems.append(f"{where}: {v.task_id}: stored findings differ from the environment's")
            d = decide(outcomes.get(v.task_id, []), exp.required(skip_of.get(v.task_id, {})), exp.rules(),
                       exp.pass_threshold,
                       exp.exception_rule, findings)
            got = (v.verdict, v.reason if isinstance(v.reason, str) else None, list(v.missing), bool(v.retried))
            if got != (d.verdict, d.reason, d.missing, d.retried) or not _same(v.oracle_reward, d.oracle_reward) \
                    or not _same(v.max_control_reward, d.max_control_reward) or not _same(v.margin, d.margin):
                bad += 1
                if bad <= 5:
                    r.problems.append(f"{where}: {v.task_id}: verdict {got[0]} ({got[1]}) but its attempts give "
                                      f"{d.verdict} ({d.reason}): {d.detail[:200]}")
    stray = sorted(set(ev_tasks["phase"]) - {g.phase for g in summary.groups})
    if stray:
        r.problems.append(f"{where}: verdicts of phase(s) {stray}, which no verdict group of run.json covers")
    if not summary.groups or skipped:  # a claim only for what was done
        r.problems.append(f"{where}: {skipped} of {len(summary.groups)} verdict groups could not be re-derived")
    else:
        r.checked.append("every verdict re-derived from its attempts")


def _same(a, b) -> bool:
    a = None if a is None or (isinstance(a, float) and math.isnan(a)) else float(a)
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) < 1e-12)


def _frozen(attempts: pd.DataFrame, ev_tasks: pd.DataFrame, manifests: dict[str, Manifest], r: AuditResult,
            where: Path) -> None:
    """The frozen set is the oracle's exception-free passes, decided as the pool decided them:
    with each task's findings (those stored in tasks.parquet, which `_verdicts` holds to the
    environment's), so a task with a blocking finding is never frozen."""
    from environment.protocol import Finding

    root, frozen = manifests.get("manifest.json"), manifests.get("frozen-manifest.json")
    if frozen is None or root is None:
        return
    findings_of = {row.task_id: [Finding(**f) for f in row.findings] for row in ev_tasks.itertuples()}
    exp = root.expectations
    oracle = exp.named("oracle")[0]
    o = attempts[(attempts["phase"] == "oracle") & (attempts["agent"] == oracle)]
    passes = set()
    for tid, grp in o.groupby("task_id"):
        outs = [Outcome(x.agent, int(x.attempt), x.status, None if pd.isna(x.reward) else float(x.reward),
                        x.error_class, x.error_message) for x in grp.itertuples()]
        d = decide(outs, [oracle], {oracle: exp.rules()[oracle]}, exp.pass_threshold, exp.exception_rule,
                   findings_of.get(tid, []))  # the oracle alone, as the pool judged it at freeze
        if d.verdict == "compatible":
            passes.add(tid)
    if {t.id for t in frozen.tasks} != passes:
        r.problems.append(f"{where}: the frozen set is not exactly the oracle's exception-free passes")
    controls = attempts[attempts["phase"] == "controls"]
    if not set(controls["task_id"]) <= {t.id for t in frozen.tasks}:
        r.problems.append(f"{where}: controls ran on tasks outside the frozen set")
    r.checked.append("the frozen set re-derived from the oracle's attempts")


def audit(root: Path, signature: Path | None = None, identity: str = "validate", data: tuple = ()) -> AuditResult:
    """Every problem found (each naming its file), what was checked, and what could not be."""
    from validate.audit_counts import check_counts, check_smokes
    from validate.audit_reports import check_rendered

    paths = RunPaths(Path(root))
    r = AuditResult()
    if not paths.manifest.is_file():
        r.problems.append(f"{paths.root}: not a run directory (no manifest.json)")
        return r
    check_seal(paths, r)
    if signature is not None:
        from validate.signing import verify_signature

        problem = verify_signature(paths, signature, identity)
        (r.problems.append(problem) if problem else r.checked.append(f"signature of {identity}"))
    manifests = _manifests(paths, r)
    tables = _tables(paths, r)
    try:
        from validate.report import load_run

        ev = load_run(paths.root)
    except EvidenceError as e:
        r.problems.append(str(e))
        return r
    if len(tables) < 3 or "manifest.json" not in manifests:
        return r
    s = ev.summary
    if s.manifest_sha256 != manifests["manifest.json"].sha256:
        r.problems.append(f"{paths.summary}: manifest_sha256 is not manifest.json's")
    if (s.frozen_manifest_sha256 or None) != (manifests["frozen-manifest.json"].sha256
                                              if "frozen-manifest.json" in manifests else None):
        r.problems.append(f"{paths.summary}: frozen_manifest_sha256 is not frozen-manifest.json's")
    by_phase = {p: manifests[g.manifest] for g in s.groups for p in g.attempt_phases if g.manifest in manifests}
    if "controls" in by_phase and "frozen-manifest.json" in manifests:
        by_phase["controls"] = manifests["frozen-manifest.json"]
    attempts = tables["attempts.parquet"]
    _attempts(attempts, by_phase, r, paths.attempts)
    regen = _findings_from_env(paths, manifests, data, r)
    _verdicts(tables["tasks.parquet"], attempts, s, manifests, regen, r, paths.tasks)
    _frozen(attempts, tables["tasks.parquet"], manifests, r, paths.frozen_manifest)
    check_counts(ev, tables, manifests, r)
    check_smokes(ev, paths, manifests, r)
    check_rendered(ev, paths, r)
    return r
