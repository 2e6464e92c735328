"""Materialise one attempt on the host, and read its reply back.

    <attempt dir>/            the attempt's own tmpfs (validate.sandbox.storage): bytes and inodes
                              capped, mode 0710 root:<agent gid>; unmounted after the attempt
        workspace/            → /workspace (rw), owned by the agent's uid: the task's files
        tmp/                  → /tmp (rw), owned by the agent's uid
        agent/                → /agent (ro): agent.py, agentlib.py, support files, task.json,
                                 and source/ (the environment's source) for agents that see it
        answer_key/           → /answer_key (ro), only for an agent that sees the answer key:
                                 answer.json, mode 0400, owned by the key-reading uid

Agents that see the answer key run as `KEY_UID`, every other agent as `AGENT_UID`, so the
key is unreadable to any other agent even on the host. ``task.json`` is the agent view:
the prompt, the environment's public meta and an opaque id (`Manifest.opaque_id`) — never
the task's id or hash.

The reply is read back from ``workspace/reply.txt`` without following symlinks and without
blocking (a FIFO), refused unless it is a regular file, and capped at ``max_reply_bytes``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from environment.protocol import AgentSpec, Task, canonical_json, sha256_tag
from validate.agents import agentlib_source
from validate.core.errors import AgentError
from validate.core.paths import (
    AGENT_UID,
    KEY_UID,
    REPLY_FILE,
    SANDBOX_AGENT,
    SANDBOX_ANSWER_KEY,
    SANDBOX_WORKSPACE,
)
from validate.sandbox import Mount
from validate.sandbox.storage import remove_tree


def workspace_sha256(files: dict[str, bytes]) -> str:
    """sha256 of the canonical JSON ``{name: sha256(bytes)}`` of the task's files."""
    return sha256_tag(canonical_json({name: sha256_tag(data)[7:] for name, data in files.items()}))


def agent_view(task: Task, opaque_id: str) -> bytes:
    """What ``/agent/task.json`` holds: the prompt, public meta and an opaque id; never the gold,
    the task's id or its hash."""
    return canonical_json({"id": opaque_id, "prompt": task.prompt, "meta": dict(task.meta)})


@dataclass(frozen=True)
class Materialised:
    root: Path
    mounts: tuple[Mount, ...]
    env: dict[str, str]
    user: str
    tmp: Path

    @property
    def reply_path(self) -> Path:
        return self.root / "workspace" / REPLY_FILE


def _write(path: Path, data: bytes, mode: int, owner: int = 0) -> None:
    path.write_bytes(data)
    os.chown(path, owner, owner)
    path.chmod(mode)


def _dir(path: Path, mode: int, owner: int = 0) -> Path:
    path.mkdir(mode=mode)
    os.chown(path, owner, owner)
    path.chmod(mode)
    return path


def lay_out_workspace(root: Path, task: Task, uid: int) -> tuple[Path, Path]:
    """``root/workspace`` holding the task's files and an empty ``root/tmp``, both owned by
    `uid`: what every attempt kind's sandbox gets at /workspace and /tmp."""
    ws, tmp = _dir(root / "workspace", 0o755, uid), _dir(root / "tmp", 0o700, uid)
    for name, data in task.files.items():
        _write(ws / name, data, 0o644, uid)
    return ws, tmp


def lay_out(root: Path, task: Task, agent: AgentSpec, opaque_id: str,
            source: list[tuple[str, Path]] | None = None) -> Materialised:
    """Write the attempt's files under `root` (an empty directory) and say how to mount them."""
    uid = agent_uid(agent)
    ws, tmp = lay_out_workspace(root, task, uid)
    ad = _dir(root / "agent", 0o755)
    _write(ad / "agent.py", agent.program.read_bytes(), 0o644)
    _write(ad / "agentlib.py", agentlib_source(), 0o644)
    for extra in agent.support:
        _write(ad / extra.name, extra.read_bytes(), 0o644)
    _write(ad / "task.json", agent_view(task, opaque_id), 0o644)
    if agent.sees_source:
        for rel, path in source or []:
            target = ad / "source" / rel
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            _write(target, path.read_bytes(), 0o644)
    mounts = [Mount(source=ws, target=SANDBOX_WORKSPACE, read_only=False),
              Mount(source=ad, target=SANDBOX_AGENT, read_only=True)]
    env = {"WORKSPACE": SANDBOX_WORKSPACE, "AGENT_DIR": SANDBOX_AGENT, "PYTHONDONTWRITEBYTECODE": "1"}
    if agent.sees_answer_key:
        kd = _dir(root / "answer_key", 0o500, KEY_UID)
        _write(kd / "answer.json", task.answer_key, 0o400, KEY_UID)
        mounts.append(Mount(source=kd, target=SANDBOX_ANSWER_KEY, read_only=True))
        env["ANSWER_KEY_DIR"] = SANDBOX_ANSWER_KEY
    return Materialised(root=root, mounts=tuple(mounts), env=env, user=f"{uid}:{uid}", tmp=tmp)


def agent_uid(agent: AgentSpec) -> int:
    """The uid (and gid) an agent runs as: agents that see the answer key have their own."""
    return KEY_UID if agent.sees_answer_key else AGENT_UID


@contextmanager
def materialise(task: Task, agent: AgentSpec, opaque_id: str, storage, source=None) -> Iterator[Materialised]:
    """Lay the attempt out in a fresh directory from `storage` (a context manager, given the
    agent's gid, yielding an empty directory and removing it with everything in it on exit)."""
    with storage(agent_uid(agent)) as root:
        yield lay_out(Path(root), task, agent, opaque_id, source)


class NotAReply(AgentError):
    """The reply file exists but is not a regular file."""


class ReplyTooLarge(NotAReply):
    """The reply is larger than allowed."""


def read_reply(path: Path, max_bytes: int) -> bytes | None:
    """The reply's bytes; None when there is no reply file; `NotAReply` (with a message for the
    evidence) for a directory, FIFO, symlink, device or socket, or a reply over `max_bytes`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotAReply(f"{REPLY_FILE} is a symbolic link, not a file") from None
        if e.errno == errno.ENXIO:
            raise NotAReply(f"{REPLY_FILE} is a FIFO or socket with no writer, not a file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
            raise NotAReply(f"{REPLY_FILE} is {kind}, not a file")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ReplyTooLarge(f"the reply is larger than {max_bytes} bytes")
    return b"".join(chunks)


@contextmanager
def temp_storage(gid: int | None = None, base: Path | None = None) -> Iterator[Path]:
    """A plain temporary directory (no quota: for tests of other things), removed after."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="attempt-", dir=base))
    try:
        root.chmod(0o711)
        yield root
    finally:
        remove_tree(root)
