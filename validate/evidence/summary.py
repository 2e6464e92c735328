"""``run.json``: the run's summary, one pydantic model (the schema of record), the machine
facts a scoped claim names, and `run_kind`, the one reader of what kind of run a run
directory holds."""

from __future__ import annotations

import os
import platform
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from validate.core.jsonio import JSONInputError, loads
from validate.core.paths import EvalPaths, RunPaths
from validate.core.records import EVAL, RUN, FindingRow, RunKind
from validate.evidence.patches import PatchInfo
from validate.evidence.verdicts import DatasetVerdict, RunFacts


class Machine(BaseModel):
    """The facts a scoped claim names: OS, kernel, architecture, cores, memory (no host name)."""

    system: str
    os: str
    kernel: str
    architecture: str
    cpus: int | None
    memory_gib: float | None
    python: str


def machine() -> Machine:
    try:
        name = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except OSError:
        name = ""
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        memory = None
    return Machine(system=platform.system(), os=name, kernel=platform.release(),
                   architecture=platform.machine(), cpus=os.cpu_count(), memory_gib=memory,
                   python=platform.python_version())


class Stratum(BaseModel):
    name: str
    pool_tasks: int
    sampled: list[int]


class ProbeCheck(BaseModel):
    variant: str
    task_id: str
    probe: str
    reward: float | None
    control_typical: float = Field(description="The median final control reward on the task.")
    oracle_reward: float | None
    ok: bool


class Counts(BaseModel):
    tasks: int
    compatible: int
    excluded: int
    incomplete: int
    excluded_by_reason: dict[str, int]
    attempts: int
    superseded: int
    exceptions: int = Field(description="Attempts with an infrastructure or harness exception.")
    retried_passes: int = Field(default=0, description="Compatible tasks that passed only after a retry.")
    oracle_certified: int | None = Field(default=None, description=(
        "Task directories: tasks the oracle certified whatever the tampering controls did (N); absent for a "
        "contract without a trial profile."))
    hack_resistant: int | None = Field(default=None, description=(
        "Of them, the compatible ones when the verifier was trusted and the contract names tampering "
        "controls (H): no tampering control passed them; 0 in shared mode (verified in the "
        "agent's environment)."))

    @model_serializer(mode="wrap")
    def _omit_untried(self, handler: SerializerFunctionWrapHandler) -> dict:
        # Written only for a run with trials: every run.json sealed before the fields keeps its bytes.
        data = handler(self)
        for field in ("oracle_certified", "hack_resistant"):
            if data.get(field) is None:
                data.pop(field, None)
        return data


class JudgedGroup(BaseModel):
    """Which verdict rows come from which attempts under which contract (audit re-derives them)."""

    phase: str = Field(description="The verdict rows' phase.")
    attempt_phases: list[str] = Field(description="The attempts' phases these verdicts are judged from.")
    manifest: str = Field(description="The contract file (relative to the run directory) whose "
                                      "tasks are judged.")
    expectations: str = Field(description="The contract file whose expectations apply.")


class RunSummary(BaseModel):
    """Everything a reviewer reads first; `validate audit` recomputes every count in it."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[2] = 2
    run_id: str
    kind: RunKind
    groups: list[JudgedGroup] = Field(description="How tasks.parquet's verdicts were judged, in order.")
    environment: str
    manifest_sha256: str
    frozen_manifest_sha256: str | None = None
    variant_manifest_sha256: dict[str, str] = Field(default_factory=dict)
    backend: str
    backend_version: str
    image: str
    image_digest: str
    machine: Machine
    code_commit: str
    patch: PatchInfo | None = None
    started_at: datetime
    finished_at: datetime
    interrupted: bool
    agents: list[str]
    counts: Counts
    required: list[str] = Field(description="The protocol criteria this kind of run is held to.")
    facts: RunFacts
    dataset_verdict: DatasetVerdict
    dataset_findings: list[FindingRow] = Field(default_factory=list)
    families_uncovered: list[str] | None = Field(
        default=None, description="Families the environment can produce that no judged task belongs to "
                                  "(None: the environment cannot list its families).")
    strata: list[Stratum] = Field(default_factory=list)
    probes: list[ProbeCheck] = Field(default_factory=list)


class _Declared(BaseModel):
    """The one field `run_kind` reads of a run's record (the rest is its own model's)."""

    kind: RunKind


def _declared_kind(path: Path) -> RunKind | None:
    """The ``kind`` the record at `path` declares; None when it is absent or declares none readable."""
    if not path.is_file():
        return None
    try:
        return _Declared.model_validate(loads(path.read_bytes())).kind
    except (OSError, JSONInputError, ValidationError):
        return None


def run_kind(root: Path) -> RunKind:
    """What kind of run the directory `root` holds, as its own records declare it: an eval
    run's contract declares ``kind`` "eval" (the run records it, byte-identical, before its
    first attempt); a dataset run's run.json declares run, pool or pilot.

    A run that declares neither is told the way runs were told before this function, and only
    here: a directory holding an eval contract is an eval run, any other a dataset run ("run").
    That covers an eval contract no reader accepts (its audit says why) and a dataset run
    stopped before writing run.json (which of run, pool, pilot is unknown then; every caller
    only needs dataset or eval). A directory that holds an eval contract is read as an eval run
    whatever else it holds, exactly as before, so no sealed run reads differently."""
    paths = RunPaths(Path(root))
    contract = EvalPaths(paths).contract
    if _declared_kind(contract) == EVAL:
        return EVAL
    if not contract.is_file() and (declared := _declared_kind(paths.summary)) is not None:
        return declared
    return EVAL if contract.is_file() else RUN


def hack_claim(c, m: dict) -> str:
    """What the claim says of tampering, for a contract with a trial profile (`Counts.oracle_certified`,
    `Counts.hack_resistant`): N oracle-certified, H of them hack-resistant against K tampering
    controls, the verifier mode; empty for any other contract (its report keeps its bytes)."""
    trial = m["execution"].get("trial")
    if trial is None or c.oracle_certified is None:
        return ""
    tampering = sorted(n for n, a in m["expectations"]["agents"].items() if a.get("tampers"))
    mode = trial["verifier_mode"]
    where = ("trusted (a fresh container of the task's image; only the agent's changes under the task's work "
             "paths reach the verifier)" if mode == "trusted" else
             "shared (verified in the agent's environment: not hack-resistant)")
    against = (f"{len(tampering)} tampering controls ({', '.join(tampering)})" if tampering
               else "no tampering control")
    return (f" Of {c.tasks} tasks, {c.oracle_certified} oracle-certified, {c.hack_resistant} of them "
            f"hack-resistant against {against}; verifier mode {where}.")
