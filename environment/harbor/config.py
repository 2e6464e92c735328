"""The ``task.toml`` of a Harbor task directory, as pydantic models.

Written from the format Harbor 0.25.0 reads (its own code is not a dependency): sections
``[task]``, ``[metadata]``, ``[verifier]`` (with an optional ``[verifier.environment]``, a
separate verifier container), ``[agent]``, ``[environment]``, ``[solution]`` and
``[[steps]]``. As in Harbor, keys this schema does not name are ignored (a dataset written
for a newer Harbor still loads), and the legacy spellings are accepted: a top-level
``version`` for ``schema_version``, ``[environment] memory = "2G"`` / ``storage = "10G"``
for ``memory_mb`` / ``storage_mb``, and ``allow_internet`` for ``network_mode``.

Stricter than Harbor, because a limit the harness enforces must be a real one: timeouts,
CPUs and sizes must be finite and positive (Harbor accepts ``timeout_sec = nan``).
"""

from __future__ import annotations

import ipaddress
import math
import re
import tomllib
from pathlib import PurePosixPath
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NetworkMode = Literal["public", "no-network", "allowlist"]

#: ``[task].name``: ``org/name``, each part starting alphanumeric.
_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_HOST_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
#: Characters no portable directory name may hold (steps/<name>/ must be one directory).
_BAD_STEP_CHARS = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMG])\s*$", re.IGNORECASE)


class _Section(BaseModel):
    """Unknown keys are ignored, as Harbor ignores them; values are validated."""

    model_config = ConfigDict(extra="ignore")


_Number = TypeVar("_Number", bound=float | None)  # float covers int; the value comes back unchanged


def _positive(value: _Number, what: str) -> _Number:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")
    return value


def _host_entry(entry: str) -> str:
    """One ``allowed_hosts`` entry: a hostname, ``*.`` + hostname, an IP or a CIDR range."""
    host = entry.strip().lower().rstrip(".")
    try:
        return (
            str(ipaddress.ip_network(host, strict=True)) if "/" in host else str(ipaddress.ip_address(host))
        )
    except ValueError:
        if "/" in host or ":" in host:
            raise ValueError(f"allowed_hosts entry {entry!r} is not an IP address or CIDR range") from None
    name = host[2:] if host.startswith("*.") else host
    if not name or not all(_HOST_LABEL.match(label) for label in name.split(".")):
        raise ValueError(f"allowed_hosts entry {entry!r} is not a hostname (no URLs, ports or paths)")
    return host


class _NetworkPolicy(_Section):
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str] | None) -> list[str] | None:
        return None if hosts is None else [_host_entry(h) for h in hosts]

    @model_validator(mode="after")
    def _hosts_need_allowlist(self):
        if self.allowed_hosts and self.network_mode != "allowlist":
            raise ValueError("allowed_hosts is only valid with network_mode = 'allowlist'")
        return self


class Author(_Section):
    name: str
    email: str | None = None


class TaskInfo(_Section):
    """``[task]``: the package's identity in a registry."""

    name: str
    version: str | None = Field(default=None, min_length=1)
    description: str = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _org_slash_name(cls, name: str) -> str:
        if not _PACKAGE_NAME.match(name) or ".." in name:
            raise ValueError(f"must be 'org/name' (letters, digits, '.', '_', '-'; no '..'), got {name!r}")
        return name


class Healthcheck(_Section):
    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = Field(default=3, ge=0)

    @field_validator("interval_sec", "timeout_sec", "start_interval_sec")
    @classmethod
    def _finite(cls, v: float, info) -> float:
        return _positive(v, info.field_name)


def _size_to_mb(text: str, field: str) -> int:
    """Harbor's legacy size strings: ``"2G"`` (×1024), ``"512M"``, ``"4096K"`` (÷1024)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{field} = {text!r}: expected a size like '2G', '512M' or '4096K'")
    number, unit = float(m.group(1)), m.group(2).upper()
    return int(number * 1024 if unit == "G" else number if unit == "M" else number / 1024)


class EnvironmentConfig(_NetworkPolicy):
    """``[environment]`` (and ``[verifier.environment]``): the image and its limits."""

    network_mode: NetworkMode = "public"
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    os: Literal["linux", "windows"] = "linux"
    cpus: int | float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = Field(default=None, ge=0)
    gpu_types: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    healthcheck: Healthcheck | None = None
    #: Legacy; folded into ``network_mode`` by `TaskConfig` and then cleared.
    allow_internet: bool | None = Field(default=None, exclude=True)

    @field_validator("os", mode="before")
    @classmethod
    def _os_lower(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @field_validator("build_timeout_sec", "cpus", "memory_mb", "storage_mb")
    @classmethod
    def _limits(cls, v, info):
        return _positive(v, info.field_name)

    @model_validator(mode="before")
    @classmethod
    def _legacy_sizes(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for legacy, field in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if legacy not in data:
                continue
            value = data.pop(legacy)
            if not isinstance(value, str):
                continue  # Harbor drops a non-string legacy size; so do we
            mb = _size_to_mb(value, legacy)
            if field in data and data[field] != mb:
                raise ValueError(f"{legacy} = {value!r} ({mb} MB) contradicts {field} = {data[field]!r}")
            data.setdefault(field, mb)
        return data

    def needs_gpu(self) -> bool:
        return bool(self.gpus) or bool(self.gpu_types)


class AgentConfig(_NetworkPolicy):
    """``[agent]``: the agent phase's own timeout, user and (optional) network override."""

    timeout_sec: float | None = None
    user: str | int | None = None

    @field_validator("timeout_sec")
    @classmethod
    def _timeout(cls, v):
        return _positive(v, "timeout_sec")


class VerifierConfig(_NetworkPolicy):
    """``[verifier]``: how ``tests/test.sh`` runs; ``environment`` is a separate container."""

    timeout_sec: float = 600.0
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    environment_mode: Literal["shared", "separate"] | None = None
    environment: EnvironmentConfig | None = None

    @field_validator("timeout_sec")
    @classmethod
    def _timeout(cls, v):
        return _positive(v, "timeout_sec")

    @model_validator(mode="after")
    def _shared_has_no_environment(self):
        if self.environment_mode == "shared" and self.environment is not None:
            raise ValueError("environment_mode = 'shared' contradicts a [verifier.environment] table")
        return self

    def separate(self) -> bool:
        """Harbor's rule: an explicit mode wins, else a verifier environment means separate."""
        return self.environment_mode == "separate" or (self.environment_mode is None
                                                        and self.environment is not None)


class SolutionConfig(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class Artifact(_Section):
    """A path collected from the agent's container after the agent phase (a bare string in
    ``task.toml`` is a ``source``); ``destination`` is relative to the trial's artifacts."""

    source: str
    destination: str | None = None
    exclude: list[str] = Field(default_factory=list)

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if ".." in PurePosixPath(v).parts:
            raise ValueError(f"artifact source {v!r} has a '..' component")
        return v

    @field_validator("destination")
    @classmethod
    def _destination(cls, v: str | None) -> str | None:
        if not v:
            return None
        p = PurePosixPath(v)
        if "\\" in v or p.is_absolute() or ".." in p.parts:
            raise ValueError(f"artifact destination {v!r} escapes the artifacts directory")
        if v.rstrip("/") == "manifest.json":
            raise ValueError("artifact destination 'manifest.json' is reserved")
        return v


def _artifacts(items: list[Any]) -> list[Any]:
    return [{"source": i} if isinstance(i, str) else i for i in items]


class StepConfig(_Section):
    """One ``[[steps]]`` entry of a multi-step task; its files live under ``steps/<name>/``."""

    name: str
    agent: AgentConfig = Field(default_factory=AgentConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    min_reward: float | dict[str, float] | None = None
    artifacts: list[Artifact] = Field(default_factory=list)

    _items = field_validator("artifacts", mode="before")(lambda cls, v: _artifacts(v) if isinstance(v, list)
                                                         else v)

    @field_validator("name")
    @classmethod
    def _one_directory(cls, name: str) -> str:
        if (not name.strip() or name in (".", "..") or name.endswith((".", " "))
                or _BAD_STEP_CHARS.search(name) or len(name.encode()) > 255):
            raise ValueError(f"step name {name!r} is not one portable directory name")
        return name


class TaskConfig(_Section):
    """A whole ``task.toml``."""

    schema_version: str = "1.4"
    task: TaskInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)
    source: str | None = None
    steps: list[StepConfig] | None = None
    artifacts: list[Artifact] = Field(default_factory=list)

    _items = field_validator("artifacts", mode="before")(lambda cls, v: _artifacts(v) if isinstance(v, list)
                                                         else v)

    @model_validator(mode="before")
    @classmethod
    def _legacy_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            legacy = data.pop("version")
            data.setdefault("schema_version", str(legacy) if isinstance(legacy, (int, float)) else legacy)
        return data

    @model_validator(mode="after")
    def _legacy_allow_internet(self):
        for env in (self.environment, self.verifier.environment):
            if env is None or env.allow_internet is None:
                continue
            # an explicit network_mode (or an allowlist) wins over the legacy flag, as in Harbor
            if "network_mode" not in env.model_fields_set and env.allowed_hosts is None:
                env.network_mode = "public" if env.allow_internet else "no-network"
            env.allow_internet = None
        return self

    @field_validator("steps")
    @classmethod
    def _unique_steps(cls, steps: list[StepConfig] | None) -> list[StepConfig] | None:
        import unicodedata

        keys = [unicodedata.normalize("NFC", s.name).casefold() for s in steps or []]
        if len(set(keys)) != len(keys):
            raise ValueError("step names must be unique (ignoring case and Unicode normalisation)")
        return steps

    @classmethod
    def from_toml(cls, text: str) -> TaskConfig:
        """Parse ``task.toml`` text; raises ``tomllib.TOMLDecodeError`` or pydantic's
        ``ValidationError`` (the loader turns both into a finding)."""
        return cls.model_validate(tomllib.loads(text))

    def agent_network(self) -> tuple[str, list[str]]:
        """The agent phase's network: its own override, else the environment's baseline."""
        return _effective(self.agent, self.environment)

    def verifier_network(self) -> tuple[str, list[str]]:
        base = (
            self.verifier.environment
            if self.verifier.separate() and self.verifier.environment
            else self.environment
        )
        return _effective(self.verifier, base)


def _effective(phase: _NetworkPolicy, base: EnvironmentConfig) -> tuple[str, list[str]]:
    if phase.network_mode is not None:
        return phase.network_mode, list(phase.allowed_hosts or [])
    return base.network_mode, list(base.allowed_hosts or [])
