"""`validate.sandbox.storage`: per-attempt tmpfs storage, its caps, its sweep, and the tree
remover, on real mounts (the sandboxes' own use of it is in tests/test_sandbox.py)."""

from __future__ import annotations

import errno
import gc
import os
import stat
from pathlib import Path

import pytest

from validate.core.errors import SandboxError
from validate.core.paths import RunPaths
from validate.sandbox import Limits
from validate.sandbox.storage import attempt_storage, mount_tmpfs, remove_tree, sweep


def mounted(path) -> bool:
    target = os.fsencode(os.path.realpath(path))
    with open("/proc/self/mountinfo", "rb") as fh:
        return any(line.split()[4] == target for line in fh)


def test_a_fresh_tmpfs_with_its_caps_is_mounted_then_removed(tmp_path):
    with attempt_storage("run-a", "t0-oracle-1", Limits(storage_mb=8, storage_inodes=64),
                         parent=tmp_path) as root:
        assert root == tmp_path / "run-a" / "t0-oracle-1" and mounted(root)
        st, vfs = os.stat(root), os.statvfs(root)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o700, 0, 0)
        assert (vfs.f_blocks * vfs.f_frsize, vfs.f_files) == (8 << 20, 64)
        assert vfs.f_flag & os.ST_NOSUID and vfs.f_flag & os.ST_NODEV and vfs.f_flag & os.ST_NOEXEC
        assert stat.S_IMODE(os.stat(tmp_path / "run-a").st_mode) == 0o711
        (root / "workspace").mkdir()
        (root / "workspace" / "reply.txt").write_text("x")
    assert not mounted(root) and not root.exists()


def test_a_group_may_traverse_the_root(tmp_path):
    with attempt_storage("run-a", "t1", Limits(storage_mb=1), gid=65534, parent=tmp_path) as root:
        st = os.stat(root)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o710, 0, 65534)


def test_bytes_and_inodes_are_capped_whatever_the_file_sizes(tmp_path):
    with attempt_storage("run-b", "bytes", Limits(storage_mb=4, storage_inodes=1000),
                         parent=tmp_path) as root:
        written = 0
        with pytest.raises(OSError) as full:
            for i in range(100):
                (root / f"f{i}").write_bytes(b"\0" * (256 << 10))  # each far under any file-size cap
                written += 256 << 10
        assert full.value.errno == errno.ENOSPC and 3 << 20 <= written <= 4 << 20
    with attempt_storage("run-b", "inodes", Limits(storage_mb=4, storage_inodes=50), parent=tmp_path) as root:
        with pytest.raises(OSError) as full:
            for i in range(1000):
                (root / f"f{i}").touch()
        assert full.value.errno == errno.ENOSPC and 45 <= i < 50


def test_sweep_removes_what_a_killed_run_left_and_nothing_of_another_run(tmp_path):
    limits = Limits(storage_mb=1)
    for name in ("a1", "a2"):  # as a killed run leaves them: mounted, full of files
        target = tmp_path / "killed" / name
        target.mkdir(parents=True)
        mount_tmpfs(target, limits)
        (target / "workspace").mkdir()
        (target / "workspace" / "answer.json").write_text("{}")
    (tmp_path / "killed" / "stray").mkdir()  # not a mount: removed all the same
    (tmp_path / "killed" / "stray" / "file").write_text("x")
    with attempt_storage("other", "live", limits, parent=tmp_path) as live:
        assert sweep(tmp_path, "killed") == ["a1", "a2", "stray"]
        assert not (tmp_path / "killed").exists() and mounted(live)
    assert sweep(tmp_path, "killed") == []


def test_names_must_be_plain_and_unique(tmp_path):
    for bad in ("../x", "a/b", ".", ""):
        with pytest.raises(ValueError, match="attempt name"):
            with attempt_storage("run", bad, Limits(), parent=tmp_path):
                pass
    with attempt_storage("run", "same", Limits(storage_mb=1), parent=tmp_path):
        with pytest.raises(SandboxError, match="already exists"):
            with attempt_storage("run", "same", Limits(storage_mb=1), parent=tmp_path):
                pass


def test_a_5000_deep_tree_is_removed_without_recursion_and_symlinks_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("host file")
    top = tmp_path / "tree"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for depth in range(5000):  # deeper than PATH_MAX allows as one path: fd-relative only
        os.mkdir("d", dir_fd=fd)
        if depth % 1000 == 0:
            os.symlink(str(outside), "link", dir_fd=fd)
            os.close(os.open("file", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    gc.collect()  # a finalizer left by an earlier test must not close an fd mid-count
    fds_before = set(os.listdir("/proc/self/fd"))
    remove_tree(top)
    assert not top.exists()
    assert (outside / "keep").read_text() == "host file"
    assert set(os.listdir("/proc/self/fd")) - fds_before == set()  # no fd left open by the walk
    link = tmp_path / "top-link"
    link.symlink_to(outside)
    remove_tree(link)  # a symlink given as the top is removed, not followed
    assert not link.is_symlink() and (outside / "keep").exists()


def test_two_runs_of_one_name_in_two_places_get_two_sandbox_labels(tmp_path, monkeypatch):
    """Opening a sandbox sweeps what its label left: runs named alike must not share a label,
    while a resume of one run (its directory, however it is named) finds its own again."""
    a, b = RunPaths(tmp_path / "a" / "run"), RunPaths(tmp_path / "b" / "run")
    assert a.sandbox_label != b.sandbox_label
    assert a.sandbox_label.startswith("run.") and b.sandbox_label.startswith("run.")
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert RunPaths(Path("run")).sandbox_label == a.sandbox_label
    for label in (a.sandbox_label, RunPaths(tmp_path / ("x" * 250)).sandbox_label):
        assert sweep(tmp_path, label) == []  # a plain name the storage accepts (else ValueError)


@pytest.mark.parametrize("when", ["mounting", "unmounting"])
def test_an_interrupt_while_storage_is_set_up_or_released_is_held_until_it_is_gone(tmp_path, monkeypatch,
                                                                                   when):
    """A Ctrl-C, or a cancelled Ray task (Ray raises its KeyboardInterrupt as a SIGINT in the
    worker's main thread), that lands while the tmpfs is mounted or released is raised only once
    nothing is left: landing between the unmount and the removal used to leave a mount point."""
    import _thread

    from validate.sandbox import storage

    name = f"t0-{when}"
    real = storage.mount_tmpfs if when == "mounting" else storage.unmount

    def interrupted(*args, **kwargs):
        result = real(*args, **kwargs)
        _thread.interrupt_main()  # as Ray's cancel does; Python raises it at its next check
        return result

    monkeypatch.setattr(storage, "mount_tmpfs" if when == "mounting" else "unmount", interrupted)
    ran = []
    with pytest.raises(KeyboardInterrupt):
        with attempt_storage("run", name, Limits(), parent=tmp_path) as root:
            ran.append(mounted(root))
    # Held while mounting, it is raised before the attempt starts; while releasing, after it.
    assert ran == ([] if when == "mounting" else [True])
    assert not mounted(tmp_path / "run" / name) and not (tmp_path / "run" / name).exists()
