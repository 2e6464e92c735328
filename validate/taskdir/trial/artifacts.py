"""What a separate verifier is handed: the agent's ``/logs/artifacts``, and nothing else.

Harbor's rule (``[verifier] environment_mode = "separate"``, or a ``[verifier.environment]``
table): the verifier runs in its own environment — built from ``tests/`` when
``tests/Dockerfile`` exists (the image then owns ``/tests``: the tests are not uploaded),
else a fresh copy of the task's own environment (the tests uploaded) — and the agent's
artifacts are copied into it at ``/logs/artifacts`` through a tar that drops special files
and links leaving the artifact and clears setuid/setgid bits.

Here the harness reads ``/logs/artifacts`` out of the agent's stopped container as a capped
archive (`validate.taskdir.trial.docker.read_tree`), keeps regular files and directories, drops
every link and special file (a link inside the directory too: simpler, and the verifier
never follows the agent's links), clears every bit but the permission bits (and makes each
readable by any verifier user), and uploads the rest into a fresh volume at
``/logs/artifacts`` of the verifier's container. What was dropped or cut is recorded.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from pydantic import BaseModel, Field

from validate.taskdir.trial import docker as dk

ARTIFACTS_DIR = "/logs/artifacts"

Entry = tuple[str, int, "bytes | None"]


class Handed(BaseModel):
    """The artifacts handed to a separate verifier (paths below ``/logs/artifacts``)."""

    files: list[str] = Field(default_factory=list)
    #: Entries left out, each with why (a link, a special file, cut by the size cap).
    dropped: list[str] = Field(default_factory=list)
    truncated: bool = False


def collect(api, cid: str, budget: int) -> tuple[list[Entry], Handed]:
    """The agent's artifacts as tar entries under ``logs/artifacts`` (for `dk.put_tree`)."""
    tree = dk.read_tree(api, cid, ARTIFACTS_DIR, budget, budget)
    root = ARTIFACTS_DIR.lstrip("/")
    entries: list[Entry] = [(root, 0o777, None)]
    handed = Handed(truncated=tree.truncated)
    for f in tree.entries:
        if f.path == ".":
            if f.kind != "dir":
                handed.dropped.append(f". ({ARTIFACTS_DIR} itself is a {f.kind})")
            continue
        parts = PurePosixPath(f.path).parts
        if PurePosixPath(f.path).is_absolute() or ".." in parts:
            handed.dropped.append(f"{f.path} (escapes the directory)")
        elif f.kind == "dir":
            entries.append((f"{root}/{f.path}", (f.mode & 0o777) | 0o755, None))
        elif f.kind != "file":
            handed.dropped.append(f"{f.path} (a {f.kind})")
        elif f.data is None or len(f.data) < f.size:
            handed.dropped.append(f"{f.path} (cut at the {budget}-byte cap)")
        else:
            entries.append((f"{root}/{f.path}", (f.mode & 0o777) | 0o644, f.data))
            handed.files.append(f.path)
    handed.files.sort()
    return entries, handed
