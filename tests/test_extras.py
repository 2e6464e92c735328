"""The core install runs every phase; a command that needs an extra says which one."""

from __future__ import annotations

import importlib.util
import sys
import tomllib

import pytest

from environment.deshuffle import CorpusError
from environment.deshuffle.hub import load_hub
from tests.conftest import ROOT
from validate.core.errors import ValidateError


def test_the_core_is_lean():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0].strip().lower() for d in project["dependencies"]}
    assert core == {"pydantic", "pandas", "numpy", "pyarrow", "docker", "requests", "tenacity", "rich"}
    assert {"smoke", "hub", "test"} <= set(project["optional-dependencies"])
    assert not any("matplotlib" in d for d in project["dependencies"])


def test_the_hub_corpus_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(CorpusError, match=r"\[hub\] extra"):
        load_hub()


def test_the_smoke_test_names_its_extra(monkeypatch, tmp_path):
    from validate.run import smoke

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "build"
                        else real(name, *a))
    with pytest.raises(ValidateError, match=r"\[smoke\] extra"):
        smoke.build_and_install(tmp_path, print)
