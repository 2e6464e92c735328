"""Audit, second half: the numbers and the run's identity. run.json's counts, facts and
dataset verdict, its backend, image, agents, run id, times and dataset findings are
recomputed from the ledgers, the contract and the environment, and its smoke fact is held to
the smoke entries. The documents (reports, smoke results) are rendered again and compared
byte for byte by `validate.audit.reports`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from validate.core.paths import ATTEMPTS, EXCLUSIONS, MANIFEST, PATCH, SUMMARY, TASKS, RunPaths
from validate.core.records import EXCLUDED, PILOT, Attempt, FindingRow, TaskVerdict, unflatten, verdict_of_row
from validate.evidence.journal import file_sha256
from validate.evidence.run import smoke_outcome
from validate.evidence.summary import ProbeCheck
from validate.evidence.verdicts import dataset_verdict
from validate.run.lifecycle import chance_means, counts, hack_profile
from validate.run.phases import CRITERIA, probe_checks, stratify


def verdict_rows(path: Path) -> list[TaskVerdict]:
    """tasks.parquet as models (pyarrow's Python objects: no NaN, lists as lists)."""
    return [verdict_of_row(rec) for rec in pq.read_table(path).to_pylist()]


def check_identity(ev, tables, manifests, at, r) -> None:
    """run.json's identity against the contract, the attempts and (`at`, when at hand) the
    environment; every row's run id against run.json's."""
    s, where = ev.summary, ev.root / SUMMARY
    m = manifests[MANIFEST]
    ex = m.execution
    said = (s.environment, s.backend, s.backend_version, s.image, s.image_digest)
    if said != (m.environment.name, ex.backend, ex.backend_version, ex.image, ex.image_digest):
        r.problems.append(f"{where}: environment, backend, backend_version, image or image_digest {said} is "
                          "not the contract's")
    a = tables[ATTEMPTS]
    declared = {n for x in manifests.values() for n in x.expectations.agents}
    if s.agents != sorted(set(a["agent"])) or not set(s.agents) <= declared:
        r.problems.append(f"{where}: agents {s.agents} are not the attempts' {sorted(set(a['agent']))}")
    for name, table in tables.items():
        if len(table) and set(table["run_id"]) != {s.run_id}:
            r.problems.append(f"{ev.root / name}: rows of a run other than {s.run_id}")
    if len(a):
        ends = pd.to_datetime(a["finished_at"], utc=True)
        starts = pd.to_datetime(a["started_at"], utc=True)
        if (starts > ends).any() or ends.max() > pd.Timestamp(s.finished_at) or s.started_at > s.finished_at:
            r.problems.append(f"{where}: finished_at {s.finished_at.isoformat()} is before an attempt's end "
                              f"({ends.max().isoformat()}), or a span runs backwards")
    if at is not None:
        taskset = at.taskset(m)
        found = [FindingRow(**f.model_dump()).model_dump()
                 for f in at.env.dataset_findings(taskset, (taskset.task(e.idx) for e in m.tasks))]
        if found != [f.model_dump() for f in s.dataset_findings]:
            r.problems.append(f"{where}: dataset_findings are not the environment's")
        every = at.env.families(taskset)
        uncovered = None if every is None else sorted(set(every) - set(tables[TASKS]["family"]))
        if uncovered != s.families_uncovered:
            r.problems.append(f"{where}: families_uncovered {s.families_uncovered} is not the environment's "
                              f"{uncovered}")
        if s.kind == PILOT:
            _check_strata(s, m, at, taskset, r, where)
    r.checked.append("run.json's environment, backend, image, agents, run id and end time against the "
                     "contract and the attempts")


def _check_strata(s, m, at, taskset, r, where) -> None:
    """A pilot's strata are the environment's over the contract's tasks, the lowest idx of each
    sampled (`validate.run.phases.stratify`, given the run's per-stratum count: its largest sample)."""
    from types import SimpleNamespace

    per_stratum = max((len(x.sampled) for x in s.strata), default=0)
    # A stand-in for the run's context: stratify reads only its manifest, env and taskset.
    ctx = SimpleNamespace(manifest=m, env=at.env, taskset=taskset)
    again = stratify(ctx, per_stratum)  # type: ignore[arg-type]
    if [x.model_dump() for x in again] != [x.model_dump() for x in s.strata]:
        r.problems.append(f"{where}: strata are not the environment's strata of the contract's tasks")


def check_counts(ev, tables, manifests, r) -> None:
    s, where = ev.summary, ev.root / SUMMARY
    verdicts = verdict_rows(ev.root / TASKS)
    a = tables[ATTEMPTS]
    # the run's own counting, on the ledgers
    recount = counts(verdicts, ev.root / ATTEMPTS, hack_profile(ev.manifest))
    if recount != s.counts:
        r.problems.append(f"{where}: counts {s.counts.model_dump()} differ from the ledgers' "
                          f"{recount.model_dump()}")
    excluded = {(v.phase, v.task_id): v.reason for v in verdicts if v.verdict == EXCLUDED}
    ledger = {(x.phase, x.task_id): x.reason for x in tables[EXCLUSIONS].itertuples()}
    if excluded != ledger:
        r.problems.append(f"{ev.root / EXCLUSIONS}: does not list exactly the excluded tasks "
                          "with their reasons")
    f = s.facts
    derived = (recount.tasks, recount.compatible, recount.excluded, recount.incomplete,
               sum(v.verdict == EXCLUDED and v.reason is None for v in verdicts),
               [x.detail for x in s.dataset_findings if x.blocking])
    if (f.tasks, f.compatible, f.excluded, f.incomplete, f.excluded_without_one_reason,
            f.blocking_dataset_findings) != derived:
        r.problems.append(f"{where}: the verdict's facts differ from the ledgers'")
    if f.chance_controls != chance_means(ev.root / ATTEMPTS, manifests[MANIFEST].expectations.rules()):
        r.problems.append(f"{where}: the chance-level controls' means differ from the attempts'")
    if f.interrupted != s.interrupted:
        r.problems.append(f"{where}: facts.interrupted is not the run's interrupted")
    if f.min_task_count != manifests[MANIFEST].min_task_count:
        r.problems.append(f"{where}: facts.min_task_count is not the contract's")
    if (f.patch == "documented") != (s.patch is not None) or (
            s.patch is not None and (not (ev.root / PATCH).exists()
                                     or "sha256:" + file_sha256(ev.root / PATCH) != s.patch.sha256)):
        r.problems.append(f"{where}: the patch record does not match patch.diff")
    if list(s.required) != list(CRITERIA.get(s.kind, ())):
        r.problems.append(f"{where}: the criteria required of a {s.kind} run are "
                          f"{list(CRITERIA.get(s.kind, ()))}")
    if dataset_verdict(f, s.required) != s.dataset_verdict:
        r.problems.append(f"{where}: the dataset verdict does not follow from its facts")
    if s.kind == PILOT:
        _check_probes(ev, a, verdicts, r)
    r.checked.append("run.json's counts, facts and dataset verdict recomputed")


def _check_probes(ev, a: pd.DataFrame, verdicts, r) -> None:
    attempts = [Attempt.model_validate(unflatten({k: (None if isinstance(v, float) and pd.isna(v) else v)
                                                   for k, v in row.items()})) for row in a.to_dict("records")]
    checks: list[ProbeCheck] = []
    for g in ev.summary.groups:
        checks += probe_checks(g.phase.removeprefix("pilot-"), [x for x in attempts if x.phase == g.phase],
                               [v for v in verdicts if v.phase == g.phase])
    if [c.model_dump() for c in checks] != [c.model_dump() for c in ev.summary.probes]:
        r.problems.append(f"{ev.root / SUMMARY}: the probe checks differ from the attempts'")
    if (ev.summary.facts.probes_total, ev.summary.facts.probes_ok) != (len(checks),
                                                                       sum(c.ok for c in checks)):
        r.problems.append(f"{ev.root / SUMMARY}: the probe counts in its facts differ from the attempts'")


def check_smokes(ev, paths: RunPaths, manifests, r) -> None:
    """run.json's smoke fact against the entries (each entry's result.json is derived again
    byte for byte by `validate.audit.reports.check_rendered`)."""
    said = ev.summary.facts.smoke  # as of the run's end: the run's own entry, the first one
    first = smoke_outcome({k: ev.smokes[k] for k in sorted(ev.smokes)[:1]})
    if said != "not run" and said != first:
        r.problems.append(f"{paths.summary}: facts.smoke is {said!r} but the smoke entries say {first!r}")
