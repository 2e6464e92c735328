"""The linters in the build: ruff and mypy over the tree, as pyproject configures them.

Both run from the interpreter's own environment (the test extra installs them, so a missing one
is a broken install, not a skip), each in a process of its own from the checkout's root, where
they read pyproject.toml. A failure prints what the tool said.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The venv's scripts directory: the tools installed beside the interpreter running the suite.
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    exe = BIN / tool
    assert exe.is_file(), f"{exe}: not installed (pip install -e '.[test]' installs it)"
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    r = _run("ruff", "check", "--no-cache", ".")
    assert r.returncode == 0, f"ruff check (exit {r.returncode}):\n{r.stdout}{r.stderr}"


def test_mypy_finds_nothing():
    # Its files and options are pyproject's; the cache is mypy's own (.mypy_cache, ignored by git).
    r = _run("mypy")
    assert r.returncode == 0, f"mypy (exit {r.returncode}):\n{r.stdout}{r.stderr}"


def test_the_mypy_ratchet_names_only_modules_that_exist():
    """pyproject's list of modules not yet type-clean holds only real modules (a moved or
    deleted one must leave it, or it would exempt whatever later takes its name)."""
    import importlib.util
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    overrides = config["tool"]["mypy"].get("overrides", [])
    listed = [m for o in overrides if o.get("ignore_errors") for m in o["module"]]
    assert listed == sorted(listed) and len(listed) == len(set(listed)), "keep the list sorted, once each"
    assert [m for m in listed if importlib.util.find_spec(m) is None] == []
