"""The README says what each agent tests: every agent an installed environment of this
project declares is named there, with its role."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from validate.core import environments

README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", ["deshuffle-papers", "twohop-env", "curator"])
def test_every_agent_is_in_the_readme(name):
    env = environments.get(name)
    for agent in env.agents(env.Config()):
        assert f"`{agent.name}`" in README, f"README.md does not say what {name}'s {agent.name} tests"


def test_the_readme_opens_with_exactly_two_commands():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    assert len([line for line in block.splitlines() if line.strip()]) == 2
