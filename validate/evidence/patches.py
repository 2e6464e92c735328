"""Patches are data: the code that runs is a commit, or its uncommitted diff is stored.

`code_state` reads the git checkout the harness runs from (``git diff HEAD`` of tracked
files). A freeze or a run on a dirty tree is refused unless ``--allow-patch``; then the diff
is written into the manifest's patch record (sha256, files) and the run directory
(``patch.diff``), so the report's Patches section and the manifest chain name it. An
installed package outside a checkout (the smoke test's fresh venv) has no git: its code is
the wheel, named in the smoke result by its sha256.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

import validate
from environment.protocol import sha256_tag
from validate.core.errors import ContractError


class PatchInfo(BaseModel):
    """An uncommitted change the code ran with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_commit: str = Field(description="The commit the diff applies to.")
    sha256: str = Field(description="sha256 of the diff (`git diff HEAD`), stored as patch.diff.")
    files: list[str] = Field(description="Files the diff changes.")


@dataclass(frozen=True)
class CodeState:
    commit: str
    diff: bytes
    files: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.commit + ("-dirty" if self.diff else "")

    @property
    def patch(self) -> PatchInfo | None:
        if not self.diff:
            return None
        return PatchInfo(base_commit=self.commit, sha256=sha256_tag(self.diff), files=list(self.files))


def _git(here: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(here), *args], capture_output=True, timeout=30)


def code_state() -> CodeState:
    here = Path(validate.__file__).resolve().parent
    try:
        head = _git(here, "rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return CodeState("unknown (no git)", b"", ())
    if head.returncode != 0:
        return CodeState("unknown (not a git checkout)", b"", ())
    diff = _git(here, "diff", "HEAD", "--binary").stdout
    files = _git(here, "diff", "HEAD", "--name-only").stdout.decode().split()
    return CodeState(head.stdout.decode().strip(), diff, tuple(sorted(files)))


def require(allow_patch: bool) -> CodeState:
    """The code state, refusing a dirty tree unless `allow_patch`."""
    state = code_state()
    if state.diff and not allow_patch:
        shown = ", ".join(state.files[:5]) + (" …" if len(state.files) > 5 else "")
        raise ContractError(f"code: uncommitted changes to {shown}; commit them, or pass --allow-patch to "
                            "run with them (the diff is then stored with the evidence and "
                            "named in the report)")
    return state
