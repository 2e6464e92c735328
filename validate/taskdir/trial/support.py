"""What a profile can run of a Harbor task: the one rule the freeze (`validate.taskdir.images.frozen`,
which records a refusal instead of building) and the trial kind (`validate.kinds.trial`, which
plays nothing it refuses) share. A task naming a prebuilt image (``[environment].docker_image``)
is not refused here: whether the profile's base-image map serves that reference is the image
build's answer (`validate.taskdir.images.build.image_task`), as for a Dockerfile's ``FROM``."""

from __future__ import annotations

from environment.harbor.taskdir import HarborTask
from validate.sandbox import capabilities_of


def unsupported(task: HarborTask, backend: str, verifier_mode: str | None = None) -> str | None:
    """Why this profile (its backend's declared `Capabilities`, the contract's verifier
    mode) cannot run `task`, or None."""
    caps = capabilities_of(backend)
    if caps.trials is None:
        return f"the {backend} backend plays no task-directory trial (it declares none)"
    if task.steps:
        return f"a multi-step task ({len(task.steps)} steps): this harness runs one agent phase per trial"
    if task.verifier == "separate" and not caps.separate_verifier:
        return (
            f"a separate verifier environment: the {backend} profile verifies over the agent's own tree only"
        )
    if (
        task.verifier != "separate"
        and verifier_mode is not None
        and verifier_mode not in caps.verifier_modes()
    ):
        return f"the contract's {verifier_mode} verifier: the {backend} backend offers " \
               f"{', '.join(caps.verifier_modes()) or 'none'}"
    if task.verifier == "separate" and task.verifier_build not in ("dockerfile", "environment"):
        return (
            f"a separate verifier environment from {task.verifier_build}: this harness builds a verifier "
            "only from tests/Dockerfile or the task's own environment"
        )
    if task.verifier == "separate" and task.config.artifacts:
        return ("a separate verifier handed artifacts beyond /logs/artifacts: this harness hands it only "
                "that directory")
    if task.environment == "compose":
        return "environment/docker-compose.yaml: this harness runs one image per task"
    gpus = task.config.environment.gpus or 0
    if gpus > 0:
        types = ", ".join(task.config.environment.gpu_types or []) or "any type"
        return f"the task asks for {gpus} GPU(s) ({types}); this profile has none"
    return None
