"""Where everything lives, in one place.

A run directory (``ledgers/<run-id>/``)::

    ledgers/<run-id>/
        manifest.json             copy of the contract the run was given (byte-identical)
        frozen-manifest.json      pool: the frozen child contract (the oracle's exception-free passes)
        variants/<name>.json      pilot: the child contract of each config variant
        patch.diff                the uncommitted change the code ran with (only with --allow-patch)
        journal.jsonl             attempts as they finish (append-only; folded into Parquet at the end)
        attempts.parquet          one row per attempt, superseded ones included
        replies/<sha256>          every reply's whole bytes, by content (stored once, before its journal line)
        tasks.parquet             one verdict per task (and phase)
        exclusions.parquet        one row per excluded task, one reason each
        run.json                  run summary: counts, dataset verdict, timings, machine, code
        scorer-cache/             answers a scorer must not recompute (a judge's), by request hash
        smoke/<UTC time>/         each fresh-materialisation smoke test (never overwritten)
        reports/<UTC time>/       each report.md, report.html, report.json (never overwritten)
        earlier/<key>/            the files a report was rendered from, kept when a resume rewrote them
        checksums                 sha256 of every other file (``sha256sum -c`` format)
        checksums.sig             optional OpenSSH signature of checksums (`validate sign`)

The sandbox image store (``validate image build``; ``$VALIDATE_IMAGE_DIR``, by default
``/var/lib/deshuffle-validate/images``)::

    <image_dir>/<image-name>/
        rootfs.tar           the Debian root filesystem, built reproducibly; its sha256 is the
                             image digest (docker imports it as one layer with that diff_id)
        rootfs/              the same, unpacked, for bwrap (world-readable, owned by root)
        image.json           what the build recorded: digests of the tarball and of its tree,
                             the Python version, the packages (name=version)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

#: Default root of the image store; must be traversable by the sandbox uid, so not ~root.
#: ``VALIDATE_IMAGE_DIR`` overrides it, read each time an `ImagePaths` is made.
IMAGE_DIR = Path("/var/lib/deshuffle-validate/images")
DEFAULT_IMAGE = "deshuffle-validate-sandbox:bookworm"
MANIFEST_DIR = Path("manifests")
LEDGER_DIR = Path("ledgers")

#: Paths as the agent sees them inside the sandbox.
SANDBOX_WORKSPACE = "/workspace"
SANDBOX_AGENT = "/agent"
SANDBOX_ANSWER_KEY = "/answer_key"
REPLY_FILE = "reply.txt"  # the agent's reply: /workspace/reply.txt


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def frozen_manifest(self) -> Path:
        return self.root / "frozen-manifest.json"

    @property
    def variants(self) -> Path:
        return self.root / "variants"

    @property
    def patch(self) -> Path:
        return self.root / "patch.diff"

    @property
    def scorer_cache(self) -> Path:
        return self.root / "scorer-cache"

    @property
    def smoke(self) -> Path:
        return self.root / "smoke"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def signature(self) -> Path:
        return self.root / "checksums.sig"

    @property
    def journal(self) -> Path:
        return self.root / "journal.jsonl"

    @property
    def replies(self) -> Path:
        return self.root / "replies"

    @property
    def attempts(self) -> Path:
        return self.root / "attempts.parquet"

    @property
    def tasks(self) -> Path:
        return self.root / "tasks.parquet"

    @property
    def exclusions(self) -> Path:
        return self.root / "exclusions.parquet"

    @property
    def summary(self) -> Path:
        return self.root / "run.json"

    @property
    def checksums(self) -> Path:
        return self.root / "checksums"


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
