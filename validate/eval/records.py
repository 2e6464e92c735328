"""The eval's own rows, as pydantic models (the schema of record of its Parquet files).

Beside ``attempts.parquet`` (one `validate.core.records.Attempt` per attempt, role ``model``):

- ``trajectories.parquet`` — one `TurnRow` per model call, keyed like attempts plus
  ``turn``: the messages sent first (turn 0), the assistant's message (capped), its tool
  calls with their results (capped, with the full output's sha256 and size), tokens,
  latency and the endpoint's retries. The conversation is: system, user, then per turn the
  assistant's message followed by its tool results.
- ``samples.parquet`` — one `SampleRow` per attempt: how it ended, counts, where the time
  went, and its failure class with the rule that gave it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from validate.core.records import TaskRow


class AttemptKey(TaskRow):
    agent: str = Field(description="The agent's name (``model``).")
    sample: int = Field(ge=0, description="Sample number: 0 in eval-greedy, 0..k-1 in eval.")
    attempt: int = Field(ge=1, description="Try number of this (phase, task, agent, sample), as in attempts.")

    def key(self) -> tuple[str, str, str, int, int]:
        return (self.phase, self.task_id, self.agent, self.sample, self.attempt)


class ToolCallRow(BaseModel):
    call_id: str = Field(description="The call's id (assigned when the model gave none).")
    name: str = Field(description="The function the model named (capped).")
    arguments: str = Field(description="Its arguments as sent (capped).")
    well_formed: bool = Field(description="A bash call with a JSON object holding a string `command`.")
    error: str | None = Field(default=None, description="Why it is malformed (the model was told so).")
    exit_code: int | None = Field(default=None,
                                  description="The command's exit status (None: not run or killed).")
    timed_out: bool = Field(default=False, description="The command hit the tool timeout.")
    oom_killed: bool = Field(default=False, description="The sandbox's memory limit killed it.")
    runtime_s: float = Field(default=0.0, description="Seconds the command ran.")
    output: str = Field(default="",
                        description="The tool message the model got, its first stored_tool_output_bytes.")
    output_bytes: int = Field(default=0, description="Size of that whole tool message, UTF-8 bytes.")
    output_sha256: str = Field(default="", description="sha256 of that whole tool message.")
    output_cut: bool = Field(default=False,
                             description="The command's output was cut before the model saw it.")


class TurnRow(AttemptKey):
    turn: int = Field(ge=0, description="0-based model call of the attempt.")
    system: str = Field(default="", description="Turn 0: the system message (capped); empty on later turns.")
    user: str = Field(default="",
                      description="Turn 0: the first user message (capped); empty on later turns.")
    content: str | None = Field(default=None,
                                description="The assistant's text (capped); None when it had none.")
    content_bytes: int = Field(default=0, description="Size of the whole text, UTF-8 bytes.")
    tool_calls: list[ToolCallRow] = Field(default_factory=list,
                                          description="Its tool calls and their results.")
    finish_reason: str | None = Field(default=None,
                                      description="As the endpoint said (stop, tool_calls, length).")
    prompt_tokens: int | None = Field(default=None,
                                      description="As the endpoint counted; None when not reported.")
    completion_tokens: int | None = Field(default=None, description="As the endpoint counted.")
    latency_s: float = Field(default=0.0, description="Seconds of the request that answered.")
    tries: int = Field(default=1, description="HTTP tries of this call (retries after endpoint "
                                              "faults included).")
    wait_s: float = Field(default=0.0, description="Seconds in failed tries and backoff before the answer.")
    faults: list[str] = Field(default_factory=list,
                              description="Kind of each failed try (rate_limited, ...).")
    temperature: float = Field(description="Sampling temperature sent.")
    seed: int = Field(description="Request seed sent.")


class SampleRow(AttemptKey):
    family: str = Field(description="The task's family.")
    termination: str | None = Field(description="How the conversation ended "
                                                "(validate.eval.agent.Termination); None when it never "
                                                "began.")
    turns: int = Field(default=0, description="Model calls made.")
    tool_calls: int = Field(default=0, description="Tool calls the model made.")
    malformed_tool_calls: int = Field(default=0, description="Of those, malformed (not run; the "
                                                             "model was told).")
    tool_failures: int = Field(default=0, description="Well-formed calls whose command failed (exit ≠ 0, "
                                                      "timeout, OOM).")
    tool_timeouts: int = Field(default=0, description="Commands that hit the tool timeout.")
    prompt_tokens: int | None = Field(default=None,
                                      description="Sum over turns (None when the endpoint gave none).")
    completion_tokens: int | None = Field(default=None, description="Sum over turns.")
    endpoint_tries: int = Field(default=0, description="HTTP tries over all turns.")
    endpoint_faults: int = Field(default=0, description="Of those, failed (then retried).")
    model_s: float = Field(default=0.0, description="Seconds in answered model requests.")
    endpoint_wait_s: float = Field(default=0.0, description="Seconds in failed requests and backoff.")
    tool_s: float = Field(default=0.0, description="Seconds commands ran in the sandbox.")
    sandbox_s: float = Field(default=0.0, description="Seconds starting and stopping the sandbox session.")
    score_s: float = Field(default=0.0, description="Seconds scoring the reply on the host.")
    wall_s: float = Field(default=0.0, description="Seconds of the whole attempt.")
    temperature: float = Field(description="Sampling temperature.")
    seed: int = Field(description="Request seed.")
    solved: bool = Field(default=False, description="Valid and the reward reached the pass threshold.")
    parsed: float | None = Field(default=None, description="The scorer's metric that says the reply parsed "
                                                          "(the taskset's declared "
                                                          "parse_metric), if it has one.")
    verifier: str | None = Field(default=None, description="A task-directory sample: the task's verifier's "
                                 "exit code and output (capped), which decided its reward; None when the "
                                 "reply was scored on the host.")
    failure_class: str | None = Field(default=None, description="One of validate.eval.classes.CLASSES; None "
                                                                "when solved.")
    failure_rule: str | None = Field(default=None,
                                     description="The rule that gave the class (see the report).")

    @property
    def harness_s(self) -> float:
        """What the harness itself took: the wall time less the model, endpoint waits and commands."""
        return max(0.0, self.wall_s - self.model_s - self.endpoint_wait_s - self.tool_s)
