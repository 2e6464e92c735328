"""Re-check an eval run directory without rerunning anything (`validate eval audit RUN_DIR`).

It belongs to the audit layer, above evaluation: it reads what ``validate/eval/`` wrote and
re-derives it with the audit's own checks, and nothing under ``validate/eval/`` imports it.

Nothing the run wrote about itself is trusted:

1. Seal: every file is listed in ``checksums`` and matches it, none missing or extra, every
   line well formed (`validate.audit.seal.check_seal`, the one check both audits run).
2. Contracts: the eval contract's and the dataset manifest's own sha256 hold; the eval
   contract's parent is that manifest; eval.json names both, and its model, environment,
   backend and image digest are theirs; each equals the committed ``manifests/<name>.json``
   when one exists; the manifest is held to the environment's code and data.
3. Attempts: keys unique, superseded flags follow the try numbers, every attempt is the
   model's (agent ``model``, role ``model``) on a task of the manifest with its hash, in
   ``eval-greedy`` (sample 0) or ``eval`` (samples 0..k−1), on the contract's backend and
   the image it routes the task to (its frozen task image, else the sandbox image, as the
   validation audit holds trials: `validate.audit.taskimages.routed_digests`); its reply,
   workspace and reward re-derive (re-scored offline, `validate.audit.env`).
4. Samples and trajectories: exactly one sample row per attempt; its ``solved`` flag and its
   failure class and rule re-derived (`validate.eval.classes`); each attempt's turn rows
   number exactly its ``turns``.
5. Metrics: eval.json and eval-tasks.parquet recomputed from the attempts and sample rows
   (`validate.eval.summary`); each report rendered again from the files it names and
   compared byte for byte (`validate.audit.reports`).

Each problem names its file.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from validate.audit.contracts import check_anchor, committed_manifests
from validate.audit.env import EnvAtHand, rescore
from validate.audit.reports import check_eval_rendered
from validate.audit.run import EVAL_SEALED_ONLY, check_attempt_keys
from validate.audit.seal import AuditResult, check_seal
from validate.audit.taskimages import routed_digests
from validate.contract.manifest import ContractError, load_manifest
from validate.core.errors import EvidenceError
from validate.core.paths import EVAL_CONTRACT, MANIFEST, RunPaths
from validate.core.records import MODEL, Attempt
from validate.eval.classes import classify
from validate.eval.contract import load
from validate.eval.evidence import EvalPaths
from validate.eval.metrics import GREEDY_PHASE, SAMPLED_PHASE, solved
from validate.eval.records import SampleRow
from validate.eval.report import load_eval
from validate.eval.summary import summarize
from validate.evidence.journal import read_attempts
from validate.kinds.chat import MODEL_AGENT, facts_of


def _attempts(a: pd.DataFrame, manifest, k: int, r: AuditResult, where: Path) -> None:
    check_attempt_keys(a, r, where)
    hashes = {t.id: t.hash for t in manifest.tasks}
    bad = a[[hashes.get(t) != h for t, h in zip(a["task_id"], a["task_hash"], strict=True)]]
    if len(bad):
        r.problems.append(f"{where}: {len(bad)} attempt(s) name a task or hash the manifest does not hold")
    if set(a["agent"]) - {MODEL_AGENT} or set(a["role"]) - {MODEL}:
        r.problems.append(f"{where}: attempts of an agent or role other than the model")
    if set(a["phase"]) - {GREEDY_PHASE, SAMPLED_PHASE}:
        r.problems.append(f"{where}: attempts of phases "
                          f"{sorted(set(a['phase']) - {GREEDY_PHASE, SAMPLED_PHASE})}")
    wrong = (((a["phase"] == GREEDY_PHASE) & (a["sample"] != 0))
             | ((a["phase"] == SAMPLED_PHASE) & (a["sample"] >= k)))
    if wrong.any():
        r.problems.append(f"{where}: sample numbers outside the pass's range")
    ex = manifest.execution
    routed = routed_digests(manifest, a["task_id"])  # a task's frozen image, else the sandbox image
    off = a[(a["backend"] != ex.backend) | (a["image_digest"] != routed)]
    if len(off):
        r.problems.append(f"{where}: {len(off)} attempt(s) on a backend or image_digest that is not the "
                          f"contract's ({ex.backend}, the image it routes the task to); first: task "
                          f"{off.iloc[0]['task_id']} {off.iloc[0]['backend']} {off.iloc[0]['image_digest']}")
    r.checked.append(f"{len(a)} attempts against the manifest")


def _samples(attempts: list[Attempt], samples: list[SampleRow], turns: dict[tuple, list], threshold: float,
             r: AuditResult, paths: EvalPaths) -> None:
    by_key = {s.key(): s for s in samples}
    keys = {(a.phase, a.task_id, a.agent, a.sample, a.attempt) for a in attempts}
    if set(by_key) != keys or len(by_key) != len(samples):
        r.problems.append(f"{paths.samples}: the sample rows are not exactly one per attempt")
    bad = 0
    for a in attempts:
        s = by_key.get((a.phase, a.task_id, a.agent, a.sample, a.attempt))
        if s is None:
            continue
        if solved(a.status, a.reward, threshold,
                  a.reward_decimal) != s.solved or classify(facts_of(a, s)) != (s.failure_class,
                                                                                s.failure_rule):
            bad += 1
            if bad <= 5:
                r.problems.append(f"{paths.samples}: {a.task_id} {a.phase} sample {a.sample} try "
                                  f"{a.attempt}: solved {s.solved} / class {s.failure_class} "
                                  f"({s.failure_rule}) do not follow from its status, reward and facts")
    counts = {k: len(v) for k, v in turns.items()}
    if any(k not in by_key for k in counts) or any(counts.get(k, 0) != s.turns for k, s in by_key.items()):
        r.problems.append(f"{paths.trajectories}: turn rows do not match the sample rows' turn counts")
    r.checked.append("every sample row, solved flag and failure class re-derived")


def _metrics(ev, attempts: list[Attempt], samples: list[SampleRow], manifest, r: AuditResult) -> None:
    c, s = ev.contract, ev.summary
    families = {row.task_id: row.family for row in ev.tasks.itertuples()}
    task_ids = [t.id for t in manifest.tasks]
    identity = {f: getattr(s, f) for f in ("run_id", "contract_sha256", "manifest_sha256", "environment",
                                           "model", "backend", "image_digest", "machine", "code_commit",
                                           "patch", "started_at", "finished_at", "interrupted")}
    again, tasks = summarize(attempts, samples, task_ids, families, c.k, c.reward.pass_threshold, **identity)
    if again.model_dump(mode="json") != s.model_dump(mode="json"):
        diff = [f for f in type(again).model_fields if getattr(again, f) != getattr(s, f)]
        r.problems.append(f"{ev.paths.summary}: does not recompute from the evidence (fields "
                          f"{', '.join(diff)})")
    if [t.model_dump() for t in tasks] != pq.read_table(ev.paths.tasks).to_pylist():
        r.problems.append(f"{ev.paths.tasks}: does not recompute from the attempts")
    # Every report is rendered again from the files it names and compared byte for byte
    # (`validate.audit.reports.check_eval_rendered`): after a resume, an earlier report states
    # the earlier evidence, so holding it to today's eval.json here would be wrong.
    r.checked.append("eval.json and eval-tasks.parquet recomputed")


def _identity(ev, contract, manifest, r: AuditResult) -> None:
    """eval.json's model, environment, backend and image are the contracts'; it ends after its
    attempts."""
    s = ev.summary
    said = (s.model, s.environment, s.backend, s.image_digest)
    want = (f"{contract.model.id}@{contract.model.revision}", manifest.environment.name,
            manifest.execution.backend, manifest.execution.image_digest)
    if said != want:
        r.problems.append(f"{ev.paths.summary}: model, environment, backend or image_digest {said} is not "
                          f"the contracts' {want}")
    ends = pd.to_datetime(ev.attempts["finished_at"], utc=True)
    if len(ends) and (ends.max() > pd.Timestamp(s.finished_at) or s.started_at > s.finished_at):
        r.problems.append(f"{ev.paths.summary}: finished_at {s.finished_at.isoformat()} is before an "
                          f"attempt's end ({ends.max().isoformat()}), or the run's span runs backwards")


def audit(root: Path, data: tuple = (), manifests: Path | None = None) -> AuditResult:
    paths = EvalPaths(RunPaths(Path(root)))
    r = AuditResult(sealed_only=list(EVAL_SEALED_ONLY))
    if not paths.contract.is_file():
        r.problems.append(f"{paths.root}: not an eval run directory (no eval-contract.json)")
        return r
    check_seal(paths.run, r)
    try:
        contract, manifest = load(paths.contract), load_manifest(paths.run.manifest)
        ev = load_eval(paths.root)
    except (ContractError, EvidenceError) as e:
        r.problems.append(str(e))
        return r
    if contract.parent.manifest_sha256 != manifest.sha256:
        r.problems.append(f"{paths.contract}: its parent is not manifest.json ({manifest.sha256})")
    if (ev.summary.contract_sha256, ev.summary.manifest_sha256) != (contract.sha256, manifest.sha256):
        r.problems.append(f"{paths.summary}: names another contract or manifest")
    r.checked.append("both contracts and their hash chain")
    directory = manifests if manifests is not None else committed_manifests(paths.root)
    n = check_anchor(paths.run, {MANIFEST: manifest}, directory, r, names=(MANIFEST,))
    n += check_anchor(paths.run, {EVAL_CONTRACT: contract}, directory, r, names=(EVAL_CONTRACT,),
                      loader=load)
    if n:
        r.checked.append(f"{n} contract(s) compared with the committed manifests")
    _identity(ev, contract, manifest, r)
    _attempts(ev.attempts, manifest, contract.k, r, paths.run.attempts)
    at = EnvAtHand({MANIFEST: manifest}, data, paths.root, r)
    if at.ok:
        rescore(paths.run, at, {GREEDY_PHASE: manifest, SAMPLED_PHASE: manifest}, r)
    else:
        r.problems.append(f"{paths.run.attempts}: no reward re-scored: the environment is not at "
                          "hand (see above)")
    attempts = read_attempts(paths.run)
    samples = [SampleRow.model_validate(row) for row in pq.read_table(paths.samples).to_pylist()]
    _samples(attempts, samples, ev.turns, contract.reward.pass_threshold, r, paths)
    _metrics(ev, attempts, samples, manifest, r)
    check_eval_rendered(ev, paths, r, audit)  # a copy a resume kept is audited as an eval run
    return r
