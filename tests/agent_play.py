"""Play an environment's agent program for real without a sandbox: ``python3 -S agent.py``
as the sandbox's user, in an attempt directory laid out by the harness's own
`validate.run.workspace.lay_out`, with the sandbox's environment variables pointing at it. For
tests that check what an agent program replies on many tasks, faster than a sandbox each."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from validate.run.workspace import agent_uid, lay_out


def attempt_base() -> Path:
    """A directory for attempt dirs that the sandbox user can reach (not root's private tmp)."""
    root = Path(tempfile.mkdtemp(prefix="agent-play-"))
    root.chmod(0o711)
    return root


def run_agent(agent, task, base: Path, source=None, opaque_id: str | None = None) -> bytes | None:
    """The reply file the agent leaves (None: none), after asserting it exited 0."""
    root = Path(tempfile.mkdtemp(dir=base))
    root.chmod(0o711)  # as the harness's attempt storage lets the agent through
    m = lay_out(root, task, agent, opaque_id=opaque_id or f"opaque-{task.idx:04d}", source=source)
    uid = agent_uid(agent)  # agents that see the answer key run as their own uid, which alone can read it
    env = {"WORKSPACE": str(root / "workspace"), "AGENT_DIR": str(root / "agent"),
           "ANSWER_KEY_DIR": str(root / "answer_key"), "PYTHONDONTWRITEBYTECODE": "1",
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(["python3", "-S", str(root / "agent" / "agent.py")], cwd=root / "workspace",
                          env=env, user=uid, group=uid, capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    reply = m.reply_path.read_bytes() if m.reply_path.exists() else None
    shutil.rmtree(root)
    return reply
