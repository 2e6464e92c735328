"""The harness's own program inside trial containers (`native/dvtool.c`): built once, static,
from the source in this package, and bound read-only into every trial container at `MOUNT`.

Every process the harness starts in a trial container is this binary, named by its absolute
path (`BINARY`): PID 1 (``init``), the verifier (``run``, which then runs the image's shell on
``/tests/test.sh``) and the trusted verifier's removals (``rm``). A static binary on a mount
the container cannot write needs nothing of the image: not its PATH, not its shell, not its
dynamic linker or ``/etc/ld.so.preload``; so nothing an agent planted in the image starts
with a phase. The host side can tell a process is this program by its executable's inode
(`is_tool`), not by any name the process gives itself.

The build: ``cc -static`` (Debian's gcc and libc6-dev) into ``<image store>/task-images/tool/
<key>/dvtool``, where the key is the sha256 of the source and the compiler's version line;
an existing build of the same key is reused (and checked). A machine without a C compiler
gets `ToolUnavailable` naming the packages to install.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from validate.core.errors import SandboxError
from validate.core.paths import task_image_store

SOURCE = Path(__file__).resolve().parent / "native" / "dvtool.c"
#: Where the tool's directory is bound (read-only) in every trial container.
MOUNT = "/.dv"
BINARY = f"{MOUNT}/dvtool"
NAME = "dvtool"
#: The name PID 1 gives itself once its ids are settled (`validate.taskdir.trial.docker.settle_pid1`).
READY = "dvtool-ready"
#: The verifier's exit status when a signal, not its own exit, ended test.sh (`run`).
KILLED = 121
_lock = threading.Lock()
_built: dict[str, Path] = {}


class ToolUnavailable(SandboxError):
    """The harness's in-container program cannot be built on this machine."""


def _compiler() -> tuple[str, str]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ToolUnavailable("trial tool: no C compiler (cc) to build the harness's in-container program: "
                              "install Debian's gcc and libc6-dev (scripts/setup.sh does)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    return cc, (version[0] if version else "")


def key() -> str:
    """The build's key: the source's and the compiler's (a new compiler builds again)."""
    _, version = _compiler()
    return hashlib.sha256(SOURCE.read_bytes() + b"\0" + version.encode()).hexdigest()[:16]


def tool_dir(store: Path | None = None) -> Path:
    """The host directory holding the built tool (built on first use), to bind at `MOUNT`.

    World-readable and traversable (a rootless service and bwrap's unprivileged user bind it
    too), owned by root, never writable by anyone else."""
    store = store if store is not None else task_image_store()
    k = key()
    with _lock:
        if k in _built and (_built[k] / NAME).is_file():
            return _built[k]
        target = store / "tool" / k
        binary = target / NAME
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            _build(target)
        _built[k] = target
        return target


def _build(target: Path) -> None:
    cc, _ = _compiler()
    target.parent.mkdir(parents=True, exist_ok=True)
    for p in (target.parent.parent, target.parent):
        p.chmod(0o755)
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        out = scratch / NAME
        done = subprocess.run([cc, "-static", "-Os", "-s", "-Wall", "-Werror", "-o", str(out), str(SOURCE)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise ToolUnavailable(
                f"trial tool: {cc} could not build {SOURCE.name} statically (Debian: "
                f"install libc6-dev for the static C library): {done.stderr.strip()[-600:]}"
            )
        out.chmod(0o755)
        scratch.chmod(0o755)
        try:
            scratch.rename(target)
        except OSError:  # built meanwhile by another process: theirs is the same build
            if not (target / NAME).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def shared_object(source: Path, store: Path | None = None) -> Path:
    """A control's native support file (`source`, C) built into a shared object with no C
    library (``cc -shared -fPIC -nostdlib``), cached under the tool store by the source's and
    the compiler's key; its path. `ToolUnavailable` when it does not build."""
    cc, version = _compiler()
    data = Path(source).read_bytes()
    k = hashlib.sha256(data + b"\0" + version.encode()).hexdigest()[:16]
    target = (store if store is not None
              else task_image_store()) / "tool" / "support" / f"{Path(source).stem}-{k}.so"
    with _lock:
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}")
        done = subprocess.run([cc, "-shared", "-fPIC", "-nostdlib", "-Os", "-s", "-Wall", "-Werror", "-o",
                               str(scratch), str(source)], capture_output=True, text=True)
        if done.returncode != 0:
            scratch.unlink(missing_ok=True)
            raise ToolUnavailable(f"trial tool: {cc} could not build {Path(source).name}: "
                                  f"{done.stderr.strip()[-600:]}")
        scratch.chmod(0o755)
        scratch.rename(target)
        return target


def is_tool(pid: int, tool: Path) -> bool:
    """Whether host process `pid` runs the built tool in `tool` (its executable's device and
    inode, as the kernel holds them: a process cannot rename its way into this)."""
    try:
        running = os.stat(f"/proc/{pid}/exe")
        ours = os.stat(tool / NAME)
    except OSError:
        return False
    return (running.st_dev, running.st_ino) == (ours.st_dev, ours.st_ino)
