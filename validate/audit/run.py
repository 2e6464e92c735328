"""Re-check a run directory without rerunning an agent (`validate audit RUN_DIR`).

Nothing the run wrote about itself is trusted; everything derivable is re-derived, and what
cannot be is named (`SEALED_ONLY`): bound by the checksums only, so by a signature
(``--signature``). Anything the audit could not check is a problem, never a note.

1. Seal: every file is listed in ``checksums`` and matches it, none missing or extra; with
   ``--signature``, ``checksums.sig`` verifies (OpenSSH, `validate.evidence.signing`).
2. Contracts: each manifest's sha256 matches its content; the frozen child, the pilot
   variants and each smoke sample point at their parent by hash; ``run.json`` names them;
   manifest.json and frozen-manifest.json equal the committed ``manifests/<name>.json`` when
   one exists; each is held to the environment's code and data (`validate.audit.env`).
3. Attempts: every attempt's task id and hash are the contract's for its phase, its agent,
   role, backend and image digest are the contract's, its status follows from its exit code
   and kill flags, its ``as_expected`` and ``superseded`` flags recompute; its reply, its
   workspace and its reward (re-scored offline by the environment's scorer) re-derive.
4. Verdicts: every contract task has exactly one verdict row, and each row equals, field for
   field, the one the run's own `validate.run.runner.verdict_row` builds from that task's attempts
   and the environment; the exclusion ledger is exactly those rows' exclusions; the frozen set
   is exactly the oracle's exception-free passes.
5. Counts and identity: run.json's counts, facts, dataset verdict, backend, image, agents,
   dataset findings and times recompute from the ledgers and the contract
   (`validate.audit.counts`); each smoke entry's comparison recomputes; each report's verdict
   line and Counts table, parsed, equal the ledgers'.

Any failure names its file.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from environment.protocol import Finding
from validate.audit.contracts import check_anchor, committed_manifests, read_manifests
from validate.audit.counts import check_counts, check_identity, check_smokes, verdict_rows
from validate.audit.env import EnvAtHand, rescore
from validate.audit.reports import check_rendered
from validate.audit.seal import AuditResult, check_seal
from validate.audit.taskimages import (
    check_base_maps,
    check_build_logs,
    check_patches,
    check_reply_images,
    routed_digests,
)
from validate.contract.manifest import Manifest
from validate.core.errors import EvidenceError
from validate.core.paths import (
    ATTEMPTS,
    FROZEN_MANIFEST,
    MANIFEST,
    SCORER_CACHE,
    SMOKE,
    SMOKE_RUN,
    TASKS,
    VARIANTS,
    RunPaths,
)
from validate.core.records import (
    COMPATIBLE,
    EXACT,
    EXCLUDED,
    EXIT_NONZERO,
    MODEL,
    NO_REPLY,
    OK,
    OOM,
    ORACLE,
    PLACEMENT,
    TIMEOUT,
    TRIAL,
    VERDICT_TRIAL,
    Attempt,
    Exclusion,
    Status,
    TaskVerdict,
    arrow_schema,
    meta_text,
)
from validate.evidence.run import load_run
from validate.evidence.signing import verify_signature
from validate.evidence.verdicts import Outcome, as_expected, decide
from validate.run.runner import verdict_row

#: What no audit can re-derive: facts of the machine and of the attempt's inside. They are
#: bound by ``checksums`` alone, so only ``--signature`` (which covers the checksums) holds them.
SEALED_ONLY: tuple[str, ...] = (
    "run.json: machine, code_commit, started_at (a resume starts it again), interrupted",
    "attempts.parquet: started_at, finished_at, runtime_s, exit_code, oom_killed, timed_out, stdout, stderr "
    "(but a trial's head: re-derived from its trial column), error_class, error_message, node, host (where a "
    "cluster ran it); a trial's observations (its trial column: what the harness saw, held to its stderr, "
    "planted, shared_reward and stored reply)",
    "replies/: what each agent answered (its reward is re-scored from it; only a rerun, `validate smoke`, "
    "re-derives the answer itself)",
    f"{SCORER_CACHE}/: a judge's raw answers (each grade is re-derived from its answer; the "
    "answer is the judge's)",
    "smoke/*/run/: the rerun's run.json, tasks.parquet and timings (its attempts are re-scored and compared)",
)
EVAL_SEALED_ONLY: tuple[str, ...] = (
    "eval.json: machine, code_commit, patch, interrupted, started_at (finished_at is held to "
    "the attempts' ends)",
    "attempts.parquet: started_at, finished_at, runtime_s, error_class, error_message",
    "replies/: what the model answered (its reward is re-scored from it; the answer is the model's)",
    "trajectories.parquet: every message, tool call and tool result; samples.parquet: token "
    "counts and timings",
)


def _tables(paths: RunPaths, r: AuditResult) -> dict[str, pd.DataFrame]:
    out = {}
    for path, model in ((paths.attempts, Attempt), (paths.tasks, TaskVerdict), (paths.exclusions, Exclusion)):
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - any read failure is the finding
            r.problems.append(f"{path}: unreadable Parquet ({type(e).__name__}: {e})")
            continue
        names = [n for n in table.schema.names if not n.startswith("metric_")]
        # A run on one machine has no placement columns (`PLACEMENT`); one on a cluster has both.
        # A run without trials has no trial columns (`TRIAL`); one with trials has all of them.
        # A run whose every reward's float was exact (and any run before they existed) has no `EXACT` ones.
        absent = PLACEMENT if model is Attempt and not set(PLACEMENT) & set(names) else ()
        absent += TRIAL if model is Attempt and not set(TRIAL) & set(names) else ()
        absent += EXACT if model is Attempt and not set(EXACT) & set(names) else ()
        absent += VERDICT_TRIAL if model is TaskVerdict and not set(VERDICT_TRIAL) & set(names) else ()
        expected = [n for n in arrow_schema(model, omit=absent).names if not n.startswith("metric_")]
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
        hashes = {t.id: (t.hash, t.idx) for t in m.tasks}
        rules = m.expectations.rules()
        wrong = group[[hashes.get(t) != (h, i) for t, h, i in zip(group["task_id"], group["task_hash"],
                                                                  group["idx"], strict=True)]]
        if len(wrong):
            row = wrong.iloc[0]
            r.problems.append(f"{where}: {len(wrong)} attempt(s) of phase {phase} name a task hash that is "
                              f"not the contract's for that task (or another idx), e.g. {row['task_id']} "
                              f"{row['task_hash']} idx {row['idx']}")
        ex = m.execution
        routed = routed_digests(m, group["task_id"])  # a task's frozen image, else the sandbox image
        off = group[(group["backend"] != ex.backend) | (group["image_digest"] != routed)]
        if len(off):
            r.problems.append(f"{where}: {len(off)} attempt(s) of phase {phase} name a backend or "
                              f"image_digest that is not the contract's ({ex.backend}, "
                              f"{routed[off.index[0]]}), e.g. {off.iloc[0]['task_id']} "
                              f"{off.iloc[0]['agent']}: {off.iloc[0]['backend']} "
                              f"{off.iloc[0]['image_digest']}")
        for row in group.itertuples():
            if row.role != MODEL and row.status in STATUS_OF_RUN and _run_status(row) != row.status:
                r.problems.append(f"{where}: attempt {row.task_id}/{row.agent} try {row.attempt}: status "
                                  f"{row.status} does not follow from its exit code and kill flags")
                break
        for row in group.itertuples():
            rule = rules.get(row.agent)
            if rule is None or rule.role != row.role:
                r.problems.append(f"{where}: attempt {row.task_id}/{row.agent} try {row.attempt}: agent or "
                                  f"role {row.role!r} is not the contract's")
                break
            reward = None if pd.isna(row.reward) else float(row.reward)
            if row.role != MODEL and as_expected(rule, row.status, reward, m.expectations.pass_threshold,
                                                 _decimal(row)) != bool(row.as_expected):
                r.problems.append(f"{where}: attempt {row.task_id}/{row.agent} try {row.attempt}: "
                                  f"as_expected {row.as_expected} does not follow from its status and reward")
                break


#: Statuses that follow from the sandbox's result alone (a reply's own trouble aside).
STATUS_OF_RUN = (OK, EXIT_NONZERO, TIMEOUT, OOM, NO_REPLY)


def _run_status(row) -> Status:
    status = (TIMEOUT if row.timed_out else OOM if row.oom_killed
              else EXIT_NONZERO if row.exit_code != 0 else OK)
    return NO_REPLY if row.status == NO_REPLY and status == OK else status


def _verdicts(paths: RunPaths, attempts: pd.DataFrame, summary, manifests, at, r: AuditResult) -> None:
    """Every verdict row (and every exclusion row) rebuilt, field for field, by the run's own
    `verdict_row` from the task's attempts and the environment (see the module docstring)."""
    where = paths.tasks
    stored = {(v.phase, v.task_id): v for v in verdict_rows(where)}
    if len(stored) != pq.ParquetFile(where).metadata.num_rows:
        r.problems.append(f"{where}: a (phase, task) has more than one verdict row")
    expected, skipped, bad = {}, 0, 0
    for g in summary.groups:
        tasks_m, exp_m = manifests.get(g.manifest), manifests.get(g.expectations)
        if tasks_m is None or exp_m is None:
            r.problems.append(f"{where}: group {g.phase} names a contract file this run lacks")
            skipped += 1
            continue
        mine = [k for k in stored if k[0] == g.phase]
        if sorted(t for _, t in mine) != sorted(t.id for t in tasks_m.tasks):
            r.problems.append(f"{where}: phase {g.phase}: the verdicts do not cover each of the contract's "
                              f"{len(tasks_m.tasks)} tasks exactly once")
        # `decide` counts the samples the contract asks
        sub = attempts[attempts["phase"].isin(g.attempt_phases)]
        outcomes = {tid: _outcomes(grp) for tid, grp in sub.groupby("task_id", sort=False)}
        taskset = at.taskset(tasks_m)
        for e in tasks_m.tasks:
            want = verdict_row(at.env, summary.run_id, g.phase, exp_m, e, taskset.task(e.idx),
                               outcomes.get(e.id, []))
            expected[(g.phase, e.id)] = want
            got = stored.get((g.phase, e.id))
            if got is not None and _row(got) != _row(want):
                bad += 1
                if bad <= 5:
                    r.problems.append(f"{where}: {e.id}: {_difference(got, want)}")
    if bad > 5:
        r.problems.append(f"{where}: and {bad - 5} more verdict rows that differ from their re-derivation")
    stray = sorted({p for p, _ in stored} - {g.phase for g in summary.groups})
    if stray:
        r.problems.append(f"{where}: verdicts of phase(s) {stray}, which no verdict group of run.json covers")
    excluded = _exclusions(paths, expected, r)
    if not summary.groups or skipped:  # a claim only for what was done
        r.problems.append(f"{where}: {skipped} of {len(summary.groups)} verdict groups could "
                          "not be re-derived")
    else:
        r.checked.append(f"{len(expected)} task rows and {excluded} exclusion rows re-derived from their "
                         f"attempts and the environment")


def _outcomes(grp: pd.DataFrame) -> list[Outcome]:
    """A task's attempt rows as the outcomes `decide` reads."""
    def opt(x, name):
        value = getattr(x, name, None)
        return None if value is None or (isinstance(value, float) and pd.isna(value)) else value

    return [Outcome(x.agent, int(x.attempt), x.status, None if pd.isna(x.reward) else float(x.reward),
                    x.error_class, x.error_message, int(x.sample), _decimal(x), opt(x, "shared_reward"),
                    opt(x, "planted"))
            for x in grp.itertuples()]


def _decimal(row) -> str | None:
    """An attempt row's ``reward_decimal`` (None where the run's evidence has no such column).
    Whatever it holds is re-derived from the reply by `validate.audit.env.rescore`."""
    value = getattr(row, "reward_decimal", None)
    return value if isinstance(value, str) else None


def _exclusions(paths: RunPaths, expected: dict, r: AuditResult) -> int:
    """The exclusion ledger is exactly the re-derived verdicts' exclusions, row for row."""
    excluded = {k: Exclusion(run_id=v.run_id, phase=v.phase, task_id=v.task_id, idx=v.idx,
                             task_hash=v.task_hash, reason=v.reason, detail=v.detail).model_dump()
                for k, v in expected.items() if v.verdict == EXCLUDED}
    ledger = {(x["phase"], x["task_id"]): Exclusion.model_validate(x).model_dump()
              for x in pq.read_table(paths.exclusions).to_pylist()}
    if ledger != excluded:
        r.problems.append(f"{paths.exclusions}: its rows are not the re-derived exclusions (reason and "
                          "detail of each excluded task)")
    return len(excluded)


def _row(v) -> dict:
    row = v.model_dump()
    row["meta"] = meta_text(row["meta"])  # as stored: a true is not a 1, nor 60.0 a 60
    return row


def _difference(got, want) -> str:
    g, w = _row(got), _row(want)
    if (g["verdict"], g["reason"], g["missing"], g["retried"]) != (w["verdict"], w["reason"], w["missing"],
                                                                  w["retried"]) or \
            any(not _same(g[f], w[f]) for f in ("oracle_reward", "max_control_reward", "margin")):
        return (f"verdict {g['verdict']} ({g['reason']}) but its attempts give {w['verdict']} "
                f"({w['reason']}): {w['detail'][:200]}")
    if g["findings"] != w["findings"]:
        return "stored findings differ from the environment's"
    fields = [f for f in w if g[f] != w[f]]
    return f"{', '.join(fields)} differ from the row re-derived from its attempts and the environment"


def _same(a, b) -> bool:
    a = None if a is None or (isinstance(a, float) and math.isnan(a)) else float(a)
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) < 1e-12)


def _frozen(attempts: pd.DataFrame, ev_tasks: pd.DataFrame, manifests: dict[str, Manifest], r: AuditResult,
            where: Path) -> None:
    """The frozen set is the oracle's exception-free passes that some control can test, decided
    as the pool decided them: with each task's findings (those stored in tasks.parquet, which
    `_verdicts` holds to the environment's), so a task with a blocking finding is never frozen,
    and with the contract's skips, so a task no control can test is never frozen either."""
    root, frozen = manifests.get(MANIFEST), manifests.get(FROZEN_MANIFEST)
    if frozen is None or root is None:
        return
    findings_of = {row.task_id: [Finding(**f) for f in row.findings] for row in ev_tasks.itertuples()}
    exp = root.expectations
    oracle = exp.named(ORACLE)[0]
    o = attempts[(attempts["phase"] == "oracle") & (attempts["agent"] == oracle)]
    testable = {t.id for t in root.tasks if exp.testing(t.skip)}
    passes = set()
    for tid, grp in o[o["task_id"].isin(testable)].groupby("task_id"):
        # the oracle alone, as at freeze
        d = decide(_outcomes(grp), [oracle], {oracle: exp.rules()[oracle]}, exp.pass_threshold,
                   exp.exception_rule, findings_of.get(tid, []), oracle_repeats=exp.oracle_repeats)
        if d.verdict == COMPATIBLE:
            passes.add(tid)
    if {t.id for t in frozen.tasks} != passes:
        r.problems.append(f"{where}: the frozen set is not exactly the oracle's exception-free passes on the "
                          "tasks some control can test")
    controls = attempts[attempts["phase"] == "controls"]
    if not set(controls["task_id"]) <= {t.id for t in frozen.tasks}:
        r.problems.append(f"{where}: controls ran on tasks outside the frozen set")
    r.checked.append("the frozen set re-derived from the oracle's attempts")


def _names(paths: RunPaths, s, found: dict[str, Manifest], r: AuditResult) -> None:
    """run.json names exactly the run's contracts by their sha256."""
    if s.manifest_sha256 != found[MANIFEST].sha256:
        r.problems.append(f"{paths.summary}: manifest_sha256 is not manifest.json's")
    if (s.frozen_manifest_sha256 or None) != (found[FROZEN_MANIFEST].sha256
                                              if FROZEN_MANIFEST in found else None):
        r.problems.append(f"{paths.summary}: frozen_manifest_sha256 is not {FROZEN_MANIFEST}'s")
    variants = {Path(k).stem: m.sha256 for k, m in found.items() if k.startswith(f"{VARIANTS}/")}
    if s.variant_manifest_sha256 != variants:
        r.problems.append(f"{paths.summary}: variant_manifest_sha256 is not the {VARIANTS}/ "
                          f"contracts' {variants}")


def _rederive(paths: RunPaths, at, by_phase, attempts: pd.DataFrame, s, found, r: AuditResult) -> None:
    """With the environment at hand: every reward re-scored (the run's and each smoke rerun's),
    every verdict and exclusion row rebuilt."""
    rescore(paths, at, by_phase, r)
    for name, m in sorted(found.items()):
        rerun = RunPaths(paths.root / Path(name).parent / SMOKE_RUN)
        if name.startswith(f"{SMOKE}/") and rerun.attempts.is_file():
            rescore(rerun, at, {"smoke": m}, r, label=f"{Path(name).parent}/{SMOKE_RUN}: ")
    _verdicts(paths, attempts, s, found, at, r)


def audit(root: Path, signature: Path | None = None, identity: str = "validate", data: tuple = (),
          manifests: Path | None = None) -> AuditResult:
    """Every problem found (each naming its file), what was re-derived, and what is sealed only.
    `manifests`: the committed contracts' directory (default: the project's ``manifests/``)."""
    paths = RunPaths(Path(root))
    r = AuditResult(sealed_only=list(SEALED_ONLY))
    if not paths.manifest.is_file():
        r.problems.append(f"{paths.root}: not a run directory (no manifest.json)")
        return r
    check_seal(paths, r)
    if signature is not None:
        problem = verify_signature(paths, signature, identity)
        (r.problems.append(problem) if problem else r.checked.append(f"signature of {identity}"))
    found = read_manifests(paths, r)
    if n := check_anchor(paths, found,
                         manifests if manifests is not None else committed_manifests(paths.root), r):
        r.checked.append(f"{n} contract(s) compared with the committed manifests")
    tables = _tables(paths, r)
    try:
        ev = load_run(paths.root)
    except EvidenceError as e:
        r.problems.append(str(e))
        return r
    if len(tables) < 3 or MANIFEST not in found:
        return r
    s = ev.summary
    _names(paths, s, found, r)
    by_phase = {p: found[g.manifest] for g in s.groups for p in g.attempt_phases if g.manifest in found}
    if "controls" in by_phase and FROZEN_MANIFEST in found:
        by_phase["controls"] = found[FROZEN_MANIFEST]
    attempts = tables[ATTEMPTS]
    _attempts(attempts, by_phase, r, paths.attempts)
    check_build_logs(paths, found, attempts, r)
    check_reply_images(paths, by_phase, attempts, r)
    check_base_maps(paths, found, r)
    at = EnvAtHand(found, data, paths.root, r)
    if at.ok:
        _rederive(paths, at, by_phase, attempts, s, found, r)
        check_patches(paths, found, at.taskset, r)
    else:
        r.problems.append(f"{paths.tasks}: no reward re-scored and no verdict re-derived: the environment is "
                          "not at hand (see above)")
    _frozen(attempts, tables[TASKS], found, r, paths.frozen_manifest)
    check_identity(ev, tables, found, at if at.ok else None, r)
    check_counts(ev, tables, found, r)
    check_smokes(ev, paths, found, r)
    check_rendered(ev, paths, r, audit)  # a copy a resume kept is audited as a run
    return r
