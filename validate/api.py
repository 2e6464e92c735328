"""The harness as a Python API: what the ``validate`` command does, callable from a notebook
or a training pipeline without a subprocess. Each function returns a typed result (a
`Manifest`, a `RunSummary`, an `AuditResult`, a `RunEvidence` with pandas dataframes) and
raises a `validate.core.errors.ValidateError` subclass naming the field or file on bad input.

    from validate import api

    manifest = api.freeze("pool", config={"max_papers": 3}, idx_stop=100, data=["papers.jsonl.gz"])
    summary = api.pool("manifests/pool.json", data=["papers.jsonl.gz"])
    print(summary.dataset_verdict.headline, summary.counts.compatible)
    run = api.load_run(summary_dir)            # run.tasks, run.attempts: DataFrames
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, ValidationError

from environment.protocol import LoadHints, sha256_tag
from validate.cli.options import (  # DEFAULT_CONCURRENCY: the command line reads it there, light to import
    DEFAULT_CONCURRENCY,
    existing_dir,
    existing_file,
    min_count as check_min_count,
    model_spec,
    model_values,
    output_dir,
    output_file,
    outside_data,
    run_directory,
    utf8_path,
)
from validate.contract.manifest import (
    TrialProfile,
    check_environment,
    check_limits,
    check_tasks,
    freeze as freeze_contract,
    load_manifest,
    load_taskset,
    new_salt,
    reprofile,
    task_secret,
    verifier_mode_of,
    verify as verify_contract,
    write_manifest,
)
from validate.core import environments
from validate.core.errors import ValidateError
from validate.core.paths import (
    DEFAULT_IMAGE,
    EVAL_CONTRACT,
    LEDGER_DIR,
    MANIFEST,
    MANIFEST_DIR,
    RunPaths,
    task_image_store,
)
from validate.core.records import EVAL, PILOT, POOL
from validate.eval import contract as ec
from validate.eval.client import ChatClient
from validate.eval.freeze import dataset_manifest, parent_of
from validate.eval.preflight import preflight
from validate.eval.run import EvalPhase, evaluate
from validate.evidence import run as run_evidence
from validate.evidence.journal import atomic_write
from validate.evidence.patches import require
from validate.evidence.signing import sign as sign_run
from validate.evidence.summary import run_kind
from validate.kinds import KINDS
from validate.kinds.chat import model_kind_class
from validate.report.profiles import compare_profiles as profile_comparison
from validate.run.context import Progress, RunContext
from validate.run.executors import DEFAULT_EXECUTOR, EXECUTORS, ExecutorUnavailable, make_executor
from validate.run.lifecycle import reopen
from validate.run.phases import (
    PilotPhase,
    PoolPhase,
    RunPhase,
    pilot as pilot_phase,
    pool as pool_phase,
    run_agents,
)
from validate.run.smoke import SmokePhase, smoke as smoke_test
from validate.sandbox import Limits, open_sandbox
from validate.sandbox.image import SOURCE_DATE_EPOCH
from validate.taskdir.images import transfer
from validate.taskdir.images.build import BuildPolicy
from validate.taskdir.images.docker import images_for
from validate.taskdir.images.frozen import freeze_images, log_dir_of, verify_images
from validate.taskdir.images.trust import bundle_digest, bundle_for
from validate.taskdir.trial import tool as trial_tool
from validate.taskdir.trial.workpaths import RULE as WORK_PATHS_RULE

MAX_TASKS = 1_000_000
PathLike = str | Path


def selection(size: int | None, idx: Sequence[int] | None = None, idx_start: int = 0,
              idx_stop: int | None = None) -> tuple[list[int], str]:
    """The task indices a contract holds and the rule in words; refuses what cannot be."""
    if idx is not None:
        bad = [i for i in idx if i < 0 or (size is not None and i >= size) or i >= 2**63]
        if bad or not idx:
            limit = f" and < {size}" if size is not None else ""
            raise ValidateError(f"--idx: every index must be ≥ 0{limit}; got {bad[:5] or 'none'}")
        twice = sorted(i for i, n in Counter(idx).items() if n > 1)
        if twice:  # silently one task where the user counted two
            raise ValidateError(f"--idx: each index once; {', '.join(map(str, twice[:5]))} "
                                "given more than once")
        return list(idx), f"explicit idx list of {len(idx)} tasks"
    stop = idx_stop if idx_stop is not None else (size if size is not None else 20)
    if idx_start < 0 or stop <= idx_start:
        raise ValidateError(f"--idx-stop: must be greater than --idx-start ({idx_start}), which must be ≥ 0")
    if size is not None and stop > size:
        raise ValidateError(f"--idx-stop: the taskset has {size} tasks (idx 0..{size - 1}); got {stop}")
    if stop - idx_start > MAX_TASKS:
        raise ValidateError(f"--idx-stop: at most {MAX_TASKS:,} tasks per contract; got {stop - idx_start:,}")
    return list(range(idx_start, stop)), f"contiguous idx range [{idx_start}, {stop})"


def _ceilings(ceilings: dict[str, float] | None) -> dict[str, float]:
    for name, value in (ceilings or {}).items():
        if not (isinstance(value, int | float) and math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValidateError(f"--ceiling: {name}={value!r}: the reward must be in [0, 1]")
    return dict(ceilings or {})


def _some_task_can_pass(env, taskset, idx: Sequence[int]) -> None:
    """Refuse a selection whose every task has a blocking finding: none could ever be compatible,
    and a pool of it would play every agent only to FAIL. The scan ends at the first task free
    of them, so a usual selection costs one task's findings."""
    first = None
    for i in idx:
        try:
            blocking = [f for f in env.findings(taskset.task(i)) if f.blocking]
        except (ValueError, IndexError):
            return  # a task that cannot be generated: the freeze names it
        if not blocking:
            return
        first = first or (i, blocking[0])
    i, f = first
    raise ValidateError(f"selection: all {len(idx)} selected tasks have a blocking finding, so none can pass "
                        f"(task idx {i}: {f.detail}); select other tasks (--idx, --idx-start, "
                        "--idx-stop) or other data")


def _config(env, config: BaseModel | dict | PathLike | None, overrides: dict[str, Any]) -> BaseModel:
    if isinstance(config, BaseModel):
        config = config.model_dump(mode="json")
    where = "config"
    if isinstance(config, str | Path):
        where = str(config)
        try:
            config = tomllib.loads(Path(config).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ValidateError(f"--config: {where}: not a readable TOML file ({e})") from None
    return model_values(env.Config, dict(config or {}), overrides, where)


def _config_file(config) -> str | None:
    if not isinstance(config, str | Path):
        return None
    return f"{Path(config).name} {sha256_tag(Path(config).read_bytes())}"


#: The most oracle repeats a contract may ask (the contract's own bound).
MAX_ORACLE_REPEATS = 100


def check_oracle_repeats(n: object) -> int:
    """`n` as the contract's oracle repeats: an integer from 1 to `MAX_ORACLE_REPEATS`."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ORACLE_REPEATS:
        raise ValidateError(f"--oracle-repeats: expected an integer from 1 to {MAX_ORACLE_REPEATS} (how many "
                            f"times the oracle plays each task), got {n!r}")
    return n


def trial_profile(verifier_mode: str) -> TrialProfile:
    """This harness's trial profile in `verifier_mode` (an unknown mode names the option)."""
    if verifier_mode not in ("trusted", "shared"):
        raise ValidateError(f"--verifier-mode: trusted or shared, got {verifier_mode!r} (trusted verifies in "
                            "a fresh container of the task's image; shared in the agent's "
                            "own, as Harbor does)")
    return TrialProfile(verifier_mode=verifier_mode,
                        work_paths_rule=WORK_PATHS_RULE if verifier_mode == "trusted" else None,
                        tool_sha256=sha256_tag(trial_tool.SOURCE.read_bytes()))


def freeze(name: str, *, env: str | None = None, config: BaseModel | dict | PathLike | None = None,
           config_overrides: dict[str, Any] | None = None, idx: Sequence[int] | None = None,
           idx_start: int = 0, idx_stop: int | None = None, backend: str = "docker",
           image: str = DEFAULT_IMAGE, limits: dict[str, Any] | None = None,
           controls: Sequence[str] | None = None, ceilings: dict[str, float] | None = None,
           pass_threshold: float | None = None, exception_rule: str = "strict", min_count: int | None = None,
           infra_retries: int = 2, data: Sequence[PathLike] = (), allow_patch: bool = False,
           out: PathLike | None = None, log: Callable[[str], None] = lambda m: None, oracle_repeats: int = 1,
           verifier_mode: str = "trusted", build_trust_store: str = "off", build_clock: str = "fixed",
           registry: str | None = None, image_budget_gb: float | None = None):
    """Freeze and write a contract manifest (default ``manifests/<name>.json``); return it. A
    task-directory dataset's images are built (or taken from the cache) and frozen with it,
    their build logs kept in ``<name>.build-logs/`` beside it; `log` hears the builds.
    `oracle_repeats`: how many times the oracle plays each task (every repeat must pass).
    `verifier_mode` (a task-directory dataset): ``trusted`` or ``shared`` (`TrialProfile`).
    `build_trust_store`: the CA bundle task builds are given (``off``, or ``host``: this
    machine's; `validate.taskdir.images.trust`), its sha256 recorded in the build policy.
    `build_clock`: ``fixed`` gives builds one clock (``SOURCE_DATE_EPOCH`` and git's dates), so
    a rebuild elsewhere writes the same bytes and is held to the frozen content; ``real``: the
    build's own. `registry`: a registry or mirror (``host[:port]``) the bases and prebuilt
    images are pulled from by reference and frozen by digest, instead of the offline map.
    `image_budget_gb`: task images other than this contract's are pruned while the daemon's
    task images take more (each removal logged)."""
    check_oracle_repeats(oracle_repeats)
    trial = trial_profile(verifier_mode)
    env_name = env or environments.default_name()
    if env_name is None:
        raise ValidateError("--env: no environment given and none is the default; install one")
    path = output_file(out if out is not None else MANIFEST_DIR / f"{name}.json", "--out")
    environment = environments.get(env_name)
    cfg = _config(environment, config, config_overrides or {})
    lim = check_limits(model_values(Limits, {}, dict(limits or {}), "limits"))
    code = require(allow_patch)
    hints = LoadHints(search=tuple(Path(p) for p in data), log=log)
    # The tasks and their revision are read once, here, before anything is written: the
    # contract is made of this very taskset (with the secret of the salt it will hold).
    salt = new_salt()
    taskset = load_taskset(environment, cfg, dataclasses.replace(hints, secret=task_secret(salt)))
    outside_data((path, log_dir_of(path)), getattr(taskset, "data_files", ()), "--out", path)
    source = getattr(taskset, "source", None)
    if source is not None:  # read once: the contract's own load reads this very source again
        hints = dataclasses.replace(hints, source=source)
        log(f"dataset {cfg.model_dump().get('dataset', '')}: {taskset.size} tasks, revision "
            f"{taskset.revision}")
    chosen, rule = selection(taskset.size, idx, idx_start, idx_stop)
    check_min_count(min_count, len(chosen))
    _some_task_can_pass(environment, taskset, chosen)
    sandbox = open_sandbox(backend, image=image)
    # A task-directory dataset on docker: every task's image built (or cached) and frozen.
    if build_clock not in ("fixed", "real"):
        raise ValidateError(f"--build-clock: {build_clock!r}; give fixed or real")
    try:
        policy = BuildPolicy(trust_store=bundle_digest(bundle_for(build_trust_store)),
                             clock=SOURCE_DATE_EPOCH if build_clock == "fixed" else None, registry=registry)
    except ValidationError:
        raise ValidateError(f"--registry: {registry!r} is not a registry; give host[:port][/path], e.g. "
                            f"127.0.0.1:5000 or mirror.example.org/hub") from None
    if image_budget_gb is not None and not (math.isfinite(image_budget_gb) and image_budget_gb > 0):
        raise ValidateError(f"--image-budget-gb: a number of GiB > 0, got {image_budget_gb}")
    images = freeze_images(taskset, chosen, sandbox.backend, log_dir_of(path), task_image_store(), log=log,
                           policy=policy, budget_bytes=None if image_budget_gb is None
                           else int(image_budget_gb * 2**30))
    manifest = freeze_contract(
        name=name, env_name=environment.name, config=cfg, hints=hints, idx=chosen, rule=rule,
        facts=sandbox.facts(), controls=controls, ceilings=_ceilings(ceilings), pass_threshold=pass_threshold,
        exception_rule=exception_rule, min_task_count=min_count, git_commit=code.label, patch=code.patch,
        limits=lim, infra_retries=infra_retries, config_file=_config_file(config),
        oracle_repeats=oracle_repeats, loaded=(salt, taskset),
        **({} if images is None else {"task_images": images}),
        **({"trial": trial} if KINDS.load(environment.attempt_kind).trial_profile else {}))
    write_manifest(manifest, path)
    return manifest


def freeze_like(name: str, like: PathLike, *, backend: str = "docker", image: str = DEFAULT_IMAGE,
                limits: dict[str, Any] | None = None, infra_retries: int | None = None,
                data: Sequence[PathLike] = (), allow_patch: bool = False, out: PathLike | None = None,
                log: Callable[[str], None] = lambda m: None, verifier_mode: str | None = None):
    """Freeze the contract `like` on another execution profile (``validate freeze --like``):
    the same tasks, expectations and salt, so `compare_profiles` can set the two runs side by
    side. Limits and infrastructure retries are `like`'s unless given. A task-directory
    dataset's images are frozen again on this profile, as `freeze` does (their build logs in
    ``<name>.build-logs/``); `log` hears the builds; its verifier mode is `like`'s unless
    `verifier_mode` is given (a contract frozen before the field: shared). Return the manifest."""
    path = output_file(out if out is not None else MANIFEST_DIR / f"{name}.json", "--out")
    m = load_manifest(existing_file(like, "--like"))
    trial = None if verifier_mode is None and m.execution.trial is None else \
        trial_profile(verifier_mode or verifier_mode_of(m.execution))
    lim = check_limits(model_values(Limits, m.execution.limits.model_dump(), dict(limits or {}), "limits"))
    code = require(allow_patch)
    env, config, taskset = check_environment(m, LoadHints(search=tuple(Path(p) for p in data)))
    outside_data((path, log_dir_of(path)), getattr(taskset, "data_files", ()), "--out", path)
    check_tasks(m, env, config, taskset)  # the tasks load here exactly as the contract froze them
    sandbox = open_sandbox(backend, image=image)
    try:
        # The task images are this profile's, frozen as `freeze` freezes them (the same tasks;
        # on the same daemon, the same ids from the cache); none on a backend that builds at run time.
        like_images = m.execution.task_images
        images = freeze_images(taskset, m.selection.idx, sandbox.backend, log_dir_of(path),
                               task_image_store(), log=log,
                               **({} if like_images is None else {"policy": like_images.build_policy}))
        manifest = reprofile(m, name=name, facts=sandbox.facts(), git_commit=code.label, patch=code.patch,
                             limits=lim, infra_retries=m.execution.infra_retries if infra_retries is None
                             else infra_retries, **({} if images is None else {"task_images": images}),
                             **({} if trial is None else {"trial": trial}))
    finally:
        sandbox.close()
    write_manifest(manifest, path)
    return manifest


def compare_profiles(run_a: PathLike, run_b: PathLike, *, out: PathLike | None = None):
    """Every task whose verdict or reason differs between two runs of one dataset contract on
    two execution profiles; refused (naming the field) when the contracts differ in anything
    else. Returns the comparison and the directory it was written to."""
    for run, flag in ((run_a, "RUN_A"), (run_b, "RUN_B")):
        existing_dir(run, flag)
        if _is_eval(run):
            raise ValidateError(f"{flag}: {run} is a model evaluation; compare evals with "
                                "`validate eval compare`")
    if out is not None:
        output_dir(out, "--out")
    return profile_comparison(Path(run_a), Path(run_b), None if out is None else Path(out))


def verify(manifest: PathLike, data: Sequence[PathLike] = (), log: Callable[[str], None] = lambda m: None):
    """Check a manifest against this machine, a task-directory contract's frozen task images
    too (`validate.taskdir.images.frozen.verify_images`); return it (or raise naming the field).
    `log` hears what holds but deserves a word (a registry tag that moved since the freeze)."""
    m = load_manifest(manifest)
    _, taskset = verify_contract(m, open_sandbox(m.execution.backend, image=m.execution.image),
                                 LoadHints(search=tuple(Path(p) for p in data)))
    notes: list[str] = []
    _hold_task_images(m, taskset, log_dir_of(Path(manifest)), notes)
    for note in notes:
        log(note)
    return m


def export_task_images(manifest: PathLike, out: PathLike, log: Callable[[str], None] = print) -> Path:
    """Every task image `manifest` froze, held here, as one archive in `out`
    (`validate.taskdir.images.transfer`)."""
    path = existing_file(manifest, "--manifest")
    return transfer.export_task_images(load_manifest(path), path, Path(out), log=log)


def import_task_images(archive: PathLike, manifest: PathLike, log: Callable[[str], None] = print) -> int:
    """Load a task-image archive of `manifest` (only its frozen images, each then held to its
    key, layers and content); return how many images."""
    path = existing_file(manifest, "--manifest")
    return transfer.import_task_images(existing_file(archive, "FILE"), load_manifest(path), path, log=log)


def _hold_task_images(m, taskset, evidence: Path | None = None, notes: list[str] | None = None) -> None:
    """A task-directory contract's frozen task images, each held by this daemon, or rebuilt
    from the cache as that very id or, on another machine, as the frozen content
    (`verify_images`, naming the files that differ from the listing in `evidence`), as the
    sandbox image is checked; else a `ContractError` naming the task."""
    if m.execution.task_images is not None:
        verify_images(m.execution.task_images, taskset, task_image_store(), images_for(m.execution.backend),
                      evidence, notes)


def context(manifest: PathLike | None, *, kind: str, run_dir: PathLike | None = None,
            resume: PathLike | None = None, concurrency: int = DEFAULT_CONCURRENCY,
            data: Sequence[PathLike] = (), allow_patch: bool = False, executor: str = DEFAULT_EXECUTOR,
            progress: Progress | None = None):
    """Load and verify the manifest, check the code, open the backend, pick the run directory;
    attempts will be carried out by `executor` at `concurrency`, reporting to `progress`."""
    if not 1 <= concurrency <= 256:
        raise ValidateError("--concurrency: must be between 1 and 256")
    runner = make_executor(executor, concurrency)  # an unknown name is refused before anything runs
    if resume is not None:
        root = Path(resume)
        utf8_path(root, "--resume")
        if not (root / MANIFEST).is_file():
            raise ValidateError(f"--resume: {root} is not a run directory (no {MANIFEST})")
        m = load_manifest(manifest or root / MANIFEST)
    else:
        if manifest is None:
            raise ValidateError("--manifest: required (or --resume RUN_DIR to continue a run)")
        m = load_manifest(manifest)
        root = (Path(run_dir) if run_dir
                else LEDGER_DIR / f"{m.name}-{kind}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
        if (root / MANIFEST).exists():
            raise ValidateError(f"--run-dir: {root} already holds a run; use --resume {root} to continue it")
        run_directory(root, "--run-dir")  # its name is the run id: refused before anything runs, not after
    code = require(allow_patch)
    hints = LoadHints(search=tuple(Path(p) for p in data))
    sandbox = open_sandbox(m.execution.backend, image=m.execution.image,
                           run_label=RunPaths(root).sandbox_label)
    try:
        env, taskset = verify_contract(m, sandbox, hints)
        # Before anything plays (a Ray node fetches each task image from this daemon, by id):
        # else refused naming the task, not played as one infrastructure error per trial.
        _hold_task_images(m, taskset, log_dir_of(Path(manifest)) if manifest is not None else None)
    except BaseException:
        sandbox.close()
        raise
    return RunContext(env=env, manifest=m, taskset=taskset, sandbox=sandbox, paths=RunPaths(root),
                      run_id=root.name, code=code, hints=hints, executor=runner,
                      progress=progress or Progress())


def _phase_config(model: type[BaseModel], **values: Any) -> Any:
    """A phase's config model from the command's options; a bad value is one error naming
    the option (``--per-stratum``), not a traceback."""
    try:
        return model(**values)
    except ValidationError as e:
        err = e.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else model.__name__
        raise ValidateError(f"{flag}: {err['msg']}") from None


def _phase(ctx, fn: Callable):
    try:
        return fn(ctx)
    finally:
        ctx.sandbox.close()


def run(manifest: PathLike | None = None, *, agents: str | Sequence[str] = "all", phase: str = "run",
        progress: Progress | None = None, **where):
    """Play `agents` on every task of the contract (one phase); return the run summary."""
    cfg = _phase_config(RunPhase, agents=agents if isinstance(agents, str) else list(agents), phase=phase)
    ctx = context(manifest, kind=phase, progress=progress, **where)
    return _phase(ctx, lambda c: run_agents(c, cfg))


def pilot(manifest: PathLike | None = None, *, per_stratum: int = 1, progress: Progress | None = None,
          **where):
    """The representative pilot (strata × config variants, probes); return the run summary."""
    if per_stratum < 1:
        raise ValidateError("--per-stratum: must be ≥ 1")
    cfg = _phase_config(PilotPhase, per_stratum=per_stratum)
    ctx = context(manifest, kind=PILOT, progress=progress, **where)
    return _phase(ctx, lambda c: pilot_phase(c, cfg))


def pool(manifest: PathLike | None = None, *, smoke_sample: int = 5, manifest_dir: PathLike | None = None,
         progress: Progress | None = None, log: Callable[[str], None] = print, **where):
    """Oracle → freeze the passes → controls → smoke; return the run summary. The frozen child
    is also written beside the contract it came from (or into `manifest_dir`)."""
    if smoke_sample < 0:
        raise ValidateError("--smoke-sample: must be ≥ 0")
    if manifest_dir is not None:  # the frozen child is written there after the whole pool has run
        output_dir(manifest_dir, "--manifest-dir")
    ctx = context(manifest, kind=POOL, progress=progress, **where)
    beside = Path(manifest_dir) if manifest_dir is not None else Path(manifest or ctx.paths.manifest).parent
    if manifest is None:  # resumed: the frozen child goes beside the run's own copy only
        beside = None
    cfg = _phase_config(PoolPhase, smoke_sample=smoke_sample, manifest_dir=beside)
    return _phase(ctx, lambda c: pool_phase(c, cfg, log=log))


def smoke(run_dir: PathLike, *, sample: int = 5, data: Sequence[PathLike] = (),
          log: Callable[[str], None] = print):
    """A fresh-materialisation smoke test of a pool, appended to its run directory."""
    cfg = _phase_config(SmokePhase, sample=sample)
    ctx, frozen = reopen(run_dir, tuple(Path(p) for p in data))
    return _phase(ctx, lambda c: smoke_test(c, frozen, cfg, log=log))


def _reading() -> SimpleNamespace:
    """What reads a run back (the audits, the reports, packaging, comparing evals), imported by
    the commands that use it: it needs pandas, which a run's driver never loads."""
    from validate.audit import eval as audit_eval, run as audit  # lazy: pandas loads only to read a run back
    from validate.eval import compare, report as eval_report  # lazy: pandas loads only to read a run back
    from validate.report import run as report  # lazy: pandas loads only to read a run back
    from validate.taskdir import package  # lazy: pandas loads only to read a run back

    return SimpleNamespace(audit=audit.audit, audit_eval=audit_eval.audit, package=package.package,
                           write_report=report.write_report, write_eval_report=eval_report.write_report,
                           compare=compare.compare)


def package(run_dir: PathLike, *, out: PathLike, data: Sequence[PathLike] = (),
            format: str = "directories") -> dict:
    """Write a sealed, audited task-directory run's retained tasks as a Harbor dataset into
    `out` (`validate.taskdir.package`; `format` ``parquet``: in the published shape); return its hash
    manifest."""

    existing_dir(run_dir, "RUN")
    utf8_path(Path(out), "--out")
    reading = _reading()
    return reading.package(Path(run_dir), Path(out), reading.audit, tuple(Path(p) for p in data),
                           format=format)


def _is_eval(run_dir: PathLike) -> bool:
    return run_kind(Path(run_dir)) == EVAL


def report(run_dir: PathLike):
    """Write a new report entry; return (its directory, the dataset verdict it states). An eval
    run directory gets an eval report (`eval_report`), and (its directory, None)."""
    existing_dir(run_dir, "RUN_DIR")
    if _is_eval(run_dir):
        return eval_report(run_dir), None
    return _reading().write_report(Path(run_dir))


def audit(run_dir: PathLike, *, signature: PathLike | None = None, identity: str = "validate",
          data: Sequence[PathLike] = (), manifests: PathLike | None = None):
    """Re-derive a run directory's verdicts and counts; return the `AuditResult`."""
    existing_dir(run_dir, "RUN_DIR")  # an audit of nothing is a typo, not a failed audit
    if signature is not None:
        existing_file(signature, "--signature")
    if _is_eval(run_dir):
        if signature is not None:
            raise ValidateError("--signature: sign and verify the eval run's checksums with `validate "
                                "sign`/`audit` of its pool; an eval run's own signature is not supported yet")
        return eval_audit(run_dir, data=data, manifests=manifests)
    return _reading().audit(Path(run_dir), signature=None if signature is None else Path(signature),
                            identity=identity, data=tuple(Path(p) for p in data),
                            manifests=None if manifests is None else Path(manifests))


def sign(run_dir: PathLike, key: PathLike) -> Path:
    return sign_run(Path(run_dir), Path(key))


def load_run(run_dir: PathLike):
    """A run's evidence: ``.summary`` (`RunSummary`), ``.manifest`` and the dataframes
    ``.attempts``, ``.tasks``, ``.exclusions``."""
    return run_evidence.load_run(Path(run_dir))


# --- model evaluation (protocol part 2) ----------------------------------------------------

def eval_freeze(name: str, *, pool_run: PathLike, model: str, model_revision: str, base_url: str,
                server: str = "openai-compatible", api_key_env: str | None = None,
                manifest: PathLike | None = None, system_template: str | None = None,
                user_template: str | None = None, sampling: dict[str, Any] | None = None,
                limits: dict[str, Any] | None = None, k: int = 8, data: Sequence[PathLike] = (),
                allow_patch: bool = False, out: PathLike | None = None):
    """Freeze an eval contract on a pool run's frozen set (refused unless its dataset verdict is
    PASS and its audit passes); write it (default ``manifests/<name>.json``) and return it."""
    spec = model_spec(id=model, revision=model_revision, server=server, base_url=base_url,
                      api_key_env=api_key_env)
    path = output_file(out if out is not None else MANIFEST_DIR / f"{name}.json", "--out")
    code = require(allow_patch)
    data = tuple(Path(p) for p in data)
    audit_run = _reading().audit
    # eval/ sits below the audit: the pool run's audit is handed down, run after the cheaper refusals.
    parent, frozen = parent_of(Path(pool_run), None if manifest is None else Path(manifest),
                               audit=lambda root: audit_run(root, data=data).problems)
    env = environments.get(frozen.environment.name)
    contract = ec.build(
        name=name, parent=parent, manifest=frozen, model=spec,
        reward_code=ec.reward_code_sha256(env.source_files()),
        system_template=system_template, agent=model_kind_class(env.attempt_kind).agent,
        user_template=ec.DEFAULT_USER if user_template is None else user_template,
        sampling=model_values(ec.Sampling, {}, dict(sampling or {}), "sampling"),
        limits=model_values(ec.AgentLimits, {}, dict(limits or {}), "limits"), k=k,
        git_commit=code.label, patch=code.patch)
    atomic_write(path, contract.to_json())
    return contract


def eval_run(contract: PathLike | None = None, *, manifest: PathLike | None = None,
             passes: Sequence[str] = ("greedy",
             "sampled"), progress: Progress | None = None, run_dir: PathLike | None = None,
             resume: PathLike | None = None, concurrency: int = DEFAULT_CONCURRENCY,
             data: Sequence[PathLike] = (), allow_patch: bool = False, executor: str = DEFAULT_EXECUTOR):
    """Evaluate the contract's model on its frozen set: the greedy pass (pass@1) and the sampled
    pass (k samples); return the `EvalSummary`. Resumes with `resume`."""
    if EXECUTORS.load(executor).remote:
        raise ExecutorUnavailable(f"--executor {executor}: `validate eval` plays the model's conversations "
                                  "with this process's live context (the endpoint's client, the eval "
                                  "contract), which is not shipped to other machines; run it with "
                                  f"--executor {DEFAULT_EXECUTOR}")
    cfg = _phase_config(EvalPhase, passes=tuple(passes))
    if resume is not None:
        root = Path(resume)
        if not (root / EVAL_CONTRACT).is_file():
            raise ValidateError(f"--resume: {root} is not an eval run directory (no {EVAL_CONTRACT})")
        c = ec.load(contract or root / EVAL_CONTRACT)
        manifest = manifest or root / MANIFEST
    else:
        if contract is None:
            raise ValidateError("--contract: required (or --resume RUN_DIR to continue an eval)")
        c = ec.load(contract)
        root = (Path(run_dir) if run_dir
                else LEDGER_DIR / f"{c.name}-{EVAL}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
        if (root / MANIFEST).exists():
            raise ValidateError(f"--run-dir: {root} already holds a run; use --resume {root} to continue it")
        run_directory(root, "--run-dir")
    m_path = Path(manifest) if manifest is not None else Path(c.parent.manifest_path)
    dataset_manifest(c.parent, m_path)  # refuses any other task set
    key = None
    if c.model.api_key_env is not None:
        key = os.environ.get(c.model.api_key_env)
        if not key:
            raise ValidateError(f"model.api_key_env: the environment variable {c.model.api_key_env} is not "
                                "set; export the endpoint's API key in it")
    # A wrong key, model id or base URL ends the command here, before the run directory exists:
    # found per attempt instead, it would be written as every sample's infrastructure error.
    preflight(c.model.base_url, c.model.id, key, c.model.api_key_env, c.limits.request_timeout_s,
              c.limits.retry_max_wait_s)
    ctx = context(m_path, kind=EVAL, run_dir=root if resume is None else None, resume=resume,
                  concurrency=concurrency, data=data, allow_patch=allow_patch, executor=executor,
                  progress=progress)
    lim = c.limits
    client = ChatClient(c.model.base_url, key, lim.request_timeout_s, lim.endpoint_retries,
                        lim.retry_max_wait_s)
    try:
        return _phase(ctx, lambda x: evaluate(x, c, client, cfg))
    finally:
        client.close()


def eval_report(run_dir: PathLike) -> Path:
    """Write a new eval report entry (report.md, report.html, report.json); return its directory."""
    return _reading().write_eval_report(existing_dir(run_dir, "RUN_DIR"))


def eval_audit(run_dir: PathLike, *, data: Sequence[PathLike] = (), manifests: PathLike | None = None):
    """Re-derive an eval run's replies, rewards, sample rows, classes, metrics and reports;
    return the `AuditResult`."""
    return _reading().audit_eval(existing_dir(run_dir, "RUN_DIR"), data=tuple(Path(p) for p in data),
                      manifests=None if manifests is None else Path(manifests))


def compare(run_a: PathLike, run_b: PathLike, *, out: PathLike | None = None):
    """Per-task and per-family deltas of two evals under the same dataset contract; refused
    (naming the field) when their dataset contract, reward or k differ. Returns the comparison
    and the directory it was written to."""
    if out is not None:  # RUN_A and RUN_B are checked by the comparison, naming what an eval run holds
        output_dir(out, "--out")
    return _reading().compare(Path(run_a), Path(run_b), None if out is None else Path(out))
