"""A task image as an unpacked root tree for the bwrap trial (`validate.taskdir.trial.bwrap`), and the
harness's file operations inside such a tree, which never follow a link the tree holds.

**The tree.** The task image (built by the task-image builder, `validate.taskdir.images`) is
exported once per image (``docker export`` of a container that never starts) and unpacked
by an *unprivileged* ``tar`` (uid `TREE_UID`, through ``setpriv``), as an unprivileged user
unpacks an Apptainer sandbox directory: every file belongs to that user, no set-id bit means
anything (every process runs with no_new_privs), device nodes are not made (the sandbox gets
its own ``/dev``). The image's root is that user, never the host's root. Trees live under
`tree_store` by the image's id (content-addressed, so a second run reuses them; made in a
temporary directory and renamed, so two sessions never see half a tree), with the image's
``Env``, ``WorkingDir`` and ``User`` beside them (``config.json``). Nothing here removes a tree: one
per image id, as a daemon keeps images (a daemon that rebuilds makes new ids, so new trees;
the tests remove the trees of the images they built).

**Safe operations.** After the image, the tree's content is the agent's (the verifier runs
over it). Every path the harness writes or reads in it is walked one component at a time
from a directory descriptor with ``O_NOFOLLOW``: a link the agent (or the image) left where
the harness expected a directory is removed and replaced by a directory when writing, and
read as a link when reading (`read_tree`, the same `Tree` the docker trial reads).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from validate.core.errors import SandboxError
from validate.core.paths import AGENT_UID, task_image_store
from validate.sandbox.docker.wire import LABEL
from validate.sandbox.storage import remove_tree
from validate.taskdir.trial.docker import Tree, read_host_tree

#: Who owns every file of an unpacked tree, and whom every process of the sandbox runs as.
TREE_UID = AGENT_UID
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_UNPACK_TIMEOUT_S = 900
_LOCK = threading.Lock()
_UNPACKING: dict[str, threading.Lock] = {}


def tree_store() -> Path:
    """Where unpacked trees live: beside the task images, one directory per image id."""
    return task_image_store().parent / "task-roots"


@dataclass(frozen=True)
class TaskRoot:
    """An unpacked task image: its tree (read-only to trials: each runs on an overlay of it)
    and the image's configuration."""

    image_id: str
    root: Path
    env: dict[str, str]
    workdir: str | None
    user: str | None


def task_root(docker_client, image_id: str) -> TaskRoot:
    """The unpacked tree of `image_id` (exported from `docker_client`'s daemon on first use;
    trials of one image in several threads wait for the one unpack)."""
    final = tree_store() / image_id.removeprefix("sha256:")
    with _LOCK:
        lock = _UNPACKING.setdefault(final.name, threading.Lock())
    with lock:
        if not (final / "config.json").is_file():
            _unpack(docker_client, image_id, final)
    config = json.loads((final / "config.json").read_text())
    return TaskRoot(image_id=image_id, root=final / "root", env=config["env"], workdir=config["workdir"],
                    user=config["user"])


def _unpack(client, image_id: str, final: Path) -> None:
    api = client.api
    try:
        config = api.inspect_image(image_id).get("Config") or {}
    except Exception as e:  # noqa: BLE001 - the docker SDK's errors and the transport's
        raise SandboxError(f"task root: cannot inspect {image_id[:19]}: {e}") from None
    store = final.parent
    store.mkdir(mode=0o755, parents=True, exist_ok=True)
    # Another process may unpack the same image meanwhile: its own temporary name, one rename wins.
    tmp = store / f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    remove_tree(tmp)
    (tmp / "root").mkdir(parents=True, mode=0o755)
    os.chown(tmp / "root", TREE_UID, TREE_UID)
    try:
        _export_into(api, image_id, tmp / "root")
        env = dict(line.split("=", 1) for line in config.get("Env") or [] if "=" in line)
        (tmp / "config.json").write_text(json.dumps({"env": env, "workdir": config.get("WorkingDir") or None,
                                                     "user": config.get("User") or None}, sort_keys=True))
        try:
            tmp.rename(final)
        except OSError:
            if not (final / "config.json").is_file():  # not another session's finished tree
                raise
    finally:
        remove_tree(tmp)


def _export_into(api, image_id: str, dest: Path) -> None:
    """Stream the image's flattened filesystem into an unprivileged tar extracting at `dest`."""
    cid = api.create_container(image_id, command=["true"], entrypoint=[], network_disabled=True,
                               labels={LABEL: "task-root-export"})["Id"]
    # tar's complaints go to a file, never a pipe: a pipe nobody drains while the export is
    # written would stop tar, and the export with it.
    errors = tempfile.TemporaryFile()
    tar = subprocess.Popen(["setpriv", f"--reuid={TREE_UID}", f"--regid={TREE_UID}", "--clear-groups",
                            "--inh-caps=-all", "--no-new-privs", "tar", "-x", "-p", "-f", "-", "-C",
                            str(dest), "--no-same-owner", "--exclude=dev/*"],
                           stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors)
    tail = lambda: (errors.seek(0), errors.read().decode(errors="replace")[-500:])[1]  # noqa: E731
    try:
        assert tar.stdin is not None  # opened with stdin=PIPE
        for chunk in api.export(cid):
            tar.stdin.write(chunk)
        tar.stdin.close()
        if tar.wait(timeout=_UNPACK_TIMEOUT_S) != 0:
            raise SandboxError(f"task root: unpacking {image_id[:19]} failed: {tail()}")
    except BrokenPipeError:
        raise SandboxError(
            f"task root: tar stopped reading the export of {image_id[:19]}: {tail()}"
        ) from None
    finally:
        if tar.poll() is None:
            tar.kill()
            tar.wait()
        errors.close()
        try:
            api.remove_container(cid, force=True)
        except Exception:  # noqa: BLE001, S110 - the export's container is labelled; a sweep finds it
            pass


# --- operations inside a tree the agent has had ------------------------------------------


def _open_dir(root_fd: int, parts: list[str], make: bool) -> int:
    """A descriptor of the directory `parts` below `root_fd`, never through a link. With
    `make`, a missing component or one that is not a directory becomes a fresh directory
    (owned by `TREE_UID`); without, `FileNotFoundError`/`NotADirectoryError`."""
    fd = os.dup(root_fd)
    try:
        for name in parts:
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except OSError as e:
                if not make or e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    raise
                _unlink_any(fd, name)
                os.mkdir(name, 0o755, dir_fd=fd)
                os.chown(name, TREE_UID, TREE_UID, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _unlink_any(dir_fd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(name)
    os.unlink(name, dir_fd=dir_fd)


def put_entries(root: Path, entries: list[tuple[str, int, bytes | None]]) -> None:
    """Write tar-style entries (relative path, mode, bytes or None for a directory) into the
    tree at `root`, owned by `TREE_UID`; a link or file in the way is replaced, never followed."""
    root_fd = os.open(root, _DIR)
    try:
        for path, mode, data in entries:
            parts = [p for p in path.split("/") if p not in ("", ".")]
            if data is None:
                fd = _open_dir(root_fd, parts, make=True)
                os.fchmod(fd, mode)
                os.close(fd)
                continue
            fd = _open_dir(root_fd, parts[:-1], make=True)
            try:
                _unlink_any(fd, parts[-1])
                out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                              mode, dir_fd=fd)
                with os.fdopen(out, "wb") as f:
                    f.write(data)
                    os.fchmod(f.fileno(), mode)
                    os.fchown(f.fileno(), TREE_UID, TREE_UID)
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)


def ensure_dir(root: Path, path: str) -> None:
    """Make `path` below `root` a directory if it is not one (its mode kept if it is)."""
    root_fd = os.open(root, _DIR)
    try:
        os.close(_open_dir(root_fd, [p for p in path.split("/") if p], make=True))
    finally:
        os.close(root_fd)


def fresh_dir(root: Path, path: str) -> None:
    """Make `path` below `root` an empty directory of `TREE_UID` (a mount point for a fresh
    bind): whatever was there, a link, a file or a directory with content, is removed."""
    parts = [p for p in path.split("/") if p]
    root_fd = os.open(root, _DIR)
    try:
        fd = _open_dir(root_fd, parts[:-1], make=True)
    finally:
        os.close(root_fd)
    try:
        try:
            st = os.lstat(parts[-1], dir_fd=fd)
            if stat.S_ISDIR(st.st_mode):
                remove_tree(Path(f"/proc/self/fd/{fd}") / parts[-1])
            else:
                os.unlink(parts[-1], dir_fd=fd)
        except FileNotFoundError:
            pass
        os.mkdir(parts[-1], 0o777, dir_fd=fd)
        os.chown(parts[-1], TREE_UID, TREE_UID, dir_fd=fd, follow_symlinks=False)
        os.chmod(parts[-1], 0o777, dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)


def read_tree(root: Path, path: str, per_file: int, budget: int) -> Tree:
    """Every entry under `path` (relative to `root`), as `validate.taskdir.trial.docker.read_tree`
    reads a container's: links as links, regular files up to `per_file` bytes, the reading
    stopped after `budget` bytes (`Tree.truncated`); a missing path is an empty tree. Read as the
    harness reads its own host directories (`read_host_tree`): iteratively, one descriptor per
    level, however deep a chain the agent made."""
    return read_host_tree(root, path, per_file, budget)


