"""Materialise one attempt on the host: workspace, agent dir and (oracle only) answer key.

    <attempt dir>/            mode 0755, removed after the attempt
        workspace/            → /workspace (rw), owned by the sandbox uid: the task's files
        agent/                → /agent (ro): agent.py, agentlib.py, task.json
        answer_key/           → /answer_key (ro), only for an agent that sees the answer key

The reply is read back from ``workspace/reply.txt`` without following symlinks (a hostile
agent could point it at a host file) and capped at ``max_reply_bytes``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from validate.agents import AgentSpec, program_source
from validate.paths import REPLY_FILE, SANDBOX_AGENT, SANDBOX_ANSWER_KEY, SANDBOX_WORKSPACE
from validate.sandbox import Mount

SANDBOX_UID = 65534


def workspace_sha256(files: dict[str, bytes]) -> str:
    """sha256 of the canonical JSON ``{name: sha256(bytes)}`` of the task's files."""
    view = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    return "sha256:" + hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()


def agent_view(task) -> dict:
    """What ``/agent/task.json`` holds: public facts of the task, never the gold."""
    return {"id": task.id, "hash": task.hash, "prompt": task.prompt, "meta": {"n_papers": task.n_papers}}


@dataclass(frozen=True)
class Materialised:
    root: Path
    mounts: tuple[Mount, ...]
    env: dict[str, str]

    @property
    def reply_path(self) -> Path:
        return self.root / "workspace" / REPLY_FILE


def _write(path: Path, data: bytes, mode: int) -> None:
    path.write_bytes(data)
    path.chmod(mode)


@contextmanager
def materialise(task, agent: AgentSpec, base: Path | None = None):
    root = Path(tempfile.mkdtemp(prefix="attempt-", dir=base))
    try:
        root.chmod(0o755)
        ws, ad = root / "workspace", root / "agent"
        ws.mkdir()
        ad.mkdir(mode=0o755)
        for name, data in task.files.items():
            _write(ws / name, data, 0o644)
        os.chown(ws, SANDBOX_UID, SANDBOX_UID)
        _write(ad / "agent.py", agent.source(), 0o644)
        _write(ad / "agentlib.py", program_source("agentlib.py"), 0o644)
        _write(ad / "task.json", json.dumps(agent_view(task), sort_keys=True).encode(), 0o644)
        ad.chmod(0o755)
        mounts = [Mount(source=ws, target=SANDBOX_WORKSPACE, read_only=False),
                  Mount(source=ad, target=SANDBOX_AGENT, read_only=True)]
        env = {"WORKSPACE": SANDBOX_WORKSPACE, "AGENT_DIR": SANDBOX_AGENT, "PYTHONDONTWRITEBYTECODE": "1"}
        if agent.sees_answer_key:
            kd = root / "answer_key"
            kd.mkdir(mode=0o755)
            _write(kd / "answer.json", task.answer_key, 0o644)
            mounts.append(Mount(source=kd, target=SANDBOX_ANSWER_KEY, read_only=True))
            env["ANSWER_KEY_DIR"] = SANDBOX_ANSWER_KEY
        yield Materialised(root=root, mounts=tuple(mounts), env=env)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class ReplyTooLarge(Exception):
    pass


def read_reply(path: Path, max_bytes: int) -> bytes | None:
    """The reply's bytes, None when there is none; `ReplyTooLarge` past `max_bytes`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a symlink or a fifo: not a reply
            return None
        raise
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ReplyTooLarge(f"the reply is larger than {max_bytes} bytes")
    return data
