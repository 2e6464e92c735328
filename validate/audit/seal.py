"""The audit's result and its first check, the seal: what every audit (of a run, of an eval
run, of a compare entry, of a copy a resume kept) starts from, below all of them.

`AuditResult` holds the problems (each naming its file), what was re-derived and what is
sealed only; `check_seal` holds ``checksums`` to the files of a run directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from validate.core.paths import RunPaths
from validate.evidence.journal import file_sha256, sealed_files


@dataclass
class AuditResult:
    """`problems` (each naming its file; any one fails the audit), what was re-derived
    (`checked`, with counts), and what could only be sealed (`sealed_only`)."""

    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    sealed_only: list[str] = field(default_factory=list)


def check_seal(paths: RunPaths, r: AuditResult) -> None:
    """Check 1, the seal (every run directory's, the eval audit's too): ``checksums`` lists
    exactly the sealed files, each line well formed, every sha256 matching."""
    if not paths.checksums.exists():
        r.problems.append(f"{paths.checksums}: missing")
        return
    listed: dict[str, str] = {}
    for lineno, line in enumerate(paths.checksums.read_text(errors="replace").split("\n")[:-1], 1):
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name:
            r.problems.append(f"{paths.checksums} line {lineno}: malformed")
            continue
        listed[name] = digest
    present = {p.relative_to(paths.root).as_posix() for p in sealed_files(paths)}
    for name in sorted(set(listed) - present):
        r.problems.append(f"{paths.root / name}: listed in checksums but missing")
    for name in sorted(present - set(listed)):
        r.problems.append(f"{paths.root / name}: present but not listed in checksums")
    for name in sorted(set(listed) & present):
        if file_sha256(paths.root / name) != listed[name]:
            r.problems.append(f"{paths.root / name}: sha256 does not match checksums (changed after the run)")
    r.checked.append(f"checksums over {len(present)} files")
