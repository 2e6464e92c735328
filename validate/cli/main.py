"""The ``validate`` command: one subcommand per protocol phase. No logic lives here.

Exit codes: 0 the phase passed (for run, pilot and pool: the dataset verdict is PASS); 1 it
ran but the verdict is FAIL or INCOMPLETE; 2 bad input or an environment that cannot run it
(the message names the field or file); 130 interrupted (resume with ``--resume``); 3 an
internal error (a bug: rerun with VALIDATE_DEBUG=1 and report it).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# What the parser needs loads with the command line; the harness itself (`validate.api`:
# pandas, the phases, the audit) loads only inside the command that runs it, so that
# `validate --help` and a refused argument answer at once.
from validate import __version__
from validate.cli.options import DEFAULT_CONCURRENCY, add_model_options, given
from validate.core import environments
from validate.core.errors import ValidateError
from validate.core.paths import (
    CHECKSUMS,
    DEFAULT_IMAGE,
    LEDGER_DIR,
    MANIFEST_DIR,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
)
from validate.eval.contract import AgentLimits, Sampling
from validate.evidence.patches import code_state
from validate.run.context import Interrupted, Progress as PhaseProgress
from validate.run.executors import DEFAULT_EXECUTOR, executor_names
from validate.sandbox import Limits, backend_names, imagefile
from validate.sandbox.image import build

err = Console(stderr=True, soft_wrap=True, highlight=False)
out = Console(soft_wrap=True, highlight=False)

EPILOG = """\
phases (the validation protocol, in order):
  image build   build the sandbox image offline from Debian packages (once per machine)
  image export  write it as one file named by its digest; `image import` restores it elsewhere
  freeze        write a contract manifest: environment, config and content revision, tasks
                and their hashes, expected rewards, execution profile, minimum task count
  verify        check a manifest against this machine (data, task hashes, agents, images)
  pilot         a stratified sample under each config variant: oracle, every control, and
                partial-credit probes that must land strictly between controls and oracle
  pool          one oracle attempt on every task; freeze the exception-free passes if they
                reach the minimum; every control on that set; then the smoke test
  run           play chosen agents on a manifest's tasks (one phase), write the evidence
  smoke         build the wheel, install it in a fresh virtualenv elsewhere, rerun a sample
                of a pool's frozen set; passes iff every result equals the frozen run's
  report        the report (Markdown + self-contained HTML) of a run directory
  audit         re-derive a run directory's verdicts and counts from its evidence
  sign          sign a run directory's checksums with an OpenSSH key
  eval          evaluate a model on a validated dataset: freeze, run, report, audit
  compare       per-task and per-family deltas of two evals of the same dataset contract
  compare-profiles
                every task whose verdict differs between two runs of one contract on two
                execution profiles (make the second with `freeze --like`)

Every phase writes Parquet evidence under ledgers/<run-id>/ and resumes with --resume.

example:
  validate freeze --name pool --max-papers 3 --idx-stop 1000 --min-count 950
  validate pilot --manifest manifests/pool.json
  validate pool --manifest manifests/pool.json
  validate report ledgers/<pool-run> && validate audit ledgers/<pool-run>
"""


def _version() -> str:
    here = Path(__file__).resolve().parents[1]
    return f"validate {__version__} (code {code_state().label}; installed at {here})"


def _env_name(argv: list[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env")
    return pre.parse_known_args(argv)[0].env


IMAGE_EXPORT_HELP = """\
Write the image store's root filesystem tarball, byte for byte, as one file named after its
own sha256: sha256-<hex>.tar. That digest is what every contract frozen with the image
records (execution.image_digest; docker's layer diff_id), so `sha256sum` checks the file
anywhere. Copy it to a machine whose Debian archive has moved on (where `validate image
build` gives other bytes and `validate verify` names the packages that differ) and run
`validate image import` there.

example:
  validate image export --out exported/
  sha256sum exported/sha256-*.tar     # the hex is the contract's execution.image_digest
"""

IMAGE_IMPORT_HELP = """\
Restore an exported image file into the image store ($VALIDATE_IMAGE_DIR, by default
/var/lib/deshuffle-validate/images): the tarball, its record recomputed from the bytes, the
tree bwrap runs; and, when a docker daemon answers (DOCKER_HOST), into docker as one layer
whose diff_id is checked to be the digest. The file is refused (exit 2, nothing changed) if
its sha256 is not the digest its name (or --digest) gives, if it is truncated or not a tar
archive, if a member would land outside the image's root, or if it is no sandbox image.

example (re-verify a committed contract on a fresh machine):
  validate image import sha256-<hex>.tar --replace
  validate verify --manifest manifests/twohop.json
"""


def _image_file_parsers(img_sub) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    e = img_sub.add_parser("export", help="write the image as one content-addressed file, sha256-<hex>.tar",
                           description=IMAGE_EXPORT_HELP, formatter_class=raw)
    e.add_argument("--image", default=DEFAULT_IMAGE, help="image name in the store (default: %(default)s)")
    e.add_argument("--out", type=Path, required=True, metavar="DIR_OR_FILE",
                   help="a directory (created if missing) or a file path named sha256-<hex>.tar")
    e.add_argument("--manifest", type=Path, default=None, metavar="M",
                   help="instead, the task images contract M froze (each held here under its frozen key), as "
                        "one docker save archive task-images-<contract>.tar; a reviewer imports it with "
                        "`validate image import FILE --manifest M` and reruns exactly")
    i = img_sub.add_parser("import", help="restore an exported image file (digest checked) into the "
                                          "store and docker",
                           description=IMAGE_IMPORT_HELP, formatter_class=raw)
    i.add_argument("file", type=Path, metavar="FILE", help="an exported sha256-<hex>.tar")
    i.add_argument("--image", default=DEFAULT_IMAGE, help="name to restore it under: the contract's "
                                                          "execution.image (default: %(default)s)")
    i.add_argument("--digest", metavar="sha256:HEX", help="the digest FILE must have, when its name gives "
                                                          "none (or to hold it to a contract's "
                                                          "execution.image_digest)")
    i.add_argument("--backends", help="which backends to prepare, comma-separated (default: bwrap, and "
                                      "docker when a daemon answers)")
    i.add_argument("--replace", action="store_true", help="replace an image of that name with another digest "
                                                          "(refused without it)")
    i.add_argument("--manifest", type=Path, default=None, metavar="M",
                   help="FILE is the task-image archive `validate image export --manifest M` wrote: loaded "
                        "only if it holds nothing but M's frozen images (no names), then each held to its "
                        "frozen key, layers and content digest")


def _freeze_parser(sub, env_name: str | None) -> None:
    f = sub.add_parser("freeze", help="write a contract manifest",
                       description="Freeze a contract: generate the selected tasks of an environment and "
                                   "record their hashes, the expectations and the execution profile. A "
                                   "task-directory dataset (--env harbor) on docker also builds every task's "
                                   "image (or takes it from the cache) and freezes the base-image map, the "
                                   "build policy and each task's image id or build refusal; the build logs "
                                   "go to <name>.build-logs/.")
    f.add_argument("--name", required=True, help="manifest name; written to manifests/<name>.json")
    f.add_argument("--env", default=None,
                   help=f"environment (installed: {', '.join(environments.names()) or 'none'}; default: "
                        f"{environments.default_name()})")
    f.add_argument("--like", type=Path, default=None, metavar="MANIFEST",
                   help="freeze MANIFEST's dataset contract (its tasks, expectations and salt) on the "
                        "execution profile given here, for `validate compare-profiles`; the dataset and "
                        "expectation options are then refused, limits default to MANIFEST's")
    f.add_argument("--config", type=Path,
                   help="the environment's config as a TOML file (options below override it)")
    f.add_argument("--data", type=Path, action="append", default=[], metavar="PATH",
                   help="where to look for the environment's data (repeatable)")
    sel = f.add_argument_group("selection")
    sel.add_argument("--idx", help="explicit task indices, comma-separated")
    sel.add_argument("--idx-start", type=int, default=None, help="first task index of the range (default: 0)")
    sel.add_argument("--idx-stop", type=int, help="one past the last index (default: every task of a finite "
                                                 "taskset, 20 of an infinite one)")
    exp = f.add_argument_group("expectations")
    exp.add_argument("--controls", default=None, help="negative controls a task must reject, comma-separated "
                                                      "(default: every control the environment declares)")
    exp.add_argument("--ceiling", action="append", default=[], metavar="CONTROL=REWARD",
                     help="a control's own ceiling: its reward must stay under REWARD (repeatable)")
    exp.add_argument("--pass-threshold", type=float, default=None,
                     help="the oracle passes at or above this reward (default: the environment's)")
    exp.add_argument("--exception-rule", choices=["strict", "retry"], default=None,
                     help="strict: any infrastructure exception excludes the task; retry: a passing retry "
                          "counts, and the claim says how many tasks needed one (default: strict)")
    exp.add_argument("--min-count", type=int, default=None,
                     help="minimum compatible tasks (default: every task)")
    exp.add_argument("--oracle-repeats", default=None, metavar="N",
                     help="play the oracle N times per task; every repeat must pass, a mix (e.g. 2 of 3) is "
                          "a flaky verifier: invalid_task_or_verifier (default: 1)")
    ex = f.add_argument_group("execution profile")
    ex.add_argument("--backend", default="docker", choices=backend_names(),
                    help="sandbox backend, one of the installed (`validate.backends`; default: docker)")
    ex.add_argument("--image", default=DEFAULT_IMAGE, help=f"sandbox image (default: {DEFAULT_IMAGE})")
    ex.add_argument("--infra-retries", type=int, default=None, help="further tries after an infrastructure "
                                                                    "fault (default: 2, or --like's)")
    ex.add_argument("--verifier-mode", choices=["trusted", "shared"], default=None,
                    help="task directories: where each task's verifier runs — trusted: a fresh container of "
                         "the task's image with only the agent's changes under the task's work paths, so a "
                         "task is certified only when no tampering control passes it; shared: the agent's "
                         "own container, as Harbor does (the claim then says: not hack-resistant) (default: "
                         "trusted, or --like's)")
    ex.add_argument("--build-trust-store", default="off", choices=["off", "host"],
                    help="the CA bundle task image builds trust (task-directory datasets): host, this "
                         "machine's (behind a TLS-intercepting proxy a build's pip install fails without "
                         "it); its sha256 is recorded in the build policy, the bundle is named by build "
                         "arguments only, never in the image's environment (default: %(default)s)")
    ex.add_argument("--registry", default=None, metavar="HOST[:PORT][/PATH]",
                    help="a registry or mirror the build host may pull from: every FROM and docker_image is "
                         "pulled through it by reference (library/<name> for Docker Hub's, <host>/<path> for "
                         "another registry's) and frozen by digest; later runs and verify pull that digest, "
                         "never the tag (default: none: the offline base-image map)")
    ex.add_argument("--image-budget-gb", type=float, default=None, metavar="GIB",
                    help="keep the daemon's task images under this many GiB: after each build, task images "
                         "this contract does not route to are pruned, oldest first, each removal logged "
                         "(default: no budget)")
    ex.add_argument("--build-clock", default="fixed", choices=["fixed", "real"],
                    help="fixed: task image builds get one clock (SOURCE_DATE_EPOCH, git's author and "
                         "committer dates) as build arguments, so another machine's rebuild writes the same "
                         "files and is held to the frozen content digest; real: each build's own "
                         "(default: %(default)s)")
    add_model_options(ex, Limits, "lim_", skip=())
    f.add_argument("--allow-patch", action="store_true", help="freeze from a tree with uncommitted changes "
                                                             "(the diff is recorded in the manifest)")
    f.add_argument("--out", type=Path, default=None, help="manifest path (default: manifests/<name>.json)")
    f.add_argument("--json", action="store_true", help="print the manifest as JSON")
    if env_name in environments.names():
        env = environments.get(env_name)
        add_model_options(f.add_argument_group(f"{env_name} config"), env.Config, "cfg_")


def _executor_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--executor", default=DEFAULT_EXECUTOR, choices=executor_names(),
                    help="what carries the attempts out, one of the installed (`validate.executors`; "
                         "default: %(default)s, threads of this process); the evidence is the same "
                         "whichever runs them")
    sp.add_argument("--ray-address", default=None, metavar="ADDR",
                    help="with --executor ray: the Ray cluster to run on (e.g. HEAD_IP:6379; default: Ray's "
                         "own, RAY_ADDRESS, else the latest Ray started on this machine, else "
                         "a new local Ray)")


def _ray_address(args) -> None:
    """``--ray-address`` reaches Ray the way Ray documents it: as ``RAY_ADDRESS``."""
    address = getattr(args, "ray_address", None)
    if address is None:
        return
    if args.executor != "ray":
        raise ValidateError(f"--ray-address: only with --executor ray (this command runs on {args.executor})")
    os.environ["RAY_ADDRESS"] = address


def _run_options(sp: argparse.ArgumentParser, manifest_required: bool = False) -> None:
    sp.add_argument("--manifest", type=Path, required=manifest_required,
                    help="a contract manifest (manifests/<name>.json); with --resume, the "
                         "run's own by default")
    sp.add_argument("-c", "--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                    help="attempts at once (default: 2 per CPU core, here %(default)s)")
    _executor_option(sp)
    where = sp.add_mutually_exclusive_group()
    where.add_argument("--run-dir", type=Path, default=None,
                       help="new run directory (default: ledgers/<run-id>)")
    where.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                       help="continue a run: rerun only missing and infrastructure-failed attempts")
    sp.add_argument("--data", type=Path, action="append", default=[], metavar="PATH",
                    help="where to look for the environment's data (repeatable)")
    sp.add_argument("--allow-patch", action="store_true",
                    help="run code with uncommitted changes (the diff is stored and reported)")
    sp.add_argument("--json", action="store_true", help="print the run summary (run.json) as JSON")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="validate", description="Validate an RL environment's rewards before "
                                "training: the oracle must pass, negative controls must not, every exclusion "
                                "has a reason.", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True, metavar="PHASE")

    img = sub.add_parser("image", help="build the sandbox image offline; export it as one file, "
                                       "import that file")
    img_sub = img.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    b = img_sub.add_parser("build", help="mmdebstrap a Debian rootfs with python3; import it into docker, "
                                         "unpack it for bwrap")
    b.add_argument("--image", default=DEFAULT_IMAGE, help="image name (default: %(default)s)")
    b.add_argument("--backends", default="bwrap,docker",
                   help="which backends to prepare, in order (default: %(default)s)")
    _image_file_parsers(img_sub)

    _freeze_parser(sub, _env_name(argv or []) or _default_env())

    v = sub.add_parser("verify", help="check a manifest against this machine")
    v.add_argument("--manifest", type=Path, required=True)
    v.add_argument("--data", type=Path, action="append", default=[], metavar="PATH")

    r = sub.add_parser("run", help="play the oracle and controls (or chosen agents); write the evidence")
    _run_options(r)
    r.add_argument("--agents", default="all", help="comma-separated agents, or all (the oracle and the "
                                                  "contract's controls) / controls / probes (default: all)")
    r.add_argument("--phase", default="run", help="phase label of the attempts (default: %(default)s)")

    pi = sub.add_parser("pilot", help="a stratified sample under each config variant, with "
                                      "partial-credit probes")
    _run_options(pi)
    pi.add_argument("--per-stratum", type=int, default=1,
                    help="tasks sampled per stratum (default: %(default)s)")

    po = sub.add_parser("pool", help="oracle on every task → freeze the passes → controls on the "
                                     "frozen set → smoke")
    _run_options(po)
    po.add_argument("--manifest-dir", type=Path, default=None,
                    help="where the frozen child manifest is also written (default: beside --manifest)")
    po.add_argument("--smoke-sample", type=int, default=5, help="tasks the smoke test reruns; 0 skips it and "
                    "the dataset verdict stays INCOMPLETE until `validate smoke` (default: %(default)s)")

    sm = sub.add_parser("smoke", help="build the wheel, install it in a fresh venv, rerun a sample "
                                      "of a pool, compare")
    sm.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a pool's run directory")
    sm.add_argument("--sample", type=int, default=5, help="tasks rerun, evenly spaced (default: %(default)s)")
    sm.add_argument("--data", type=Path, action="append", default=[], metavar="PATH")
    sm.add_argument("--json", action="store_true",
                    help="print the smoke result (smoke/<time>/result.json) as JSON")

    pk = sub.add_parser("package", help="write a validated task-directory dataset's retained tasks as a "
                                        "Harbor dataset: byte-identical tasks, hash manifest, "
                                        "exclusions, dataset card",
                        description="Package a sealed run that passes its audit (protocol step 5): its "
                                    "compatible task directories byte for byte, package.json (every file's "
                                    "sha256), exclusions.json (the exclusion ledger) and README.md (the "
                                    "dataset card: N of M tasks retained, each reason's count, the execution "
                                    "profile). `validate smoke` of such a pool reruns its sample from a "
                                    "package in a fresh location.")
    pk.add_argument("run_dir", type=Path, metavar="RUN", help="a sealed pool or run directory of a "
                                                              "task-directory dataset")
    pk.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new (or empty) directory")
    pk.add_argument("--data", type=Path, action="append", default=[], metavar="PATH",
                    help="where to look for the dataset the run validated (repeatable)")
    pk.add_argument("--format", choices=["directories", "parquet"], default="directories",
                    help="directories: a Harbor dataset directory of task directories; parquet: the shape "
                         "datasets are published in, data/train-00000-of-00001.parquet with a row per task "
                         "(path, task_binary: the task directory as a tar.gz, task_id, instruction, the "
                         "row's own columns) (default: %(default)s)")

    rp = sub.add_parser("report", help="write a new report (Markdown and self-contained HTML) into "
                                       "RUN_DIR/reports/")
    rp.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    rp.add_argument("--json", action="store_true", help="print the report's record (report.json) as JSON")

    au = sub.add_parser("audit", help="re-derive a run's verdicts and counts from its evidence")
    au.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    au.add_argument("--signature", type=Path, metavar="ALLOWED_SIGNERS",
                    help="also verify checksums.sig against this OpenSSH allowed-signers file")
    au.add_argument("--identity", default="validate",
                    help="the signer identity to verify (default: %(default)s)")
    au.add_argument("--data", type=Path, action="append", default=[], metavar="PATH",
                    help="where the environment's data is (the audit re-scores every reply with it)")
    au.add_argument("--manifests", type=Path, metavar="DIR",
                    help="the committed contracts the run's manifest must equal (default: the "
                         "project's manifests/)")
    au.add_argument("--json", action="store_true",
                    help="print the audit's result (problems, checked, sealed_only)")

    sg = sub.add_parser("sign", help="sign RUN_DIR/checksums with an OpenSSH key (ssh-keygen -Y sign)")
    sg.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    sg.add_argument("--key", type=Path, required=True, help="the private key file")

    _eval_parser(sub)
    _compare_parser(sub)

    vw = sub.add_parser("view", help="browse runs in a web browser (a read-only page served on 127.0.0.1)",
                        description="Serve a local page listing the runs under DIR (a run directory, or a "
                                    "directory of them) with a page per run and per task; read-only, "
                                    "loopback only, until Ctrl-C.")
    vw.add_argument("dirs", type=Path, nargs="*", metavar="DIR", default=[LEDGER_DIR],
                    help=f"run directories or directories of them (default: {LEDGER_DIR}/)")
    vw.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: 0, any free port)")
    vw.add_argument("--log", action="store_true", help="print each request on stderr")
    return p


def _eval_parser(sub) -> None:
    ev = sub.add_parser("eval", help="evaluate a model on a validated dataset (protocol part 2)",
                        description="Evaluate a model on a pool's frozen set: freeze an eval contract (only "
                                    "on a dataset verdict PASS), run it (pass@1 at temperature 0, then k "
                                    "samples), report, audit.")
    acts = ev.add_subparsers(dest="eval_command", required=True, metavar="ACTION")
    f = acts.add_parser("freeze", help="write an eval contract on a pool run's frozen set")
    f.add_argument("--name", required=True, help="contract name; written to manifests/<name>.json")
    f.add_argument("--pool-run", type=Path, required=True, metavar="RUN_DIR",
                   help="the pool run whose frozen set is evaluated (its dataset verdict must be PASS)")
    f.add_argument("--manifest", type=Path, default=None, help="the frozen dataset manifest (must be the "
                                                              "pool run's; default: the run's "
                                                              "frozen-manifest.json)")
    f.add_argument("--model", required=True, help="the model name sent in requests")
    f.add_argument("--model-revision", required=True, help="the exact checkpoint (a commit, a sha256, a tag)")
    f.add_argument("--base-url", required=True, help="the endpoint, e.g. http://127.0.0.1:8000/v1")
    f.add_argument("--server", default="openai-compatible", help="what serves it: vllm, llama.cpp, openai, "
                                                                 "localserver (default: %(default)s)")
    f.add_argument("--api-key-env", default=None, metavar="VAR", help="name of the environment variable "
                                                                      "holding the API key (the key "
                                                                      "is never recorded)")
    f.add_argument("--system-template", type=Path, default=None, metavar="FILE",
                   help="system prompt template ($prompt, $meta_json); default: the harness's")
    f.add_argument("--user-template", type=Path, default=None, metavar="FILE", help="user prompt template "
                                                                                    "(default: $prompt)")
    f.add_argument("-k", type=int, default=8,
                   help="samples per task in the sampled pass (default: %(default)s)")
    f.add_argument("--data", type=Path, action="append", default=[], metavar="PATH")
    f.add_argument("--allow-patch", action="store_true", help="freeze from a tree with uncommitted changes")
    f.add_argument("--out", type=Path, default=None, help="contract path (default: manifests/<name>.json)")
    add_model_options(f.add_argument_group("sampling"), Sampling, "smp_", skip=())
    add_model_options(f.add_argument_group("agent limits"), AgentLimits, "alim_", skip=())
    r = acts.add_parser("run", help="run an eval contract: pass@1 (greedy) and k samples per task")
    r.add_argument("--contract", type=Path, default=None,
                   help="the eval contract (with --resume: the run's own)")
    r.add_argument("--manifest", type=Path, default=None, help="the frozen dataset manifest (default: the "
                                                              "path recorded in the contract)")
    r.add_argument("--passes", default="greedy,sampled", help="which passes (default: %(default)s)")
    r.add_argument("-c", "--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                   help="attempts at once (default: %(default)s)")
    _executor_option(r)
    where = r.add_mutually_exclusive_group()
    where.add_argument("--run-dir", type=Path, default=None,
                       help="new run directory (default: ledgers/<run-id>)")
    where.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                       help="continue an eval: rerun only missing and infrastructure-failed attempts")
    r.add_argument("--data", type=Path, action="append", default=[], metavar="PATH")
    r.add_argument("--allow-patch", action="store_true", help="run code with uncommitted changes (stored)")
    r.add_argument("--json", action="store_true", help="print eval.json")
    rp = acts.add_parser("report", help="write a new eval report into RUN_DIR/reports/")
    rp.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    au = acts.add_parser("audit", help="re-derive an eval run's classes, metrics and reports "
                                       "from its evidence")
    au.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    au.add_argument("--data", type=Path, action="append", default=[], metavar="PATH",
                    help="where the environment's data is (the audit re-scores every reply with it)")
    au.add_argument("--manifests", type=Path, metavar="DIR",
                    help="the committed contracts the run's must equal (default: the project's manifests/)")


def _compare_parser(sub) -> None:
    c = sub.add_parser("compare", help="per-task and per-family deltas of two evals of the same "
                                       "dataset contract")
    c.add_argument("run_a", type=Path, metavar="RUN_A")
    c.add_argument("run_b", type=Path, metavar="RUN_B")
    c.add_argument("--out", type=Path, default=None, help="where the comparison entry is written "
                                                          "(default: ledgers/compare/<A>--<B>/)")
    cp = sub.add_parser("compare-profiles", help="tasks whose verdict differs between two runs of one "
                                                 "dataset contract on two execution profiles",
                        description="Set two finished dataset runs of the same contract (same tasks, hashes, "
                                    "expectations and salt: make the second with `validate freeze --like`) "
                                    "on different execution profiles side by side: the profile fields that "
                                    "differ, each run's counts, and every task whose verdict or reason "
                                    "differs, with both sides' evidence. Written as sealed Markdown, HTML "
                                    "and JSON that `validate audit` of either run computes again.")
    cp.add_argument("run_a", type=Path, metavar="RUN_A")
    cp.add_argument("run_b", type=Path, metavar="RUN_B")
    cp.add_argument("--out", type=Path, default=None, help="where the comparison entry is written "
                                                           "(default: ledgers/compare-profiles/<A>--<B>/)")


def _default_env() -> str | None:
    return environments.default_name()


# --- commands ---------------------------------------------------------------------------

def _api():
    """The harness as functions, loaded only by the command that runs (``--help`` and a
    refused option never import it)."""
    from validate import api  # lazy: the harness loads only for the command that runs it

    return api


def cmd_image(args) -> int:
    log = lambda m: err.print(m, markup=False)  # noqa: E731
    if args.image_command in ("export", "import") and args.manifest is not None:  # a contract's task images
        if args.image_command == "export":
            _api().export_task_images(args.manifest, args.out, log=log)
        else:
            _api().import_task_images(args.file, args.manifest, log=log)
        return 0
    if args.image_command == "export":
        with _byte_bar("exporting") as bar:
            imagefile.export(args.image, args.out, log=log, progress=bar)
    elif args.image_command == "import":
        with _byte_bar("importing") as bar:
            imagefile.import_file(args.file, args.image, digest=args.digest, backends=_csv(args.backends),
                                  replace=args.replace, log=log, progress=bar)
    else:
        backends = _csv(args.backends)
        assert backends is not None  # --backends has a default
        build(args.image, backends, log=log)
    return 0


class _byte_bar:
    """A transfer bar for a long copy, drawn from its first bytes on (a refusal before any
    copy prints its one line only); the callable given to `validate.sandbox.imagefile`."""

    def __init__(self, label: str) -> None:
        from rich.progress import DownloadColumn, TransferSpeedColumn

        self.progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True)
        self.task: TaskID | None = None

    def __enter__(self):
        return self

    def __call__(self, done: int, total: int) -> None:
        if not err.is_terminal:
            return  # a log file gets the lines, not a bar's last frame
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task("", total=total)
        self.progress.update(self.task, completed=done, total=total)

    def __exit__(self, *exc) -> None:
        if self.task is not None:
            self.progress.stop()


def _csv(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def _idx(text: str | None) -> list[int] | None:
    try:
        return None if text is None else [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValidateError(f"--idx: expected comma-separated integers, got {text!r}") from None


def _ceilings(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValidateError(f"--ceiling: expected CONTROL=REWARD, got {item!r}") from None
    return out


def cmd_freeze(args) -> int:
    api = _api()
    if args.like is not None:
        return _freeze_like(api, args)
    controls = _csv(args.controls)
    if controls == []:  # refused before anything is loaded; `contract.agent_entries` refuses it for the API
        raise ValidateError(f"--controls: a contract must name at least one negative control, got "
                            f"{args.controls!r}; name one (comma-separated) or omit --controls for every "
                            "control the environment declares")
    manifest = api.freeze(
        args.name, env=args.env, config=args.config, config_overrides=given(args, "cfg_"), idx=_idx(args.idx),
        idx_start=args.idx_start or 0, idx_stop=args.idx_stop, backend=args.backend, image=args.image,
        limits=given(args, "lim_"), controls=controls, ceilings=_ceilings(args.ceiling),
        pass_threshold=args.pass_threshold, exception_rule=args.exception_rule or "strict",
        min_count=args.min_count, infra_retries=2 if args.infra_retries is None else args.infra_retries,
        data=args.data, allow_patch=args.allow_patch, out=args.out, log=lambda m: err.print(m, markup=False),
        oracle_repeats=_repeats(args.oracle_repeats), verifier_mode=args.verifier_mode or "trusted",
        build_trust_store=args.build_trust_store, build_clock=args.build_clock, registry=args.registry,
        image_budget_gb=args.image_budget_gb)
    return _froze(manifest, args)


def _repeats(text: str | None) -> int:
    """``--oracle-repeats``: a whole number ≥ 1, refused before anything loads (the API holds
    it to the contract's upper bound)."""
    if text is None:
        return 1
    digits = text.strip()
    n = int(digits) if digits.isascii() and digits.isdigit() else 0  # no sign, "1_0", "1.5" or other scripts
    if n < 1:
        raise ValidateError("--oracle-repeats: expected an integer ≥ 1 (how many times the oracle plays "
                            f"each task), got {text!r}")
    return n


def _freeze_like(api, args) -> int:
    """``freeze --like``: the dataset and expectations come from the manifest; only the profile is given."""
    dataset = {"--env": args.env, "--config": args.config, "--idx": args.idx, "--idx-start": args.idx_start,
               "--idx-stop": args.idx_stop, "--controls": args.controls, "--ceiling": args.ceiling or None,
               "--pass-threshold": args.pass_threshold, "--exception-rule": args.exception_rule,
               "--min-count": args.min_count, "--oracle-repeats": args.oracle_repeats,
               **{f"--{k.replace('_', '-')}": v for k, v in given(args, "cfg_").items()}}
    bad = [flag for flag, value in dataset.items() if value is not None]
    if bad:
        raise ValidateError(f"{bad[0]}: with --like the dataset contract (environment, config, selection, "
                            f"expectations) is {args.like}'s; drop {', '.join(bad)} or freeze without --like")
    manifest = api.freeze_like(args.name, args.like, backend=args.backend, image=args.image,
                               limits=given(args, "lim_"), infra_retries=args.infra_retries, data=args.data,
                               allow_patch=args.allow_patch, out=args.out,
                               log=lambda m: err.print(m, markup=False), verifier_mode=args.verifier_mode)
    return _froze(manifest, args)


def _froze(manifest, args) -> int:
    path = args.out or MANIFEST_DIR / f"{args.name}.json"
    if args.json:
        out.print(manifest.to_json().decode(), end="", markup=False)
    else:
        out.print(f"froze {len(manifest.tasks)} tasks of {manifest.environment.name} → {path}  "
                  f"({manifest.sha256})",
                  markup=False)
    return 0


def cmd_verify(args) -> int:
    api = _api()

    m = api.verify(args.manifest, args.data, log=lambda note: err.print(f"note: {note}", markup=False))
    out.print(f"{args.manifest}: OK — {m.environment.name} revision {m.environment.revision}, {len(m.tasks)} "
              f"task hashes, {len(m.expectations.agents)} agents, backend {m.execution.backend}, "
              f"image {m.execution.image_digest[:19]}…, {m.execution.architecture}{_task_images(m)}",
              markup=False)
    return 0


def _task_images(m) -> str:
    frozen = m.execution.task_images
    if frozen is None:
        return ""
    return f", {sum(e.image is not None for e in frozen.tasks.values())} task images held"


class _Bar:
    """A progress bar over every attempt a phase plans (phases may plan several times). It is
    drawn from the first plan on: input refused before anything runs prints its one line only."""

    def __enter__(self):
        columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn()]
        self.progress = Progress(*columns, console=err, transient=False)
        self.bar = self.progress.add_task("attempts", total=0)
        self.started = False
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.wall_s = time.monotonic() - self.t0
        return self.progress.__exit__(*exc) if self.started else None

    def _start(self) -> None:
        if not self.started:
            self.progress.__enter__()
            self.started = True

    @property
    def hooks(self) -> PhaseProgress:
        def plan(n: int) -> None:
            self._start()
            self.progress.update(self.bar, total=self.progress.tasks[0].total + n)

        def attempt(_) -> None:
            self._start()
            self.progress.advance(self.bar)

        return PhaseProgress(plan=plan, attempt=attempt)


def _finish(args, summary, root, wall_s: float) -> int:
    if args.json:
        out.print(summary.model_dump_json(indent=2), markup=False)
        return 0 if summary.dataset_verdict.verdict == "PASS" else 1
    c = summary.counts
    verdict = summary.dataset_verdict
    style = "green" if verdict.verdict == "PASS" else "red"
    out.print(verdict.headline, style=style, markup=False)
    out.print(f"run {summary.run_id}: {c.compatible}/{c.tasks} tasks compatible, {c.excluded} excluded, "
              f"{c.incomplete} incomplete; {c.attempts} attempts in {wall_s:.1f} s; evidence in {root}",
              markup=False)
    for reason, n in c.excluded_by_reason.items():
        out.print(f"  excluded, {reason}: {n}/{c.tasks}", markup=False)
    for crit in verdict.criteria:
        if crit.status != "met":
            err.print(f"  {crit.status.upper()} {crit.name}: {crit.detail}", markup=False)
    return 0 if verdict.verdict == "PASS" else 1


def _where(args) -> dict:
    return dict(run_dir=args.run_dir, resume=args.resume, concurrency=args.concurrency, data=args.data,
                allow_patch=args.allow_patch, executor=args.executor)


def _phase(args, fn) -> int:
    with _Bar() as bar:
        summary = fn(bar.hooks)
    return _finish(args, summary, args.resume or args.run_dir or LEDGER_DIR / summary.run_id, bar.wall_s)


def cmd_run(args) -> int:
    api = _api()

    return _phase(args, lambda hooks: api.run(args.manifest, agents=args.agents, phase=args.phase,
                                              progress=hooks, **_where(args)))


def cmd_pool(args) -> int:
    api = _api()

    return _phase(args, lambda hooks: api.pool(args.manifest, smoke_sample=args.smoke_sample,
                                               manifest_dir=args.manifest_dir, progress=hooks,
                                               log=lambda m: err.print(m, markup=False), **_where(args)))


def cmd_pilot(args) -> int:
    api = _api()

    return _phase(args, lambda hooks: api.pilot(args.manifest, per_stratum=args.per_stratum, progress=hooks,
                                                **_where(args)))


def cmd_package(args) -> int:
    done = _api().package(args.run_dir, out=args.out, data=args.data, format=args.format)
    n = sum(1 for f in done["files"] if f.endswith("/task.toml"))
    if args.format == "parquet":  # one file in the published shape: its rows are the tasks
        import pyarrow.parquet as pq

        n = sum(pq.ParquetFile(args.out / f).metadata.num_rows
                for f in done["files"] if f.endswith(".parquet"))
    out.print(f"packaged {n} tasks of {args.run_dir} → "
              f"{args.out} (revision {done['revision']}, {len(done['files'])} files in package.json)",
              markup=False)
    return 0


def cmd_smoke(args) -> int:
    api = _api()

    result = api.smoke(args.run_dir, sample=args.sample, data=args.data,
                       log=lambda m: err.print(m, markup=False))
    if args.json:
        out.print(result.model_dump_json(indent=2), markup=False)
        return 0 if result.passed else 1
    (out if result.passed else err).print(("smoke PASSED: " if result.passed else "smoke FAILED: ")
                                          + result.summary, markup=False)
    for line in result.mismatches[:20]:
        err.print(f"  {line}", style="red", markup=False)
    return 0 if result.passed else 1


def cmd_report(args) -> int:
    api = _api()

    entry, verdict = api.report(args.run_dir)
    if args.json:
        out.print((entry / REPORT_JSON).read_text(), markup=False, end="")
        return 0
    what = verdict.headline if verdict else "eval report"
    out.print(f"{what}\nwrote {entry / REPORT_MD} and {entry / REPORT_HTML}", markup=False)
    return 0


def cmd_audit(args) -> int:
    api = _api()

    result = api.audit(args.run_dir, signature=args.signature, identity=args.identity, data=args.data,
                       manifests=args.manifests)
    if args.json:
        import dataclasses
        import json

        out.print(json.dumps(dataclasses.asdict(result), indent=2), markup=False)
        return 1 if result.problems else 0
    return print_audit(result, args.run_dir)


def print_audit(result, run_dir) -> int:
    """An audit's outcome for a person: what is sealed only, each problem, the verdict line;
    the exit code (1 on any problem: whatever could not be checked is one)."""
    for note in result.sealed_only:
        err.print(f"sealed only — bound by a signature: {note}", markup=False)
    if result.problems:
        for p in result.problems:
            out.print(f"FAIL {p}", markup=False)
        err.print(f"audit failed: {len(result.problems)} problem(s) in {run_dir}", style="red")
        return 1
    out.print(f"audit passed: {run_dir} ({'; '.join(result.checked)})", markup=False)
    return 0


def cmd_sign(args) -> int:
    api = _api()

    sig = api.sign(args.run_dir, args.key)
    out.print(f"signed {args.run_dir / CHECKSUMS} → {sig}", markup=False)
    return 0


def cmd_view(args) -> int:
    from validate.view import make_server  # lazy: the viewer (pandas) loads only for `validate view`

    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        raise ValidateError(f"DIR: not a directory: {', '.join(missing)}")
    if not 0 <= args.port <= 65535:
        raise ValidateError("--port: must be between 0 and 65535")
    try:
        server = make_server(args.dirs, args.port, log=(lambda m: err.print(m, markup=False)) if args.log
                             else None)
    except OSError as e:
        raise ValidateError(f"--port: cannot listen on 127.0.0.1:{args.port} ({e.strerror})") from None
    out.print(f"serving {len(args.dirs)} director{'y' if len(args.dirs) == 1 else 'ies'} read-only at "
              f"{server.url}  (Ctrl-C stops)", markup=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _template(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValidateError(f"{path}: cannot read the template ({e})") from None


def cmd_eval(args) -> int:
    api = _api()
    if args.eval_command == "freeze":
        c = api.eval_freeze(args.name, pool_run=args.pool_run, manifest=args.manifest, model=args.model,
                            model_revision=args.model_revision, base_url=args.base_url, server=args.server,
                            api_key_env=args.api_key_env, system_template=_template(args.system_template),
                            user_template=_template(args.user_template), sampling=given(args, "smp_"),
                            limits=given(args, "alim_"), k=args.k, data=args.data,
                            allow_patch=args.allow_patch, out=args.out)
        out.print(f"froze eval {c.name}: {c.model.id}@{c.model.revision} on {c.parent.task_count} tasks of "
                  f"{c.parent.manifest_name}, k={c.k} → {args.out or MANIFEST_DIR / (args.name + '.json')}  "
                  f"({c.sha256})", markup=False)
        return 0
    if args.eval_command == "run":
        with _Bar() as bar:
            s = api.eval_run(args.contract, manifest=args.manifest, passes=_csv(args.passes) or [],
                             progress=bar.hooks, run_dir=args.run_dir, resume=args.resume,
                             concurrency=args.concurrency, data=args.data, allow_patch=args.allow_patch,
                             executor=args.executor)
        if args.json:
            out.print(s.model_dump_json(indent=2), markup=False)
        else:
            from validate.eval.report import headline  # lazy: the eval report loads only for `eval report`

            out.print(headline(s), markup=False)
            out.print(f"run {s.run_id}: {s.attempts} attempts ({s.superseded} superseded) in "
                      f"{bar.wall_s:.1f} s; evidence in "
                      f"{args.resume or args.run_dir or LEDGER_DIR / s.run_id}", markup=False)
        # An interrupted eval never returns here: `evaluate` finishes the evidence and re-raises
        # Interrupted, which `main` turns into 130. A summary that came back is a finished run.
        return 0
    if args.eval_command == "report":
        entry = api.eval_report(args.run_dir)
        out.print(f"wrote {entry / REPORT_MD} and {entry / REPORT_HTML}", markup=False)
        return 0
    return print_audit(api.eval_audit(args.run_dir, data=args.data, manifests=args.manifests), args.run_dir)


def cmd_compare(args) -> int:
    api = _api()

    result, entry = api.compare(args.run_a, args.run_b, out=args.out)
    for name, a, b, d in result.overall:
        out.print(f"{name}: {a} → {b} ({d})", markup=False)
    out.print(f"varied: {', '.join(f for f, _, _ in result.varied) or 'nothing'}; wrote {entry}",
              markup=False)
    return 0


def _field_groups(fields: list[str]) -> str:
    """Differing fields for one line: those under one per-task or per-base map counted, not
    listed (every task image differs between two daemons); the comparison has them all."""
    groups: dict[str, int] = {}
    for f in fields:
        parts = f.split(".")
        key = ".".join(parts[:2]) + ".*" if parts[0] == "task_images" and len(parts) > 3 else f
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(f"{k} ({n} fields)" if k.endswith(".*") else k for k, n in groups.items()) or "none"


def cmd_compare_profiles(args) -> int:
    api = _api()

    result, entry = api.compare_profiles(args.run_a, args.run_b, out=args.out)
    total = result.a.tasks
    out.print(f"{result.a.run_id} ({result.a.backend}) vs {result.b.run_id} ({result.b.backend}): "
              f"{result.same}/{total} tasks agree, {len(result.differences)}/{total} differ; profile fields "
              f"that differ: {_field_groups([f for f, _, _ in result.profile])}; wrote {entry}", markup=False)
    for d in result.differences:
        out.print(f"  {d.task_id}: {' — '.join(p for p in d.a[:2] if p)} → "
                  f"{' — '.join(p for p in d.b[:2] if p)}",
                  markup=False)
    return 0


COMMANDS = {"image": cmd_image, "freeze": cmd_freeze, "verify": cmd_verify, "run": cmd_run, "pool": cmd_pool,
            "pilot": cmd_pilot, "smoke": cmd_smoke, "package": cmd_package, "report": cmd_report,
            "audit": cmd_audit, "sign": cmd_sign, "view": cmd_view, "eval": cmd_eval, "compare": cmd_compare,
            "compare-profiles": cmd_compare_profiles}


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt  # a stop from a job scheduler is handled like Ctrl-C


#: glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: Blocks this large or larger are mapped apart and unmapped when freed; the heap is trimmed
#: once this much is free at its top (glibc's own initial values).
HEAP_THRESHOLD = 128 * 1024


def _freed_memory_goes_back() -> None:
    """Keep the C library's allocator giving freed memory back to the system. glibc raises its
    mmap and trim thresholds each time a large block is freed, so after the first large string
    or buffer a run frees (a 10,000-task contract's text is 2.2 MB) every later one of that size
    comes from the heap and stays resident when freed: the driver of a 10,000-task pool kept
    ~7 MB more than a 1,000-task one's from reading its contract alone (docs/performance.md,
    "Driver memory"). Fixed thresholds (glibc's defaults) keep them returning. Nothing is
    changed where the user tunes malloc already, or where the C library is not glibc."""
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")):
        return
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return
    except (AttributeError, ValueError, OSError):  # no confstr, or not glibc
        return
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(M_MMAP_THRESHOLD, HEAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, HEAP_THRESHOLD)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
    except ValidateError as e:
        err.print(f"error: {e}", style="red", markup=False)
        return 2
    _freed_memory_goes_back()
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by a shell
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ray_address(args)
        return COMMANDS[args.command](args)
    except Interrupted as e:
        err.print(str(e), style="yellow", markup=False)
        return 130
    except ValidateError as e:
        err.print(f"error: {e}", style="red", markup=False)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted", style="yellow")
        return 130
    except Exception as e:  # noqa: BLE001 - a bug must still end in a message, not a traceback
        if os.environ.get("VALIDATE_DEBUG"):
            raise
        err.print(f"internal error: {type(e).__name__}: {e} (rerun with VALIDATE_DEBUG=1 for the traceback, "
                  f"and please report it)", style="red", markup=False)
        return 3


if __name__ == "__main__":
    sys.exit(main())
