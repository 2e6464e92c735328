"""The ``validate`` command: one subcommand per protocol phase. No logic lives here.

Exit codes: 0 the phase passed; 1 it ran but the contract is not met (e.g. fewer
compatible tasks than the minimum); 2 bad input or an environment that cannot run it (the
message names the field or file); 130 interrupted (resume with ``--resume``); 3 an internal
error (a bug: rerun with VALIDATE_DEBUG=1 and report it).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from validate import __version__
from validate.errors import ValidateError
from validate.paths import DEFAULT_CORPUS, DEFAULT_IMAGE, LEDGER_DIR, MANIFEST_DIR

err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True, highlight=False)

EPILOG = """\
phases (the validation protocol, in order):
  image build   build the sandbox image offline from Debian packages (once per machine)
  freeze        write a contract manifest: corpus revision, tasks and their hashes,
                expected rewards, execution profile, minimum task count
  verify        check a manifest against this machine (corpus, task hashes, image, backend)
  pilot         a stratified sample (source × paper count × length × include_headers):
                oracle, every control, and partial-credit probes that must land strictly
                between the controls and the oracle
  pool          one oracle attempt on every task; freeze the exception-free passes as
                manifests/<name>.frozen.json if they reach the minimum; controls on that set
  run           play chosen agents on a manifest's tasks (one phase), write the evidence
  smoke         build the wheel, install it in a fresh virtualenv elsewhere, rerun a sample
                of the frozen set; passes iff every result equals the frozen run's
  report        the audit report (Markdown + self-contained HTML) of a run directory
  audit         recheck a run directory: checksums, Parquet, manifest hash chain, counts

Every phase writes Parquet evidence under ledgers/<run-id>/ and resumes with --resume.

example:
  validate image build
  validate freeze --name pool --max-papers 3 --idx-stop 1000 --min-count 950
  validate pilot --manifest manifests/pool.json
  validate pool --manifest manifests/pool.json -c 2
  validate smoke --manifest manifests/pool.frozen.json --run-dir ledgers/<pool-run>
  validate report ledgers/<pool-run> && validate audit ledgers/<pool-run>
"""


def _csv_ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="validate", description="Validate an RL environment's rewards before "
                                "training: the oracle must pass, negative controls must not, every exclusion "
                                "has a reason.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="PHASE")

    img = sub.add_parser("image", help="build the sandbox image offline")
    img_sub = img.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    b = img_sub.add_parser("build", help="mmdebstrap a Debian rootfs with python3; import it into docker, unpack it for bwrap")
    b.add_argument("--image", default=DEFAULT_IMAGE, help="image name (default: %(default)s)")
    b.add_argument("--backends", default="docker,bwrap", help="which backends to prepare (default: %(default)s)")

    f = sub.add_parser("freeze", help="write a contract manifest", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    f.add_argument("--name", required=True, help="manifest name; written to manifests/<name>.json")
    src = f.add_mutually_exclusive_group()
    src.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="local corpus snapshot (.jsonl, .jsonl.gz, .parquet)")
    src.add_argument("--hub", action="store_true", help="use the pinned Hugging Face corpus instead (needs the network)")
    f.add_argument("--min-papers", type=int, default=1, help="fewest papers per task")
    f.add_argument("--max-papers", type=int, default=1, help="most papers per task")
    f.add_argument("--seed", type=int, default=0, help="task-generation seed")
    f.add_argument("--source", default=None, help="only papers of this source (e.g. arxiv, biorxiv, plos)")
    f.add_argument("--include-headers", action="store_true", help="section headings are orderable units")
    sel = f.add_mutually_exclusive_group()
    sel.add_argument("--idx-stop", type=int, default=20, help="tasks idx-start .. idx-stop-1")
    sel.add_argument("--idx", type=_csv_ints, help="explicit task indices, comma-separated")
    f.add_argument("--idx-start", type=int, default=0, help="first task index of the range")
    f.add_argument("--backend", default="docker", choices=["docker", "bwrap", "subprocess"], help="execution backend")
    f.add_argument("--image", default=DEFAULT_IMAGE, help="sandbox image")
    f.add_argument("--memory-mb", type=int, default=512)
    f.add_argument("--cpus", type=float, default=1.0)
    f.add_argument("--pids", type=int, default=64)
    f.add_argument("--timeout-s", type=float, default=60.0)
    f.add_argument("--controls", default="controls", help="negative controls to run ('controls' = all of them)")
    f.add_argument("--oracle-min-reward", type=float, default=1.0, help="the oracle passes at or above this reward")
    f.add_argument("--min-count", type=int, default=None, help="minimum compatible tasks (default: every task)")
    f.add_argument("--out", type=Path, default=None, help="manifest path (default: manifests/<name>.json)")

    v = sub.add_parser("verify", help="check a manifest against this machine")
    v.add_argument("--manifest", type=Path, required=True)

    r = sub.add_parser("run", help="play the oracle and controls; write the evidence")
    _run_options(r)
    r.add_argument("--agents", default=None, help="comma-separated agents, or all / controls / probes "
                   "(default: the oracle and the manifest's controls)")
    r.add_argument("--phase", default="controls", help="phase label of the attempts (default: %(default)s)")

    pi = sub.add_parser("pilot", help="a stratified sample, both header variants, controls and partial-credit probes")
    _run_options(pi)
    pi.add_argument("--per-stratum", type=int, default=1, help="tasks sampled per stratum (default: %(default)s)")

    po = sub.add_parser("pool", help="oracle on every task → freeze the passes → controls on the frozen set")
    _run_options(po)
    po.add_argument("--manifest-dir", type=Path, default=MANIFEST_DIR,
                    help="where the frozen child manifest is written (default: %(default)s)")

    sm = sub.add_parser("smoke", help="build the wheel, install it in a fresh venv, rerun a sample, compare")
    sm.add_argument("--manifest", type=Path, required=True, help="the frozen manifest (manifests/<name>.frozen.json)")
    sm.add_argument("--run-dir", type=Path, required=True, help="the run whose results the rerun must equal; "
                    "the smoke evidence is added to it (smoke/)")
    sm.add_argument("--sample", type=int, default=5, help="tasks rerun, evenly spaced (default: %(default)s)")

    rp = sub.add_parser("report", help="write report.md and a self-contained report.html for reviewers")
    rp.add_argument("run_dir", type=Path, metavar="RUN_DIR")

    au = sub.add_parser("audit", help="recheck a run directory: checksums, Parquet, hash chain, report counts")
    au.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    return p


#: Attempts at once unless -c says otherwise: two per usable core. An attempt waits on
#: process start-up, the daemon and namespace teardown about as much as it computes; on
#: 2 cores, -c 4 beat -c 2 on both backends (docs/performance.md).
DEFAULT_CONCURRENCY = 2 * len(os.sched_getaffinity(0))


def _run_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--manifest", type=Path, required=True, help="a contract manifest (manifests/<name>.json)")
    sp.add_argument("-c", "--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                    help="attempts at once (default: 2 per CPU core, here %(default)s)")
    where = sp.add_mutually_exclusive_group()
    where.add_argument("--run-dir", type=Path, default=None, help="new run directory (default: ledgers/<run-id>)")
    where.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                       help="continue a run: rerun only missing and infrastructure-failed attempts")


def cmd_image(args) -> int:
    from validate.image import build

    build(args.image, [b.strip() for b in args.backends.split(",") if b.strip()], log=lambda m: err.print(m))
    return 0


def cmd_freeze(args) -> int:
    from environment.deshuffle import DeshuffleConfig
    from validate.contract import CorpusSpec, EnvironmentSpec, freeze, hub_spec, load_corpus, write_manifest
    from validate.sandbox import Limits, open_sandbox

    from pydantic import ValidationError

    try:
        config = DeshuffleConfig(min_papers=args.min_papers, max_papers=args.max_papers, seed=args.seed,
                                 source=args.source, include_headers=args.include_headers)
        limits = Limits(memory_mb=args.memory_mb, cpus=args.cpus, pids=args.pids, timeout_s=args.timeout_s)
    except ValidationError as e:
        first = e.errors()[0]
        raise ValidateError(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}") from None
    corpus = load_corpus(hub=args.hub, path=args.corpus)
    spec = hub_spec() if args.hub else CorpusSpec(kind="local", location=args.corpus, revision=corpus.revision)
    if args.idx is not None:
        idx, rule = args.idx, f"explicit idx list of {len(args.idx)} tasks"
    else:
        if args.idx_stop <= args.idx_start or args.idx_start < 0:
            raise ValidateError(f"--idx-stop: must be greater than --idx-start ({args.idx_start}) and ≥ 0")
        idx, rule = list(range(args.idx_start, args.idx_stop)), f"contiguous idx range [{args.idx_start}, {args.idx_stop})"
    from validate.agents import resolve

    controls = [a.name for a in resolve(args.controls) if a.name != "oracle"]
    sandbox = open_sandbox(args.backend, image=args.image)
    manifest = freeze(name=args.name, env=EnvironmentSpec(config=config, corpus=spec), idx=idx, rule=rule,
                      facts=sandbox.facts(), corpus=corpus, control_max_reward=dict.fromkeys(controls),
                      oracle_min_reward=args.oracle_min_reward, limits=limits,
                      min_task_count=len(set(idx)) if args.min_count is None else args.min_count)
    path = write_manifest(manifest, args.out or MANIFEST_DIR / f"{args.name}.json")
    out.print(f"froze {len(manifest.tasks)} tasks → {path}  ({manifest.sha256})")
    return 0


def cmd_verify(args) -> int:
    from validate.contract import load_manifest, verify
    from validate.sandbox import open_sandbox

    m = load_manifest(args.manifest)
    verify(m, open_sandbox(m.execution.backend, image=m.execution.image))
    out.print(f"{args.manifest}: OK — corpus, {len(m.tasks)} task hashes, backend {m.execution.backend}, "
              f"image {m.execution.image_digest[:19]}…, {m.execution.architecture}")
    return 0


def _context(args, phase: str):
    """Load and verify the manifest, open the backend, pick the run directory."""
    from validate.contract import load_manifest, verify
    from validate.paths import RunPaths
    from validate.runner import RunContext
    from validate.sandbox import open_sandbox

    m = load_manifest(args.manifest)
    if args.concurrency < 1:
        raise ValidateError("--concurrency: must be ≥ 1")
    if args.resume is not None:
        if not (args.resume / "manifest.json").exists():
            raise ValidateError(f"--resume: {args.resume} is not a run directory (no manifest.json)")
        root = args.resume
    else:
        root = args.run_dir or LEDGER_DIR / f"{m.name}-{phase}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
        if (root / "manifest.json").exists():
            raise ValidateError(f"--run-dir: {root} already holds a run; use --resume {root} to continue it")
    run_id = root.name  # the same before and after a resume
    sandbox = open_sandbox(m.execution.backend, image=m.execution.image, run_label=run_id)
    taskset = verify(m, sandbox)
    return RunContext(manifest=m, sandbox=sandbox, taskset=taskset, paths=RunPaths(root), run_id=run_id,
                      phase=phase, image_digest=m.execution.image_digest)


class _Bar:
    """A progress bar over every attempt a phase plans (phases may plan several times)."""

    def __enter__(self):
        columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn()]
        self.progress = Progress(*columns, console=err, transient=False)
        self.progress.__enter__()
        self.bar = self.progress.add_task("attempts", total=0)
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.wall_s = time.monotonic() - self.t0
        return self.progress.__exit__(*exc)

    @property
    def hooks(self) -> dict:
        def plan(n: int) -> None:
            self.progress.update(self.bar, total=self.progress.tasks[0].total + n)

        return {"on_attempt": lambda a: self.progress.advance(self.bar), "on_plan": plan}


def _report_verdicts(run_id: str, root, verdicts, wall_s: float, n_attempts: int) -> None:
    reasons = Counter(v.reason for v in verdicts if not v.compatible)
    compatible = sum(v.compatible for v in verdicts)
    out.print(f"run {run_id}: {compatible}/{len(verdicts)} tasks compatible; "
              f"{n_attempts} attempts in {wall_s:.1f} s; evidence in {root}")
    for reason, n in sorted(reasons.items()):
        out.print(f"  excluded, {reason}: {n}/{len(verdicts)}")


def cmd_run(args) -> int:
    from validate.agents import resolve
    from validate.runner import run

    ctx = _context(args, args.phase)
    agents = resolve(args.agents or ctx.manifest.expectations.agents())
    with _Bar() as bar:
        try:
            written, verdicts = run(ctx, agents, args.concurrency, **bar.hooks)
        finally:
            ctx.sandbox.close()
    _report_verdicts(ctx.run_id, ctx.paths.root, verdicts, bar.wall_s, written["attempts"])
    compatible = sum(v.compatible for v in verdicts)
    if compatible < ctx.manifest.min_task_count:
        err.print(f"contract not met: {compatible} compatible tasks < min_task_count {ctx.manifest.min_task_count}",
                  style="red")
        return 1
    return 0


def cmd_pool(args) -> int:
    from validate.phases import pool

    ctx = _context(args, "pool")
    with _Bar() as bar:
        try:
            result = pool(ctx, args.concurrency, bar.hooks, manifest_dir=args.manifest_dir)
        finally:
            ctx.sandbox.close()
    out.print(f"pool {ctx.run_id}: oracle passed {result.oracle_passes}/{result.tasks} tasks "
              f"(minimum {ctx.manifest.min_task_count}); wall {bar.wall_s:.1f} s; evidence in {result.run_dir}")
    if result.below_minimum:
        err.print(f"stopped: {result.oracle_passes} exception-free oracle passes < min_task_count "
                  f"{ctx.manifest.min_task_count}; nothing frozen, no control run", style="red")
        return 1
    out.print(f"froze {result.oracle_passes} tasks → {result.frozen_manifest}; "
              f"compatible {result.compatible}/{result.tasks}")
    return 0 if result.compatible >= ctx.manifest.min_task_count else 1


def cmd_pilot(args) -> int:
    from validate.phases import pilot

    ctx = _context(args, "pilot")
    with _Bar() as bar:
        try:
            result = pilot(ctx, args.per_stratum, args.concurrency, bar.hooks)
        finally:
            ctx.sandbox.close()
    out.print(f"pilot {ctx.run_id}: {sum(len(s.sampled) for s in result.strata)} tasks sampled from "
              f"{len(result.strata)} strata × {len(result.variants)} header variants; "
              f"{result.compatible}/{result.tasks} compatible; wall {bar.wall_s:.1f} s; evidence in {result.run_dir}")
    for s in result.strata:
        out.print(f"  {s.name:45s} sampled {len(s.sampled)}/{s.pool_tasks}")
    bad = [p for p in result.probes if not p.ok]
    out.print(f"partial-credit probes: {len(result.probes) - len(bad)}/{len(result.probes)} strictly between "
              f"the controls' median and the oracle")
    for p in bad:
        err.print(f"  PROBE FAILED {p.variant} {p.task_id} {p.probe}: reward {p.reward} not in "
                  f"({p.control_typical:.4f}, {p.oracle_reward})", style="red")
    return 0 if result.probes_ok else 1


def cmd_smoke(args) -> int:
    from validate.contract import load_corpus, load_manifest
    from validate.smoke import smoke

    m = load_manifest(args.manifest)
    recorded = [p for p in (args.run_dir / "frozen-manifest.json", args.run_dir / "manifest.json") if p.exists()]
    if not recorded:
        raise ValidateError(f"--run-dir: {args.run_dir} is not a run directory (no manifest.json)")
    if m.sha256 not in {load_manifest(p).sha256 for p in recorded}:
        raise ValidateError(f"--manifest: {args.manifest} is not the manifest {args.run_dir} ran")
    if args.sample < 1:
        raise ValidateError("--sample: must be ≥ 1")
    corpus_path = Path(load_corpus(m.environment.corpus).location)
    result = smoke(m, args.run_dir, corpus_path, args.sample, log=lambda msg: err.print(msg))
    (out if result.passed else err).print(("smoke PASSED: " if result.passed else "smoke FAILED: ") + result.summary)
    for line in result.mismatches[:20]:
        err.print(f"  {line}", style="red", markup=False)
    return 0 if result.passed else 1


def cmd_report(args) -> int:
    from validate.report import write_report

    if not (args.run_dir / "attempts.parquet").exists():
        raise ValidateError(f"RUN_DIR: {args.run_dir} holds no finished run (no attempts.parquet)")
    c = write_report(args.run_dir)
    out.print(f"wrote {args.run_dir / 'report.md'} and {args.run_dir / 'report.html'}: "
              f"{c['compatible']}/{c['tasks']} compatible, {c['excluded']}/{c['tasks']} excluded")
    return 0


def cmd_audit(args) -> int:
    from validate.audit import audit

    problems = audit(args.run_dir)
    if problems:
        for p in problems:
            out.print(f"FAIL {p}", markup=False)
        err.print(f"audit failed: {len(problems)} problem(s) in {args.run_dir}", style="red")
        return 1
    out.print(f"audit passed: {args.run_dir} (checksums, Parquet, manifest hash chain, report counts)")
    return 0


COMMANDS = {"image": cmd_image, "freeze": cmd_freeze, "verify": cmd_verify, "run": cmd_run,
            "pool": cmd_pool, "pilot": cmd_pilot, "smoke": cmd_smoke, "report": cmd_report, "audit": cmd_audit}


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt  # a stop from a job scheduler is handled like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by a shell
        signal.signal(signal.SIGINT, signal.default_int_handler)
    from validate.runner import Interrupted

    try:
        return COMMANDS[args.command](args)
    except Interrupted as e:
        err.print(str(e), style="yellow", markup=False)
        return 130
    except ValidateError as e:
        err.print(f"error: {e}", style="red", markup=False, highlight=False)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted", style="yellow")
        return 130
    except Exception as e:  # noqa: BLE001 - a bug must still end in a message, not a traceback
        if os.environ.get("VALIDATE_DEBUG"):
            raise
        err.print(f"internal error: {type(e).__name__}: {e} (rerun with VALIDATE_DEBUG=1 for the traceback, "
                  f"and please report it)", style="red", markup=False, highlight=False)
        return 3


if __name__ == "__main__":
    sys.exit(main())
