"""curator: look at a set of things, work out why they belong together, and find the ones
that only look as if they do.

Spec: the curator seed. Each task is one hand-authored theme (``specs/*.json``, rules in
``AUTHORING.md``): 8–12 items, one or two of them near-miss intruders that satisfy a decoy
but not the hidden principle. The reply is exactly ``<intruders>D, K</intruders>`` then
``<theme>…</theme>``; reward = 0.7 × Jaccard(predicted, gold intruders) + 0.3 × theme grade.

Where the seed is silent or leaves a choice, this package decides:

The mode is the contract's, never the machine's
    ``CuratorConfig.judge`` is part of the frozen config. ``judge = None`` freezes the
    intruders-only mode: the theme slot mirrors the intruder Jaccard, so the reward is the
    Jaccard, ``judged`` is 0 and the scorer is deterministic (``ScorerSpec`` tolerance 0).
    A ``judge`` freezes the judged mode: the model id, temperature 0 and the prompt
    template's sha256 go into ``ScorerSpec.details``, the scorer is declared
    non-deterministic with a smoke tolerance of 0.15 (one grade step), and a missing API key
    at scoring time raises ``ScorerUnavailable`` (an infrastructure fault): the seed's
    "graceful degradation" becomes a choice made when the contract is frozen, so two
    machines with and without a key never score one contract two ways.

Dataset
    `build` (seeded, ``random.Random`` fed by sha256; splits by sha256(spec_id), 20 % of
    each tier held out) and `validate_dataset` (structure, theme-word leaks, near-duplicate
    themes, intruder positions by thirds, three shortcut baselines told the true count that
    must not beat random). The taskset's revision is the sha256 of the canonical build.

Tasks and agents
    `taskset` (ids ``curator/<config digest>/<spec_id>``, family = tier, public meta =
    ``n_items`` only); `parse` never raises; `judge` is the host-side chat-completions
    client; the agents under ``agents/`` are declared in `env`. The standing source-peek
    control sees the package's code without ``specs/``: the specs are the gold (see
    `env.CuratorEnvironment.source_dir`).
"""

__all__ = ["CuratorConfig", "CuratorEnvironment", "CuratorTask", "CuratorTaskset"]


def __getattr__(name: str):
    # Lazy, so ``python -m environment.curator.build`` (or ``.validate_dataset``) does not
    # import its own module twice through the package.
    if name == "CuratorEnvironment":
        from environment.curator.env import CuratorEnvironment  # lazy: once under `python -m`

        return CuratorEnvironment
    if name in ("CuratorConfig", "CuratorTask", "CuratorTaskset"):
        from environment.curator import taskset  # lazy: `python -m` of a submodule imports it once

        return getattr(taskset, name)
    raise AttributeError(f"module 'environment.curator' has no attribute {name!r}")
