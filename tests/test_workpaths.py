"""The trusted verifier's rule and its layer surgery, without a container: what is the agent's
work (`workpaths`), and a writable layer made to hold only that (`layers.revert`) — walked
from the top whatever a listing said, put back without following a link the verifier made."""

from __future__ import annotations

import os
import time
from pathlib import Path

from validate.sandbox.storage import remove_tree
from validate.taskdir.trial import layers, workpaths
from validate.taskdir.trial.workpaths import plan, protected, work_paths


def d(*changes: tuple[str, int]) -> list[dict]:
    return [{"Path": p, "Kind": k} for p, k in changes]


def test_the_named_paths_carry_only_what_the_agent_added():
    w = work_paths("/app", [], ["/opt/venv/bin/activate", "/srv/out.txt", "/usr/bin/python3", "/app/x"])
    assert (w.full, w.named) == (("/app", "/logs/artifacts"), ("/opt/venv/bin/activate", "/srv/out.txt"))
    p = plan(d(("/opt/venv/bin/activate", 0), ("/srv/out.txt", 1), ("/usr/bin/python3", 0)), w)
    assert p.copy == ("/srv/out.txt",)  # the image's own script the tests source never changes for them
    assert [c.path for c in p.outside] == ["/opt/venv/bin/activate", "/usr/bin/python3"]


def test_start_up_files_and_version_control_configuration_are_never_the_agents_work():
    for path in ("/root/.bashrc", "/app/.git/config", "/app/.git/hooks/pre-commit", "/home/u/.gitconfig",
                 "/app/.npmrc", "/app/sub/.ssh/authorized_keys",
                 "/root/.local/lib/python3.11/site-packages/x.pth"):
        assert protected(path), path
    for path in ("/app/.git/HEAD", "/app/.git/objects/ab/cd", "/app/config", "/app/hooks.py",
                 "/app/.github/x"):
        assert not protected(path), path
    w = work_paths("/root", [], [])
    p = plan(d(("/root", 0), ("/root/repo", 1), ("/root/repo/.git", 1), ("/root/repo/.git/config", 1),
               ("/root/repo/.git/HEAD", 1), ("/root/repo/a.py", 1), ("/root/.gitconfig", 1)), w)
    # the repository is carried entry by entry around its configuration, never through it
    assert p.copy == ("/root/repo/.git/HEAD", "/root/repo/a.py")
    assert [c.path for c in p.outside] == ["/root/.gitconfig", "/root/repo/.git/config"]


def test_a_subtree_is_carried_from_its_topmost_path_in_tree_order():
    """'/app/a.txt' sorts between '/app/a' and '/app/a/b' as text: the plan must not carry
    '/app/a/b' again, nor miss it."""
    p = plan(d(("/app", 0), ("/app/a", 1), ("/app/a.txt", 1), ("/app/a/b", 1), ("/app/old", 2), ("/app/c", 0),
               ("/app/c/f", 0)), work_paths("/app", [], []))
    assert (p.copy, p.delete) == (("/app/a", "/app/a.txt", "/app/c/f"), ("/app/old",))


def test_the_plan_takes_n_log_n_not_n_squared():
    many = [("/app/out", 1)] + [(f"/app/out/{i:06d}", 1) for i in range(60_000)] + [("/usr/bin/x", 0)]
    t0 = time.monotonic()
    p = plan(d(*many), work_paths("/app", [], []))
    assert p.copy == ("/app/out",) and time.monotonic() - t0 < 10


def _layer(tmp_path: Path) -> Path:
    upper = tmp_path / "diff"
    for rel in ("app/sum.txt", "app/notes.txt", "usr/bin/python3", "00000/x", "zz/y"):
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        (upper / rel).write_text(rel)
    (tmp_path / "stash").mkdir()
    return upper


def test_revert_walks_the_layer_whatever_a_listing_said(tmp_path):
    upper = _layer(tmp_path)
    done = layers.revert(upper, tmp_path / "stash", ("/app/sum.txt",), ["/app"])
    # only the carried path is left (the others moved aside, though nothing listed them)
    assert sorted(str(p.relative_to(upper)) for p in upper.rglob("*")) == ["app", "app/sum.txt"]
    assert sorted(rel for rel, _ in done.moved) == ["00000", "app/notes.txt", "usr", "zz"]
    assert done.restore() is True
    assert sorted(str(p.relative_to(upper)) for p in upper.rglob("*") if p.is_file()) == \
        ["00000/x", "app/notes.txt", "app/sum.txt", "usr/bin/python3", "zz/y"]


def test_restore_follows_no_link_the_verifier_made(tmp_path):
    upper = _layer(tmp_path)
    done = layers.revert(upper, tmp_path / "stash", ("/app/sum.txt",), ["/app"])
    outside = tmp_path / "host"
    outside.mkdir()
    (upper / "app").rename(tmp_path / "was-app")
    os.symlink(outside, upper / "app")  # what a hostile verifier could leave where /app was
    os.symlink(outside, upper / "usr")  # and where a moved entry goes back: replaced, not entered
    assert done.restore() is False
    assert list(outside.iterdir()) == []  # nothing was made through either link
    assert (upper / "usr" / "bin" / "python3").is_file() and not (upper / "usr").is_symlink()
    assert (upper / "zz" / "y").is_file() and (upper / "00000" / "x").is_file()  # the rest went back


def test_a_deep_chain_is_read_without_recursion(tmp_path):
    from validate.taskdir.trial import roots

    (tmp_path / "logs" / "verifier").mkdir(parents=True)
    fd = os.open(tmp_path / "logs" / "verifier", os.O_RDONLY)
    for _ in range(1500):  # deeper than a path can be spelled: made a level at a time
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    try:
        tree = roots.read_host_tree(tmp_path, "logs/verifier", 16, 1 << 20)
        assert tree.truncated and len(tree.entries) > 10
    finally:  # pytest's own clean-up of old directories recurses: the chain goes now
        remove_tree(tmp_path / "logs")
    assert not (tmp_path / "logs").exists()


def test_the_rule_is_recorded_by_version():
    assert workpaths.RULE == "work-paths/2"
