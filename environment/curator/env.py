"""`CuratorEnvironment`: the curator environment behind the harness's seam
(`environment.protocol`), registered as ``curator`` in ``validate.environments``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from environment.curator.build import canonical_json
from environment.curator.judge import TEMPLATE_SHA256
from environment.curator.taskset import CuratorConfig, CuratorTask, CuratorTaskset
from environment.curator.themes import SPECS_DIR, load_specs
from environment.curator.validate_dataset import dataset_findings, row_findings
from environment.protocol import (
    AgentSpec,
    Environment,
    Finding,
    LoadHints,
    ScorerSpec,
)

PACKAGE_DIR = Path(__file__).resolve().parent
AGENTS_DIR = PACKAGE_DIR / "agents"
SUPPORT = (AGENTS_DIR / "curatorlib.py",)
#: Documents about the dataset, kept from agents that see the source like the specs themselves;
#: and the recall baseline (`baseline.py`), a stand-in for a model that memorised the published
#: dataset: it is no code of the environment, and its own words name items of the specs.
DATASET_DOCUMENTS = ("AUTHORING.md", "FACTCHECK.md", "baseline.py")
#: One grade step (A→B or B→C) moves the reward by 0.3 × 0.5.
JUDGED_SMOKE_TOLERANCE = 0.15


def _agent(name: str, role: str, program: str, tests: str, **kw) -> AgentSpec:
    return AgentSpec(name=name, role=role, program=AGENTS_DIR / program, support=SUPPORT, tests=tests, **kw)


#: The chance-level controls hit the exact intruder set on some tasks by luck (about 1 in 13
#: for a blind guess told the count), so they are held to their mean over the run: chance is
#: about 0.12, a real solver is far above 0.3.
CHANCE = {"ceiling": 0.3, "ceiling_scope": "mean"}

AGENTS: tuple[AgentSpec, ...] = (
    _agent("oracle", "oracle", "oracle.py", sees_answer_key=True,
           tests="the gold intruders and the hidden principle reach the full reward"),
    _agent("empty", "control", "empty.py", tests="no reply scores 0"),
    _agent("random-count", "control", "random_count.py", sees_answer_key=True, **CHANCE,
           tests="a blind guess told the true intruder count (it reads only the count) earns only chance "
                 "Jaccard; on a single task it is exactly right with probability 1/C(n, k), about 1 in 13"),
    _agent("tfidf-outlier", "control", "tfidf_outlier.py", sees_answer_key=True, **CHANCE,
           tests="the lexical odd-one-out told the count (the validator's TF-IDF baseline) does not find the "
                 "intruders: descriptions carry no wording cue"),
    _agent("length-outlier", "control", "length_outlier.py", sees_answer_key=True, **CHANCE,
           tests="the description-length outlier told the count does not find the intruders: no length cue"),
    _agent("decoy-theme", "control", "decoy_theme.py", sees_answer_key=True, ceiling=0.05,
           tests="a well-formed reply that believes the decoy (the decoy as the theme, members flagged) "
                 "earns nothing: the reward separates the principle from the decoy"),
    _agent("source-peek", "control", "source_peek.py", sees_source=True,
           tests="with the environment's code and the agent view, no answer can be derived without solving "
                 "(the hand-authored specs are data, outside the tree it sees; see source_dir)"),
    _agent("probe-half", "probe", "probe_half.py", sees_answer_key=True,
           tests="half the intruder set right with the true principle scores strictly between controls and "
                 "oracle (intruder Jaccard 1/2)"),
)


def _find_specs(hints: LoadHints) -> Path:
    """A folder of theme specs among the ``--data`` places (other environments' data there is
    skipped), else the specs shipped in this package; the revision check follows in the taskset."""
    for path in hints.search:
        if path.is_dir() and (path / "specs").is_dir():
            return path / "specs"
        if path.is_dir() and any(path.glob("*.json")):
            return path
    return SPECS_DIR


class CuratorEnvironment(Environment):
    """See the package docstring (`environment.curator`)."""

    name = "curator"
    Config = CuratorConfig

    def load(self, config: CuratorConfig, hints: LoadHints | None = None) -> CuratorTaskset:
        hints = hints or LoadHints()
        if not isinstance(config, CuratorConfig):
            config = CuratorConfig.model_validate(config)
        specs = _find_specs(hints)
        taskset = CuratorTaskset(config, load_specs(specs), expected_revision=hints.revision)
        taskset.data_files = () if specs == SPECS_DIR else (specs,)
        return taskset

    def agents(self, config: CuratorConfig) -> Sequence[AgentSpec]:
        return AGENTS

    def findings(self, task: CuratorTask) -> list[Finding]:
        out = row_findings(task.row)
        info = task.row["info"]
        view = task.prompt.encode() + b"".join(task.files.values()) + canonical_json(dict(task.meta))
        hidden = [info["theme"], info["decoy"], "is_intruder",
                  *(it["why"] for it in info["items"] if "why" in it)]
        leaked = [h for h in hidden if h.encode() in view]
        if leaked:
            out.append(Finding(kind="gold_in_agent_view", blocking=True,
                               detail=f"{info['spec_id']}: the prompt, files or meta contain hidden "
                                      f"text ({leaked[0]!r})"))
        return out

    def dataset_findings(self, taskset: CuratorTaskset, tasks: Iterable[CuratorTask]) -> list[Finding]:
        """Over the whole built dataset, whatever the selection: a shortcut's mean over an eval
        split of 9 rows says nothing; the data the contract froze is all rows."""
        return dataset_findings(taskset.rows)

    def scorer(self, config: CuratorConfig) -> ScorerSpec:
        if not isinstance(config, CuratorConfig):
            config = CuratorConfig.model_validate(config)
        if config.judge is None:
            return ScorerSpec(deterministic=True, smoke_tolerance=0.0, pass_threshold=1.0,
                              details={"mode": "intruders-only", "reward": "intruder Jaccard"})
        j = config.judge
        return ScorerSpec(deterministic=False, smoke_tolerance=JUDGED_SMOKE_TOLERANCE, pass_threshold=1.0,
                          details={"mode": "judged", "reward": "0.7 intruder Jaccard + 0.3 theme grade",
                                   "judge_model": j.model, "judge_base_url": j.base_url,
                                   "judge_api_key_var": j.api_key_var, "judge_temperature": "0",
                                   "judge_prompt_sha256": TEMPLATE_SHA256},
                          env_vars=(j.api_key_var,))

    def source_files(self) -> list[tuple[str, Path]]:
        """The package's code without the dataset: ``specs/`` (every spec names its intruders)
        and the documents about it (FACTCHECK.md reviews intruders by name; AUTHORING.md's
        example is a real spec's). The gold is hand-authored data, like a corpus: with it in
        view the standing control would read the answers, which measures contamination, not a
        leak in the code."""
        return [(rel, path) for rel, path in super().source_files()
                if not rel.startswith("specs/") and rel not in DATASET_DOCUMENTS]
