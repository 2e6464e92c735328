"""twohop-env as the harness finds it: the registered entry point, the seam's defaults, and a
real wheel that ships the agent programs."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from environment.protocol import Environment
from environment.twohop import TwohopConfig, TwohopEnvironment

ROOT = Path(__file__).resolve().parents[1]


def test_the_entry_point_names_the_environment_and_builds_with_no_arguments():
    (ep,) = [e for e in entry_points(group="validate.environments") if e.name == "twohop-env"]
    env = ep.load()()
    assert isinstance(env, Environment) and type(env) is TwohopEnvironment
    assert env.name == "twohop-env" and env.Config is TwohopConfig
    taskset = env.load(env.Config())
    assert taskset.size == 36


def test_the_config_is_small_versioned_and_documented():
    fields = TwohopConfig.model_fields
    assert set(fields) == {"schema_version", "seed"}
    assert all(f.description for f in fields.values())
    assert TwohopConfig().model_dump() == {"schema_version": 1, "seed": 0}
    assert TwohopConfig().digest != TwohopConfig(seed=1).digest


def test_the_scorer_is_deterministic_binary_and_exact():
    spec = TwohopEnvironment().scorer(TwohopConfig())
    assert spec.deterministic and spec.pass_threshold == 1.0 and spec.smoke_tolerance == 0.0


def test_the_source_tree_is_the_package_and_holds_the_agents():
    src = TwohopEnvironment().source_dir()
    assert src == ROOT / "environment" / "twohop"
    assert (src / "agents" / "source_peek.py").is_file() and (src / "dataset.py").is_file()


def test_the_stdlib_core_imports_without_third_party_packages():
    """source-peek rebuilds the dataset inside a sandbox that has only the stdlib."""
    code = ("import sys, types; "
            "[sys.modules.__setitem__(n, m) for n, m in ((n, types.ModuleType(n)) for n in "
            "('environment', 'environment.twohop'))]; "
            f"sys.modules['environment'].__path__ = []; sys.modules['environment.twohop'].__path__ = "
            f"[{str(ROOT / 'environment' / 'twohop')!r}]; "
            "import environment.twohop.dataset as d; print(d.build_dataset(0).revision); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pandas', 'numpy')))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         check=True).stdout
    revision, third_party = out.splitlines()
    assert revision == TwohopEnvironment().load(TwohopConfig()).revision and third_party == "[]"


@pytest.mark.slow
def test_a_built_wheel_ships_the_agents_and_the_entry_point(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (eps,) = [n for n in names if n.endswith("entry_points.txt")]
        entry_text = z.read(eps).decode()
    programs = {p.name for p in (ROOT / "environment" / "twohop" / "agents").glob("*.py")}
    assert {f"environment/twohop/agents/{p}" for p in programs} <= names
    assert len(programs) == 9
    assert "twohop-env = environment.twohop.env:TwohopEnvironment" in entry_text
