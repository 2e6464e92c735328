"""The sandbox seam for task-directory trials: a backend says what it offers
(`validate.sandbox.base.Capabilities`) and the harness asks that, never its name. A toy
backend defined here — one class, registered in this process, no harness file touched — that
speaks the Docker API of the suite's own dockerd and declares ``trials="engine"`` is refused
nothing, gets its task images from the engine it names, and plays real trials (the oracle
passes, nop does not) through the same call the trial kind makes; what it does not declare
(a shared verifier) is refused by name."""

from __future__ import annotations

import docker
import pytest

from environment.harbor.taskdir import load_task
from tests import test_trial
from tests.test_trial import IMAGE_LABEL, LIMITS, RUN_LABEL, _left_behind, sum_task
from validate.core.errors import ProfileUnavailable, SandboxError
from validate.sandbox import BACKENDS, capabilities_of
from validate.sandbox.base import BackendFacts, Capabilities, Limits, RunRequest, Sandbox
from validate.taskdir.images.docker import DockerImages, images_for
from validate.taskdir.trial.agents import plan
from validate.taskdir.trial.players import TrialRequest, play
from validate.taskdir.trial.support import unsupported

#: test_trial's client fixture, shared: pytest finds it by this module-level name (bound by
#: assignment: ruff reads a test's parameter named like an imported fixture as a redefinition).
client = test_trial.client

pytestmark = pytest.mark.docker


class ToyEngine(Sandbox):
    """Trials only, through any Docker-API engine; one-shot programs it refuses."""

    backend = "toy-engine"
    isolates_network = True
    capabilities = Capabilities(trials="engine", images="docker", trusted_verifier=True)

    def __init__(self, image: str = "", run_label: str = "toy") -> None:
        self.image, self.run_label = image, run_label
        self.client = docker.from_env(timeout=120)

    def facts(self) -> BackendFacts:
        raise ProfileUnavailable("toy-engine: no facts of its own")

    def run(self, request: RunRequest):
        raise SandboxError("toy-engine: plays task-directory trials only")


@pytest.fixture(scope="module", autouse=True)
def _registered():
    """The toy is registered for this module only: other tests list the installed backends."""
    BACKENDS.register(ToyEngine)
    yield
    BACKENDS.unregister(ToyEngine)


@pytest.fixture(scope="module")
def sound(tmp_path_factory, client):
    root = tmp_path_factory.mktemp("toy")
    task_dir = sum_task(root, "sound")
    image, _ = client.images.build(path=str(task_dir / "environment"), labels={IMAGE_LABEL: "1"},
                                   network_mode="none", rm=True, forcerm=True)
    return load_task(root, "sound"), task_dir, image.id


def test_a_backend_is_asked_what_it_offers_never_its_name(sound):
    task, _, _ = sound
    assert capabilities_of("toy-engine").verifier_modes() == ["trusted"]
    assert unsupported(task, "toy-engine", "trusted") is None
    assert unsupported(task, "toy-engine", "shared") == \
        "the contract's shared verifier: the toy-engine backend offers trusted"
    assert type(images_for("toy-engine")) is DockerImages
    # the backends this project ships declare what they play; the others play nothing
    assert capabilities_of("subprocess").trials is None
    assert (
        unsupported(task, "subprocess")
        == "the subprocess backend plays no task-directory trial (it declares none)"
    )


@pytest.mark.parametrize("agent,reward", [("oracle", 1.0), ("nop", 0.0)])
def test_the_toy_backend_plays_a_trial_through_the_seam(client, sound, agent, reward):
    task, task_dir, image = sound
    toy = ToyEngine()
    r = play(toy, images_for("toy-engine").client, TrialRequest(
        task=task, task_dir=task_dir, image=image, agent=agent, plan=plan(agent, task, task_dir),
        limits=LIMITS, contract=Limits(), run_label=RUN_LABEL))
    assert (r.status, r.reward, r.verifier_mode) == ("ok", reward, "trusted"), (r.infrastructure_error,
                                                                                r.agent_run)
    assert r.cleanup_errors == [] and _left_behind(client) == []


def test_a_backend_that_plays_no_trial_is_refused_by_the_seam(sound):
    task, task_dir, image = sound

    class NoTrials(ToyEngine):
        backend = "toy-no-trials"
        capabilities = Capabilities()

    with pytest.raises(ProfileUnavailable, match="toy-no-trials backend plays no task-directory trial"):
        play(NoTrials(), None, TrialRequest(task=task, task_dir=task_dir, image=image, agent="nop",
                                            plan=plan("nop", task, task_dir), limits=LIMITS,
                                            contract=Limits(), run_label=RUN_LABEL))
