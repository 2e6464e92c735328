"""What a profile can run of a Harbor task: the one rule the freeze (`validate.taskdir.images.frozen`,
which records a refusal instead of building) and the trial kind (`validate.kinds.trial`, which
plays nothing it refuses) share. A task naming a prebuilt image (``[environment].docker_image``)
is not refused here: whether the profile's base-image map serves that reference is the image
build's answer (`validate.taskdir.images.build.image_task`), as for a Dockerfile's ``FROM``."""

from __future__ import annotations

from environment.harbor.taskdir import HarborTask


def unsupported(task: HarborTask, backend: str) -> str | None:
    """Why this profile cannot run `task`, or None."""
    if backend not in ("docker", "podman", "bwrap"):
        return f"task-directory trials run on the docker, podman and bwrap backends only; this contract's is {backend}"
    if task.steps:
        return f"a multi-step task ({len(task.steps)} steps): this harness runs one agent phase per trial"
    if task.verifier == "separate" and backend == "bwrap":
        return "a separate verifier environment: the bwrap profile verifies over the agent's own tree only"
    if task.verifier == "separate" and task.verifier_build not in ("dockerfile", "environment"):
        return f"a separate verifier environment from {task.verifier_build}: this harness builds a verifier only " \
               f"from tests/Dockerfile or the task's own environment"
    if task.verifier == "separate" and task.config.artifacts:
        return "a separate verifier handed artifacts beyond /logs/artifacts: this harness hands it only that directory"
    if task.environment == "compose":
        return "environment/docker-compose.yaml: this harness runs one image per task"
    gpus = task.config.environment.gpus or 0
    if gpus > 0:
        types = ", ".join(task.config.environment.gpu_types or []) or "any type"
        return f"the task asks for {gpus} GPU(s) ({types}); this profile has none"
    return None
