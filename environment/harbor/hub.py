"""A published dataset on the Hugging Face Hub: ``hf://<owner>/<name>@<revision>``.

Read through ``huggingface_hub`` (the optional ``hub`` extra), which keeps what it downloads
in its own cache (``HF_HUB_CACHE``) and, offline (``HF_HUB_OFFLINE=1``), answers from it
alone. Only the repository's ``*.parquet`` files are fetched. A branch or tag is resolved to
its commit, and the commit is what is recorded: `snapshot` is given the commit a contract
froze (``pinned``), so every later load reads exactly that commit however the branch moved.
A revision of 40 hex digits is a commit already. Without ``@<revision>``, ``main``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from environment.protocol import ConfigError

PREFIX = "hf://"
_REF = re.compile(r"^hf://(?:datasets/)?([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@([^\s@]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
INSTALL = "pip install 'deshuffle-validate[hub]' (the hub extra: huggingface_hub)"


def is_hub(location: str) -> bool:
    return location.startswith(PREFIX)


def parse(location: str) -> tuple[str, str]:
    """(owner/name, the revision asked for), or a `ConfigError` showing the form."""
    m = _REF.match(location)
    if m is None:
        raise ConfigError(f"dataset: {location!r} is not a Hub dataset reference; write "
                          "hf://<owner>/<name>@<revision> (e.g. hf://my-org/my-tasks@main, or "
                          "a 40-hex commit)")
    return m.group(1), m.group(2) or "main"


def snapshot(location: str, pinned: str | None = None,
             log: Callable[[str], None] = lambda m: None) -> tuple[Path, str, str, str]:
    """(the local snapshot folder of the repository's Parquet files, owner/name, the revision
    asked for, the commit it resolved to). `pinned`: the commit to read instead of resolving."""
    repo, requested = parse(location)
    if pinned is not None and not _COMMIT.match(pinned):
        raise ConfigError(f"dataset: the contract pins {location} to {pinned!r}, which is not a commit")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ConfigError(
            f"dataset: {location} is on the Hugging Face Hub; reading it needs {INSTALL}"
        ) from None
    want = pinned or requested
    log(f"dataset {location}: resolving {repo} at {want} ...")
    try:
        folder = Path(snapshot_download(repo, repo_type="dataset", revision=want,
                                        allow_patterns=["*.parquet"]))
    except Exception as e:  # the library's own errors: not found, offline and not cached, HTTP
        raise ConfigError(f"dataset: {location}: huggingface_hub cannot give revision {want} of {repo} "
                          f"({type(e).__name__}: {_first_line(e)}); check the name and revision, or, offline "
                          f"(HF_HUB_OFFLINE=1), that its cache (HF_HUB_CACHE) holds it") from None
    commit = folder.name
    if not _COMMIT.match(commit) or (pinned is not None and commit != pinned):
        raise ConfigError(f"dataset: {location}: huggingface_hub answered with {folder}, not a snapshot of "
                          f"commit {pinned or 'a commit'}")
    return folder, repo, requested, commit


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]
