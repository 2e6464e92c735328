"""What one Harbor trial is given and what it gives back, as pydantic models.

`TrialLimits` is the execution profile's side of a trial: the caps a task's own ``task.toml``
limits are held under, and the defaults for what it leaves unsaid. `Applied` is what a trial
actually ran with (the task's wish, capped; recorded on the result so a reader sees both).
`TrialResult` is the outcome: one `status` and, when the verifier produced a usable reward,
the reward under the chosen key and every key it wrote.

Status, in the order a trial decides it (the first that holds wins):

- ``infrastructure_error``: docker failed the harness (a create, start, commit or archive
  call refused, the daemon unreachable, a container killed by someone other than the
  harness) — known from docker's own answers, never from anything the agent printed;
- ``task_error``: docker refused what the task's own ``task.toml`` asks for (an agent or
  verifier user its image does not have): neither phase's outcome can be trusted or blamed;
- ``verifier_error``: the verifier produced no usable reward (`VerifierError.kind`: a reward
  problem of `environment.harbor.reward`, ``missing_key``, ``timeout``, ``oom``, or
  ``not_regular`` when a reward file is a link or a directory) — never a pass, never a 0;
- ``agent_timeout`` / ``agent_oom``: the agent phase ran out of time or memory; the trial
  still verifies what the agent left (as Harbor does), so the reward is known too;
- ``ok``: both phases ran and the reward is usable (pass or fail is the reward's business).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from environment.harbor.reward import VerifierRecord
from environment.protocol import exact_reward
from validate.taskdir.trial.artifacts import Handed
from validate.taskdir.trial.network import Lookups
from validate.taskdir.trial.workpaths import Change

TrialStatus = Literal[
    "ok",
    "agent_timeout",
    "agent_oom",
    "verifier_error",
    "task_error",
    "infrastructure_error",
    "harness_error",
]
#: Where the verifier runs: ``trusted``, a fresh container of the task's pristine image with
#: only the agent's changes under its work paths (`validate.taskdir.trial.trusted`); ``shared``, the
#: agent's own container once every process of its phase is dead (Harbor's); ``separate``, the
#: task's own verifier environment, handed only ``/logs/artifacts``.
VerifierMode = Literal["trusted", "shared", "separate"]
VerifierErrorKind = Literal["missing", "empty", "too_large", "not_utf8", "unparsable", "non_numeric",
                            "non_finite", "out_of_range", "missing_key", "not_regular", "timeout", "oom",
                            "killed"]


class TrialLimits(BaseModel):
    """The profile's caps and defaults (a task asking for more gets the cap, recorded)."""

    model_config = ConfigDict(frozen=True)

    cpus: float = Field(default=2.0, gt=0)
    memory_mb: int = Field(default=2048, gt=0)
    pids: int = Field(default=512, gt=0)
    #: For a task whose ``[agent] timeout_sec`` is unset (Harbor's default is 600 s).
    agent_timeout_s: float = Field(default=600.0, gt=0)
    max_agent_timeout_s: float = Field(default=3600.0, gt=0)
    max_verifier_timeout_s: float = Field(default=1800.0, gt=0)
    #: Multiplies both of a task's timeouts before the caps (the profile's speed factor).
    timeout_multiplier: float = Field(default=1.0, gt=0)
    #: Bytes kept of each output (agent's, verifier's stdout and stderr).
    max_output_bytes: int = Field(default=64 * 1024, gt=0)
    #: Bytes streamed when listing a log directory (what an agent left, the verifier's files).
    max_listing_bytes: int = Field(default=64 * 2**20, gt=0)
    #: Bytes of the agent's /logs/artifacts handed to a separate verifier, at most.
    max_artifact_bytes: int = Field(default=64 * 2**20, gt=0)
    #: Where a verifier that does not run apart (a task without a separate verifier) runs:
    #: ``trusted`` (the default) or ``shared`` (Harbor's: not hack-resistant). `VerifierMode`.
    verifier_mode: Literal["trusted", "shared"] = "trusted"
    #: The trial's own host storage (its log directories, tests and uploads bound into a
    #: shared-mode container; the resolver's files): one capped tmpfs, in MiB and inodes.
    storage_mb: int = Field(default=128, ge=1)
    storage_inodes: int = Field(default=4096, ge=16)


class Applied(BaseModel):
    """What the trial ran with: the task's values capped by the profile, and the pins."""

    cpus: float
    memory_mb: int
    pids: int
    agent_timeout_s: float
    verifier_timeout_s: float
    agent_user: str | None
    verifier_user: str | None
    #: No network in either phase (at most the loopback of the trial's logging resolver).
    network: Literal["none"] = "none"
    #: Pinned for every phase so two runs of a trial differ only by what the task does.
    pinned_env: dict[str, str]


class PhaseRun(BaseModel):
    """One phase's command: its exit code (None when killed by the harness), its output."""

    exit_code: int | None = None
    timed_out: bool = False
    oom_killed: bool = False
    runtime_s: float = 0.0
    stdout: str = ""
    stderr: str = ""
    #: The output was longer than the profile's cap and was cut.
    truncated: bool = False


class LeftFile(BaseModel):
    """An entry found in ``/logs/verifier`` when the agent phase ended (the harness mounts a
    fresh, empty directory there for the verifier, so none of these can be read as a reward).
    A stale file baked into the image shows up here too."""

    model_config = ConfigDict(frozen=True)

    path: str
    kind: Literal["file", "dir", "symlink", "other"]
    size: int
    #: sha256 of the content read (regular files; None when the file was too large to read).
    sha256: str | None = None


class VerifierError(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: VerifierErrorKind
    file: str | None = None
    detail: str


class TrialResult(BaseModel):
    """One trial: an agent on one task image, verified through a channel it cannot touch."""

    task_id: str
    task_hash: str
    agent: str
    image: str
    status: TrialStatus
    #: The reward under `reward_key` (None unless the verifier produced a usable one).
    reward: float | None = None
    #: Its exact text where the float misreads it (`environment.harbor.reward.Reward.exact`).
    reward_decimal: str | None = None
    reward_key: str
    #: Every key of the reward the verifier wrote (reward.txt gives ``{"reward": x}``).
    rewards: dict[str, float] = Field(default_factory=dict)
    reward_source: Literal["reward.json", "reward.txt"] | None = None
    #: What was read where the verifier writes its reward (None: the verifier never ran to the
    #: end); kept whole as the attempt's reply, the audit reads the reward again from it.
    record: VerifierRecord | None = None
    verifier_error: VerifierError | None = None
    infrastructure_error: str | None = None
    task_error: str | None = None
    #: The harness could not show that the verifier's processes were the verifier's alone (a
    #: process it did not start, PID 1 no longer its program): the attempt's result is void.
    harness_error: str | None = None
    #: Where the verifier ran (`VerifierMode`).
    verifier_mode: VerifierMode = "shared"
    #: Trusted mode: the task's work paths (`validate.taskdir.trial.workpaths.RULE`), the subtrees of the
    #: agent's container carried into the verifier's (at most `trusted.MAX_LISTED`; the count
    #: whole), the devices, fifos and sockets left out, and the agent's changes outside the work
    #: paths (the daemon's diff; listed up to the same cap, the count whole).
    work_paths: list[str] = Field(default_factory=list)
    #: The paths named in the instruction or tests outside those: only what the agent added there is carried.
    named_paths: list[str] = Field(default_factory=list)
    carried: list[str] = Field(default_factory=list)
    carried_total: int = 0
    dropped: list[str] = Field(default_factory=list)
    outside_changes: list[Change] = Field(default_factory=list)
    outside_changes_total: int = 0
    #: The reference solution's reward from the verifier replayed in its own container (asked
    #: for when its trusted verifier did not pass and it changed paths outside its work paths);
    #: None: not replayed, or no usable reward there.
    shared_reward: float | None = None
    shared_replayed: bool = False
    #: The containers' (or overlay's) writable layer was on a tmpfs of the trial's storage limits.
    storage_bounded: bool = False
    #: What was read after that replay (`VerifierRecord.replayed` of the attempt's reply).
    shared_record: VerifierRecord | None = None
    agent_run: PhaseRun = Field(default_factory=PhaseRun)
    verifier_run: PhaseRun = Field(default_factory=PhaseRun)
    #: What was in /logs/verifier when the agent phase ended (recorded, never read as a reward).
    left_in_verifier_dir: list[LeftFile] = Field(default_factory=list)
    left_listing_truncated: bool = False
    #: Processes of the agent phase the harness killed before the verifier ran in the same
    #: container, PID 1 aside (None: no such sweep: a separate verifier, or the phase's
    #: container stopped and everything in it died with its PID 1).
    agent_processes_killed: int | None = None
    #: Whether that container's PID 1 ran under the harness's own ids, out of every process's
    #: reach (`validate.taskdir.trial.docker.pid1_entrypoint`); None: not asked for.
    pid1_guarded: bool | None = None
    #: Names of the files the verifier wrote to /logs/verifier (sorted).
    verifier_files: list[str] = Field(default_factory=list)
    applied: Applied | None = None
    #: A separate verifier's image (None: the verifier ran in a snapshot of the agent's container).
    verifier_image: str | None = None
    #: What a separate verifier was handed of the agent's /logs/artifacts.
    artifacts: Handed | None = None
    #: The names each phase looked up through the trial's resolver (None: no resolver ran).
    lookups: Lookups | None = None
    runtime_s: float = 0.0
    #: Reasons the harness's own cleanup could not finish (empty when it left nothing behind).
    cleanup_errors: list[str] = Field(default_factory=list)

    def passed(self, threshold: float = 1.0) -> bool:
        """A pass needs a usable reward at or over `threshold`; any error is never a pass."""
        return self.status in ("ok", "agent_timeout", "agent_oom") and self.reward is not None \
            and exact_reward(self.reward, self.reward_decimal) >= exact_reward(threshold)
