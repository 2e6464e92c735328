"""twohop-env: multi-hop composition over an invented fact universe (the twohop-env seed).

The seed's hub dataset is not used: the dataset is built here, deterministically, from a
seeded universe of invented people, organisations, cities and countries (`universe`).
36 questions in the seed's six categories — twohop 10, threehop 6, distractor 6, broken 5,
aggregate 5, reverse 4 — with ids ``th-000`` … ``th-035`` (`dataset`); every
``expected_output`` is computed by executing the reference solver over the facts
(`solver`). The reply is the JSON object ``{"rows": [...]}``; the reward is 1.0 for an
exact, case-sensitive match and 0.0 otherwise (`score`); the five underivable questions
expect the literal ``unknown``.

Module map, in data-path order: `universe` (entities, facts, their text) → `solver`
(questions, reference resolution, the one-hop shortcut) → `dataset` (selection, prompts,
rows, revision) → `checks` (ablation, non-forcing and the rest; dataset guards) → `score`
→ `env` (config, task, taskset, the `Environment`) → `agents_spec` (+ the programs in
``agents/``) → `build` (``python -m environment.twohop.build --verify``).

Decisions where the seed is silent
    - One setting besides ``schema_version``: ``seed`` (0 = the published dataset). The
      seed's guidance is one correct way to run an environment; a seed changes the
      universe, never the prompts, the parsing or the grading.
    - The dataset's own validation is the environment's: failed checks are blocking
      findings (`checks`); ``build --verify`` prints per-category counts and
      "36/36, N chains proved multi-hop".
    - No partial-credit probe: the reward is binary by design (an answer is right or it is
      not), so there is no partial credit for a probe to land in.
    - ``requires_network_isolation``: the facts are invented, so the network knows no answer,
      but the generator is public — with a network an agent could fetch it and look the
      question up — and a network reaches models that could answer for it.

Controls that are right somewhere by construction (``always-unknown`` on broken,
``plausible-entity`` off broken, ``modal-city`` on the modal city's tasks) are found by
comparing what each would reply (`agents_spec.predicted`) with the task's answer
(`agents_spec.control_may_pass`), and reach the harness through the seam's
`Environment.not_applicable`: the contract freezes, per task, which control cannot test it
and why, and that control is not played there.
"""

from environment.twohop.env import ENV_NAME, TwohopConfig, TwohopEnvironment, TwohopTask, TwohopTaskset

__all__ = ["ENV_NAME", "TwohopConfig", "TwohopEnvironment", "TwohopTask", "TwohopTaskset"]
