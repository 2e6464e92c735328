"""Where everything lives, in one place: every file and directory name of a run directory is
spelled here once, as a constant below (and a `RunPaths`/`EvalPaths` attribute); every other
module names a file through them (`tests/test_names.py` keeps it so).

A dataset run directory (``validate run``/``pilot``/``pool``; ``ledgers/<run-id>/``)::

    ledgers/<run-id>/
        manifest.json             MANIFEST: copy of the contract the run was given (byte-identical)
        frozen-manifest.json      FROZEN_MANIFEST: pool: the frozen child contract (the oracle's
                                  exception-free passes)
        variants/<name>.json      VARIANTS: pilot: the child contract of each config variant
        patch.diff                PATCH: the uncommitted change the code ran with (only with --allow-patch)
        journal.jsonl             JOURNAL: attempts as they finish (append-only; folded into Parquet at
                                  the end)
        attempts.parquet          ATTEMPTS: one row per attempt, superseded ones included
        replies/<sha256>          REPLIES: every reply's whole bytes, by content (stored once, before
                                  its journal line)
        tasks.parquet             TASKS: one verdict per task (and phase)
        exclusions.parquet        EXCLUSIONS: one row per excluded task, one reason each
        run.json                  SUMMARY: run summary: its kind, counts, dataset verdict, timings,
                                  machine, code
        scorer-cache/             SCORER_CACHE: answers a scorer must not recompute (a judge's), by
                                  request hash
        smoke/<UTC time>/         SMOKE: each fresh-materialisation smoke test (never overwritten):
            manifest.json             MANIFEST: the sample's child contract
            run/                      SMOKE_RUN: the rerun's own run directory (this same layout)
            result.json               SMOKE_RESULT: the comparison of the two runs
        reports/<UTC time>/       REPORTS: each report (never overwritten):
            report.md                 REPORT_MD
            report.html               REPORT_HTML
            report.json               REPORT_JSON: what the report states, and the files it was rendered from
        earlier/<key>/            EARLIER: the files a report was rendered from, kept when a resume
                                  rewrote them
        checksums                 CHECKSUMS: sha256 of every other file (``sha256sum -c`` format)
        checksums.sig             SIGNATURE: optional OpenSSH signature of checksums (`validate sign`)

A model-evaluation run directory (``validate eval run``; ``ledgers/<eval-run-id>/``) is a run
directory of the same names (`RunPaths`: MANIFEST, JOURNAL, ATTEMPTS, REPLIES, REPORTS,
EARLIER, CHECKSUMS) without the verdict files (no tasks, exclusions, run.json), plus its own
(`EvalPaths`)::

    ledgers/<eval-run-id>/
        manifest.json             MANIFEST: the frozen dataset manifest evaluated (byte-identical)
        eval-contract.json        EVAL_CONTRACT: the eval contract (byte-identical); its ``kind`` is "eval"
        journal.jsonl             JOURNAL: attempts as they finish
        eval-journal.jsonl        EVAL_JOURNAL: each finished attempt's sample row and turns, before
                                  its attempt row
        attempts.parquet          ATTEMPTS: one row per attempt, role model
        replies/<sha256>          REPLIES: every reply's whole bytes
        trajectories.parquet      TRAJECTORIES: one row per model call
        samples.parquet           SAMPLES: one row per attempt, failure class included
        eval-tasks.parquet        EVAL_TASKS: one row per task of the sampled pass
        eval.json                 EVAL_SUMMARY: the summary: metrics, counts, timings
        reports/<UTC time>/       REPORTS: each eval report (report.md, report.html, report.json)
        earlier/<key>/            EARLIER: as above
        checksums                 CHECKSUMS: sha256 of every other file

A comparison of two eval runs (``validate eval compare``) is a directory of its own holding
compare.md, compare.html and compare.json (COMPARE_MD, COMPARE_HTML, COMPARE_JSON).

Which kind a run directory holds is read from what it records (`validate.evidence.summary.run_kind`).

The sandbox image store (``validate image build``; ``$VALIDATE_IMAGE_DIR``, by default
``/var/lib/deshuffle-validate/images``)::

    <image_dir>/<image-name>/
        rootfs.tar           the Debian root filesystem, built reproducibly; its sha256 is the
                             image digest (docker imports it as one layer with that diff_id)
        rootfs/              the same, unpacked, for bwrap (world-readable, owned by root)
        image.json           what the build recorded: digests of the tarball and of its tree,
                             the Python version, the packages (name=version)
    <image_dir>/task-images/ TASK_IMAGES: task-directory datasets' images (`validate.taskdir.images`)
        bases/               the base-image map's root filesystems and base-map.json
        <key>/               one task image's build: image.json and build.log, by content key
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

#: Default root of the image store; must be traversable by the sandbox uid, so not ~root.
#: ``VALIDATE_IMAGE_DIR`` overrides it, read each time an `ImagePaths` is made.
IMAGE_DIR = Path("/var/lib/deshuffle-validate/images")
#: Under the image store: task-directory datasets' base images and per-task image records.
TASK_IMAGES = "task-images"


def task_image_store() -> Path:
    """Where task images' bases and build records are kept (``$VALIDATE_IMAGE_DIR/task-images``)."""
    return Path(os.environ.get("VALIDATE_IMAGE_DIR") or IMAGE_DIR) / TASK_IMAGES

DEFAULT_IMAGE = "deshuffle-validate-sandbox:bookworm"
MANIFEST_DIR = Path("manifests")
LEDGER_DIR = Path("ledgers")

#: Paths as the agent sees them inside the sandbox.
SANDBOX_WORKSPACE = "/workspace"
SANDBOX_AGENT = "/agent"
SANDBOX_ANSWER_KEY = "/answer_key"
REPLY_FILE = "reply.txt"  # the agent's reply: /workspace/reply.txt

# --- the names of a run directory (drawn in the module docstring) ---------------------------
#: The sandbox user every agent runs as, and the one agents that see the answer key run as
#: (so the key is unreadable to any other agent, even on the host): the same host uids on
#: every backend (`validate.run.workspace` lays attempts out for them).
AGENT_UID = 65534
KEY_UID = 65533

MANIFEST = "manifest.json"
#: The index `docker save` writes at the root of an image archive (the same name, not a run's file).
IMAGE_ARCHIVE_INDEX = "manifest.json"
FROZEN_MANIFEST = "frozen-manifest.json"
VARIANTS = "variants"
PATCH = "patch.diff"
JOURNAL = "journal.jsonl"
ATTEMPTS = "attempts.parquet"
REPLIES = "replies"
TASKS = "tasks.parquet"
EXCLUSIONS = "exclusions.parquet"
SUMMARY = "run.json"
SCORER_CACHE = "scorer-cache"
SMOKE = "smoke"
SMOKE_RUN = "run"
SMOKE_RESULT = "result.json"
REPORTS = "reports"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
REPORT_JSON = "report.json"
EARLIER = "earlier"
CHECKSUMS = "checksums"
SIGNATURE = "checksums.sig"
# an eval run's own
EVAL_CONTRACT = "eval-contract.json"
EVAL_JOURNAL = "eval-journal.jsonl"
TRAJECTORIES = "trajectories.parquet"
SAMPLES = "samples.parquet"
EVAL_TASKS = "eval-tasks.parquet"
EVAL_SUMMARY = "eval.json"
# a comparison of two eval runs
COMPARE_MD = "compare.md"
COMPARE_HTML = "compare.html"
COMPARE_JSON = "compare.json"

#: Every name of the run-directory tree above (what `tests/test_names.py` refuses elsewhere).
RUN_DIRECTORY_NAMES: frozenset[str] = frozenset({
    MANIFEST, FROZEN_MANIFEST, VARIANTS, PATCH, JOURNAL, ATTEMPTS, REPLIES, TASKS, EXCLUSIONS, SUMMARY,
    SCORER_CACHE, SMOKE, SMOKE_RUN, SMOKE_RESULT, REPORTS, REPORT_MD, REPORT_HTML, REPORT_JSON, EARLIER,
    CHECKSUMS, SIGNATURE, EVAL_CONTRACT, EVAL_JOURNAL, TRAJECTORIES, SAMPLES, EVAL_TASKS, EVAL_SUMMARY,
    COMPARE_MD, COMPARE_HTML, COMPARE_JSON})

#: The files every dataset report reads (beside the frozen and variant contracts and the smoke
#: results; a resume keeps them under EARLIER), sorted.
LEDGER_FILES: tuple[str, ...] = (ATTEMPTS, EXCLUSIONS, MANIFEST, SUMMARY, TASKS)
#: The ledgers an eval report is rendered from, sorted.
EVAL_INPUTS: tuple[str, ...] = (ATTEMPTS, EVAL_CONTRACT, EVAL_TASKS, EVAL_SUMMARY, SAMPLES, TRAJECTORIES)


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def sandbox_label(self) -> str:
        """The label of this run's sandboxes and attempt storage on this machine: the run's id
        and a digest of where its directory is. Opening a sandbox sweeps what an earlier process
        of its label left (killed containers, mounted tmpfs), so two runs of one name in two
        places (``runs/a/run``, ``runs/b/run``) must not share it; a resume of one run does."""
        where = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:10]
        return f"{self.root.name[:180]}.{where}"

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def frozen_manifest(self) -> Path:
        return self.root / FROZEN_MANIFEST

    @property
    def variants(self) -> Path:
        return self.root / VARIANTS

    @property
    def patch(self) -> Path:
        return self.root / PATCH

    @property
    def scorer_cache(self) -> Path:
        return self.root / SCORER_CACHE

    @property
    def smoke(self) -> Path:
        return self.root / SMOKE

    @property
    def reports(self) -> Path:
        return self.root / REPORTS

    @property
    def signature(self) -> Path:
        return self.root / SIGNATURE

    @property
    def journal(self) -> Path:
        return self.root / JOURNAL

    @property
    def replies(self) -> Path:
        return self.root / REPLIES

    @property
    def attempts(self) -> Path:
        return self.root / ATTEMPTS

    @property
    def tasks(self) -> Path:
        return self.root / TASKS

    @property
    def exclusions(self) -> Path:
        return self.root / EXCLUSIONS

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def checksums(self) -> Path:
        return self.root / CHECKSUMS

    @property
    def earlier(self) -> Path:
        return self.root / EARLIER


@dataclass(frozen=True)
class EvalPaths:
    """An eval run directory: a `RunPaths` plus the eval's own files."""

    run: RunPaths

    @property
    def root(self) -> Path:
        return self.run.root

    @property
    def contract(self) -> Path:
        return self.root / EVAL_CONTRACT

    @property
    def journal(self) -> Path:
        return self.root / EVAL_JOURNAL

    @property
    def trajectories(self) -> Path:
        return self.root / TRAJECTORIES

    @property
    def samples(self) -> Path:
        return self.root / SAMPLES

    @property
    def tasks(self) -> Path:
        return self.root / EVAL_TASKS

    @property
    def summary(self) -> Path:
        return self.root / EVAL_SUMMARY


@dataclass(frozen=True)
class ImagePaths:
    name: str
    base: Path = field(default_factory=lambda: Path(os.environ.get("VALIDATE_IMAGE_DIR") or IMAGE_DIR))

    @property
    def root(self) -> Path:
        return self.base / self.name.replace("/", "_").replace(":", "_")

    @property
    def tarball(self) -> Path:
        return self.root / "rootfs.tar"

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"

    @property
    def record(self) -> Path:
        return self.root / "image.json"

    @property
    def digest_cache(self) -> Path:
        """The bwrap tree's and tarball's hashes, kept across processes (`validate.sandbox.image`)."""
        return self.root / "digests.json"
