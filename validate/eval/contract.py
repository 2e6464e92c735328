"""The eval contract: what a model evaluation freezes, on top of a validated dataset.

An eval contract is written like a `validate.contract.manifest.Manifest`: canonical JSON with its own
``sha256`` (of the compact canonical JSON of every other field). Its ``parent`` pins the
frozen dataset manifest (by sha256) and the pool run it came from (its sealed checksums);
`freeze` refuses unless that run's *current* dataset verdict is PASS and `validate audit`
of the run passes. It holds everything the protocol asks to freeze to match the planned RL
setup: the model id and revision and the endpoint kind, the agent implementation and its
version, the prompt templates (with their sha256) and the tool schema, the sampling
settings, max turns, per-attempt limits and timeouts, the reward code's version, and k.

The endpoint's base URL and the *name* of the environment variable holding its API key
are recorded; the key itself never is.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

import validate
from environment.protocol import ScorerSpec, canonical_json, sha256_tag
from validate.contract.manifest import Manifest
from validate.contract.sealed import SealedDocument, first_error, pretty
from validate.core.errors import ContractError
from validate.core.jsonio import field_differences
from validate.evidence.patches import PatchInfo

SCHEMA_VERSION: Final = 1
#: The agent implementation this harness ships (`validate.eval.agent`).
AGENT_NAME = "bash-tool-agent"
AGENT_VERSION = "1"
#: Placeholders a prompt template may use (`string.Template` syntax: ``$prompt``).
TEMPLATE_FIELDS = ("prompt", "meta_json")

DEFAULT_SYSTEM = (
    "You are solving a task inside a sandboxed Linux machine with no network. The task's files are in "
    "/workspace (your working directory). Use the bash tool to inspect them; python3 is available. When you "
    "know the answer, reply with it as a plain message, without calling a tool: that final message is your "
    "answer.")
DEFAULT_USER = "$prompt"
BASH_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "bash",
    "description": "Run a bash command in the task's sandbox (working directory /workspace, no network). "
                   "Returns its standard output; standard error and a non-zero exit code are appended.",
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "description": "The command line, run with bash -c."}},
        "required": ["command"]}}}

#: The task-directory agent (`validate.kinds.task_shell`): a task's instruction, a shell in its container,
#: then the task's own verifier; the model ends its work by replying without a tool call.
SHELL_AGENT_NAME = "task-shell-agent"
SHELL_SYSTEM = (
    "You are working on a task inside its own Linux container, which has no network. Use the bash tool to "
    "run commands there (each one runs in a fresh shell in the task's working directory, with a time limit, "
    "and you see its output). Do what the task asks by changing the container's files. When you are done, "
    "reply with a short message without calling a tool: the task's own checks then run on the container as "
    "you left it.")
SHELL_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "bash",
    "description": "Run a bash command in the task's container (the task's working directory, its agent "
                   "user, no network, a time limit per command). Returns its standard output; standard error "
                   "and a non-zero exit code are appended; long output is cut.",
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "description": "The command line, run with bash -c."}},
        "required": ["command"]}}}


@dataclass(frozen=True)
class ModelAgent:
    """How an evaluating attempt kind plays a model (declared on the kind: `ModelKind.agent`):
    the agent's name, its source files' digest, its one tool and its default system prompt."""

    name: str
    source_sha256: Callable[[], str]
    tool: dict[str, Any]
    system: str

    def impl(self) -> AgentImpl:
        return AgentImpl(name=self.name, version=AGENT_VERSION, source_sha256=self.source_sha256())


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetParent(_Frozen):
    """The validated dataset the eval runs on."""

    manifest_name: str = Field(description="The frozen dataset manifest's name.")
    manifest_sha256: str = Field(description="The frozen dataset manifest's own sha256: the "
                                             "task set evaluated.")
    manifest_path: str = Field(description="Where the manifest was read at freeze (a hint for "
                                           "`validate eval run`).")
    pool_run_id: str = Field(description="The pool run that froze the set.")
    pool_run_dir: str = Field(description="Where that run's evidence lay at freeze (a hint).")
    pool_manifest_sha256: str = Field(description="The pool's root contract (the frozen set's parent).")
    pool_checksums_sha256: str = Field(description="sha256 of the pool run's checksums file: the evidence "
                                                   "sealed as it was when its verdict was read.")
    dataset_verdict: Literal["PASS"] = Field(description="The pool's current dataset verdict at freeze.")
    environment: str = Field(description="The environment's registered name.")
    task_count: int = Field(ge=1, description="Tasks in the frozen set.")


class ModelSpec(_Frozen):
    id: str = Field(min_length=1, description="The model name sent in every request (`model`).")
    revision: str = Field(min_length=1, description="The exact checkpoint: a commit, a file sha256, a tag.")
    endpoint_kind: Literal["openai-chat-completions"] = Field(
        default="openai-chat-completions", description="The API spoken: POST {base_url}/chat/completions.")
    server: str = Field(min_length=1,
                        description="What serves it, in words (vllm, llama.cpp, openai, localserver).")
    base_url: str = Field(pattern=r"^https?://", description="The endpoint's base URL, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                    description="Name of the environment variable holding the API key (never "
                                                "the key); None: no key is sent.")


class AgentImpl(_Frozen):
    name: str = Field(description="The agent implementation.")
    version: str = Field(description="Its version.")
    source_sha256: str = Field(description="sha256 of its source module, so an edit shows.")


class Prompts(_Frozen):
    system_template: str = Field(description="System message template (`string.Template`: "
                                             "$prompt, $meta_json).")
    user_template: str = Field(min_length=1, description="First user message template.")
    system_sha256: str = Field(description="sha256 of system_template (UTF-8).")
    user_sha256: str = Field(description="sha256 of user_template (UTF-8).")

    @model_validator(mode="after")
    def _hashes(self) -> Prompts:
        for name in ("system", "user"):
            template = getattr(self, f"{name}_template")
            if sha256_tag(template.encode()) != getattr(self, f"{name}_sha256"):
                raise ValueError(f"prompts.{name}_sha256: does not match prompts.{name}_template")
            try:
                string.Template(template).substitute({f: "" for f in TEMPLATE_FIELDS})
            except (KeyError, ValueError) as e:
                raise ValueError(f"prompts.{name}_template: unknown or bad placeholder {e}; known: "
                                 f"{', '.join('$' + f for f in TEMPLATE_FIELDS)}") from None
        return self

    def render(self, prompt: str, meta: dict) -> tuple[str, str]:
        values = {"prompt": prompt, "meta_json": canonical_json(meta).decode()}
        return (string.Template(self.system_template).substitute(values),
                string.Template(self.user_template).substitute(values))


class Sampling(_Frozen):
    """Sampling of the sampled pass (the greedy pass uses temperature 0, the rest the same)."""

    temperature: float = Field(default=1.0, ge=0.0, le=2.0,
                               description="Sampling temperature of the k samples.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int = Field(default=4096, ge=1, description="Completion tokens per model call.")
    seed: int = Field(default=0, ge=0, description="Root seed; each sample's request seed derives from it, "
                                                   "the task and the sample number (`request_seed`).")
    stream: bool = Field(default=True,
                         description="Ask for server-sent events (a cut stream is an endpoint fault).")


class AgentLimits(_Frozen):
    """Per-attempt limits of the model agent. The sandbox's memory, cpu, pids and storage
    limits are the dataset contract's (`execution.limits`)."""

    max_turns: int = Field(default=8, ge=1, le=1000, description="Model calls per attempt.")
    attempt_timeout_s: float = Field(default=300.0, gt=0, le=86400,
                                     description="Wall-clock limit of one attempt.")
    request_timeout_s: float = Field(default=120.0, gt=0, description="Read timeout of one model request.")
    tool_timeout_s: float = Field(default=30.0, gt=0, description="Wall-clock limit of one bash command.")
    max_tool_output_bytes: int = Field(default=262144, ge=256, description="Bytes of a command's stdout (and "
                                       "of its stderr) the model is shown; the rest is cut with a note.")
    stored_tool_output_bytes: int = Field(default=4096, ge=0, description="Bytes of each tool result kept in "
                                          "the trajectory (its sha256 and size are always kept).")
    stored_message_bytes: int = Field(default=16384, ge=0, description="Bytes of each model message kept in "
                                      "the trajectory.")
    endpoint_retries: int = Field(default=4, ge=0, le=20, description="Further tries of one model request "
                                  "after an endpoint fault (connection, 429, 5xx, timeout, cut answer).")
    retry_max_wait_s: float = Field(default=30.0, ge=0, description="Longest wait between two tries "
                                    "(Retry-After is honoured up to this).")


class RewardSpec(_Frozen):
    scorer: ScorerSpec = Field(description="The dataset contract's scorer facts.")
    pass_threshold: float = Field(description="A sample is solved when its reward reaches this.")
    revision: str = Field(description="The environment content revision (the dataset contract's).")
    code_sha256: str = Field(description="sha256 over the environment's source files (which hold the "
                                         "scorer).")


class EvalContract(_Frozen, SealedDocument):
    document: ClassVar[str] = "eval contract"
    short: ClassVar[str] = "the contract's"
    make_with: ClassVar[str] = "make one with `validate eval freeze`"

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["eval"] = "eval"
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", description="The contract's name.")
    created_at: datetime = Field(description="UTC time of the freeze.")
    parent: DatasetParent = Field(description="The validated dataset.")
    model: ModelSpec = Field(description="The model and its endpoint.")
    agent: AgentImpl = Field(description="The agent implementation.")
    prompts: Prompts = Field(description="Prompt templates and their hashes.")
    tools: list[dict[str, Any]] = Field(description="The tool schema offered in every request.")
    tools_sha256: str = Field(description="sha256 of the tools' canonical JSON.")
    sampling: Sampling = Field(description="Sampling settings.")
    limits: AgentLimits = Field(description="Per-attempt limits and timeouts.")
    reward: RewardSpec = Field(description="The reward code and pass threshold.")
    k: int = Field(default=8, ge=1, le=1024, description="Samples per task in the sampled pass.")
    harness_version: str = Field(description="The harness's version.")
    git_commit: str = Field(description="The commit frozen from.")
    patch: PatchInfo | None = Field(default=None, description="The uncommitted change frozen with, if any.")
    sha256: str = Field(default="", description="sha256 of every other field's canonical JSON, as written.")
    #: The document as read (`parse`): what a run directory copies, byte for byte.
    _source: bytes | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _tools(self) -> EvalContract:
        if sha256_tag(canonical_json(self.tools)) != self.tools_sha256:
            raise ValueError("tools_sha256: does not match tools")
        names = [t.get("function", {}).get("name") for t in self.tools]
        if names != ["bash"]:
            raise ValueError(f"tools: the agent provides exactly one tool, bash; got {names}")
        return self

    @classmethod
    def check_raw(cls, raw: Any, where: str) -> None:
        if not isinstance(raw, dict) or raw.get("kind") != "eval":
            raise ContractError(f"{where}: not an eval contract (field 'kind' is not 'eval'); make one with "
                                f"`validate eval freeze`")

    @classmethod
    def parse(cls, data: bytes, where: str) -> EvalContract:
        contract = super().parse(data, where)
        contract._source = bytes(data)
        return contract

    def to_json(self) -> bytes:
        """The document as it was read, or (for one built here) as it is written."""
        return self._source if self._source is not None else pretty(self.model_dump(mode="json"))


def request_seed(root: int, task_id: str, sample: int) -> int:
    """The request seed of one sample: 63 bits of sha256(root, task id, sample); the same on
    every turn of that sample, different between samples and tasks."""
    digest = hashlib.sha256(f"{root}\n{task_id}\n{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


#: The model agent's source (`validate.eval.agent`), read by path: the agent is built on this
#: contract, so the contract names its code without importing it.
AGENT_SOURCE = Path(__file__).with_name("agent.py")
#: The task-directory agent's sources: the conversation it plays and its driver, the task-shell
#: kind (`validate.kinds.task_shell`).
SHELL_SOURCES = (AGENT_SOURCE, Path(__file__).resolve().parents[1] / "kinds" / "task_shell.py")


def agent_source_sha256() -> str:
    return sha256_tag(AGENT_SOURCE.read_bytes())


def shell_source_sha256() -> str:
    return sha256_tag(canonical_json([[p.name, sha256_tag(p.read_bytes())] for p in SHELL_SOURCES]))


#: The conversation scored on the host (`validate.kinds.chat`).
CHAT_AGENT = ModelAgent(name=AGENT_NAME, source_sha256=agent_source_sha256, tool=BASH_TOOL,
                        system=DEFAULT_SYSTEM)
#: A task directory's instruction, a shell in its container, then its own verifier
#: (`validate.kinds.task_shell`).
SHELL_AGENT = ModelAgent(name=SHELL_AGENT_NAME, source_sha256=shell_source_sha256, tool=SHELL_TOOL,
                         system=SHELL_SYSTEM)


def reward_code_sha256(files: list[tuple[str, Path]]) -> str:
    return sha256_tag(canonical_json([[rel, sha256_tag(p.read_bytes())] for rel, p in files]))


def _error(e: ValidationError, where: str) -> ContractError:
    return ContractError(f"{where}{first_error(e)}")


def build(*, name: str, parent: DatasetParent, manifest: Manifest, model: ModelSpec, reward_code: str,
          system_template: str | None = None, user_template: str = DEFAULT_USER,
          sampling: Sampling | None = None, limits: AgentLimits | None = None, k: int = 8,
          git_commit: str = "", patch: PatchInfo | None = None,
          agent: ModelAgent = CHAT_AGENT) -> EvalContract:
    """A sealed eval contract (no checks of the parent: see `validate.eval.freeze`); the agent,
    its tool and the default system prompt are `agent`'s, the one the kind that plays a model on
    the environment declares (`validate.kinds.model_kind_class`)."""
    tools = [agent.tool]
    system_template = agent.system if system_template is None else system_template
    try:
        prompts = Prompts(system_template=system_template, user_template=user_template,
                          system_sha256=sha256_tag(system_template.encode()),
                          user_sha256=sha256_tag(user_template.encode()))
        return EvalContract(
            name=name, created_at=datetime.now(UTC), parent=parent, model=model,
            agent=agent.impl(),
            prompts=prompts, tools=tools, tools_sha256=sha256_tag(canonical_json(tools)),
            sampling=sampling or Sampling(), limits=limits or AgentLimits(), k=k,
            harness_version=validate.__version__, git_commit=git_commit, patch=patch,
            reward=RewardSpec(scorer=manifest.environment.scorer,
                              pass_threshold=manifest.expectations.pass_threshold,
                              revision=manifest.environment.revision, code_sha256=reward_code),
        ).sealed()
    except ValidationError as e:
        raise _error(e, "") from None


def parse(data: bytes, where: str) -> EvalContract:
    return EvalContract.parse(data, where)


def load(path: str | Path) -> EvalContract:
    return EvalContract.load(path)


def differences(a: EvalContract, b: EvalContract) -> list[str]:
    """Dotted names of every field that differs (identity fields excluded), sorted."""
    skip = {"name", "created_at", "sha256", "git_commit", "patch", "harness_version"}
    return field_differences(a.model_dump(mode="json"), b.model_dump(mode="json"), skip)
