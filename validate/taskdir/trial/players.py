"""How a backend plays a task directory's trial, by what it declares (`Capabilities.trials`),
never by its name: the seam between the trial kind (`validate.kinds.trial`) and the backends.

- ``engine``: containers of the task's own image, through the Docker API the backend's
  ``client`` speaks (docker's daemon, podman's rootless service): `validate.taskdir.trial.run`.
- ``overlay``: the image (built by the backend's image engine) unpacked and played under
  overlays of the backend's own sandboxes: `validate.taskdir.trial.bwrap`.

A new backend that speaks the Docker API declares ``trials="engine"`` and is played here with
no other file touched; a new way of playing is one function and its line in `PLAYERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from environment.harbor.taskdir import HarborTask
from validate.core.errors import ProfileUnavailable
from validate.sandbox.base import Limits, Sandbox
from validate.taskdir.trial import bwrap
from validate.taskdir.trial.agents import AgentPlan
from validate.taskdir.trial.result import TrialLimits, TrialResult
from validate.taskdir.trial.run import run_trial


@dataclass(frozen=True)
class TrialRequest:
    """One trial, whatever plays it: the task (its files in `task_dir`), the image its
    engine holds, the agent and its plan, the caps, and how the reward is read."""

    task: HarborTask
    task_dir: Path
    image: str
    agent: str
    plan: AgentPlan
    limits: TrialLimits
    #: The contract's limits beyond `limits` (file size, storage) where the player sets them itself.
    contract: Limits
    run_label: str
    reward_key: str = "reward"
    #: An image with python3 the trial's resolver runs from (the harness's sandbox image).
    resolver_image: str | None = None
    #: A separate verifier's image.
    verifier_image: str | None = None
    #: The oracle's pass threshold: a trusted verifier under it is replayed in the agent's layer.
    replay_below: float | None = None


#: A player: the backend (open), the image engine's Docker client, the request.
Player = Callable[[Sandbox, object, TrialRequest], TrialResult]


def _engine(sandbox: Sandbox, images_client, r: TrialRequest) -> TrialResult:
    client = getattr(sandbox, "client")  # noqa: B009 - Sandbox declares none: an "engine" backend has one
    return run_trial(client, r.task, r.task_dir, r.image, r.agent, r.limits,
                     run_label=r.run_label, resolver_image=r.resolver_image, verifier_image=r.verifier_image,
                     reward_key=r.reward_key, plan=r.plan, replay_below=r.replay_below)


def _overlay(sandbox: Sandbox, images_client, r: TrialRequest) -> TrialResult:
    return bwrap.run_trial(sandbox, images_client, r.task, r.task_dir, r.image, r.agent, r.limits, r.contract,
                           reward_key=r.reward_key, plan=r.plan, replay_below=r.replay_below)


PLAYERS: dict[str, Player] = {"engine": _engine, "overlay": _overlay}


def play(sandbox: Sandbox, images_client, request: TrialRequest) -> TrialResult:
    """`request` played as `sandbox` declares it plays trials; `ProfileUnavailable` for a
    backend that plays none (the freeze and the kind refuse its tasks before: `support`)."""
    how = type(sandbox).capabilities.trials
    player = PLAYERS.get(how or "")
    if player is None:
        raise ProfileUnavailable(f"the {sandbox.backend} backend plays no task-directory trial "
                                 f"(it declares trials={how!r}; players: {', '.join(sorted(PLAYERS))})")
    return player(sandbox, images_client, request)
