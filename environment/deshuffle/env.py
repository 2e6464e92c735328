"""deshuffle-papers behind the environment seam: config, taskset, agents, findings, strata.

The corpus is found by its revision, not by the working directory: `load` tries the
config's ``corpus`` path as given, then the ``--data`` paths, then that path below
the project's root (the default, ``../shared/corpus/papers.jsonl.gz``, is the checkout's
sibling ``shared``), then the data folder (``$VALIDATE_DATA_DIR``, default
``~/.cache/validate/data``: how a checkout elsewhere, ``/tmp`` say, says where the corpus
is); a folder is searched for a file of the same name, and nothing beyond these. At freeze
time (no revision yet) the first file found is used and its sha256 becomes the contract's
revision; afterwards only a file with that sha256 is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from environment.deshuffle.corpus import Corpus, CorpusError, file_revision
from environment.deshuffle.generate import (
    ENV_NAME,
    PARAGRAPHS_FILE,
    SHORT_PAPER_UNITS,
    DeshuffleConfig,
    DeshuffleTask,
    DeshuffleTaskset,
)
from environment.deshuffle.hub import load_hub
from environment.protocol import AgentSpec, ConfigError, Environment, Finding, LoadHints

AGENTS = Path(__file__).resolve().parent / "agents"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def data_cache() -> Path:
    return Path(os.environ.get("VALIDATE_DATA_DIR", Path.home() / ".cache/validate/data"))


def _candidates(location: str, hints: LoadHints) -> list[Path]:
    name = Path(location).name
    out: list[Path] = []
    for place in [Path(location), *hints.search, PROJECT_ROOT / location, data_cache()]:
        out += [place / name] if place.is_dir() else [place]
    return out


def find_corpus(location: str, hints: LoadHints) -> Path:
    """The corpus file the config and hints point at (see the module docstring)."""
    tried = []
    for path in _candidates(location, hints):
        if path in tried or not path.is_file():
            tried.append(path)
            continue
        tried.append(path)
        if hints.revision is None or file_revision(path) == hints.revision:
            return path
    want = f" with revision {hints.revision}" if hints.revision else ""
    raise ConfigError(f"corpus: no corpus file{want} at {', '.join(map(str, dict.fromkeys(tried)))}; "
                      f"pass its location with --data PATH, or set VALIDATE_DATA_DIR to the folder "
                      f"holding {Path(location).name} (now {data_cache()})")


def load_corpus(config: DeshuffleConfig, hints: LoadHints) -> Corpus:
    try:
        if config.corpus == "hub":
            return load_hub()
        return Corpus.from_path(find_corpus(config.corpus, hints))
    except CorpusError as e:
        raise ConfigError(f"corpus: {e}") from None


def _agent(name: str, role: str, tests: str, extra: tuple[Path, ...] = (), **kw) -> AgentSpec:
    return AgentSpec(name=name, role=role, program=AGENTS / f"{name.replace('-', '_')}.py",
                     support=(AGENTS / "deshufflelib.py", *extra), tests=tests, **kw)


class DeshuffleEnvironment(Environment):
    name = ENV_NAME
    Config = DeshuffleConfig

    def load(self, config: DeshuffleConfig, hints: LoadHints = LoadHints()) -> DeshuffleTaskset:
        corpus = load_corpus(config, hints)
        try:
            return DeshuffleTaskset(config, corpus, secret=hints.secret or "")
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def agents(self, config: DeshuffleConfig) -> list[AgentSpec]:
        return [
            _agent("oracle", "oracle",
                   "the reward works at all: the gold partition reaches the pass threshold",
                   sees_answer_key=True),
            _agent("empty", "control", "no reply scores 0"),
            _agent("shuffled", "control",
                   "chance does not pass: a random order and a random grouping into k"),
            _agent("identity", "control", "the displayed order is not the answer: the shuffle happened"),
            _agent("reversed", "control", "the scorer rewards direction (concordance), not mere adjacency"),
            _agent("singletons", "control",
                   "over-splitting cannot earn the ordering term (no comparable pair)"),
            _agent("malformed", "control", "an invalid partition (a label twice) scores 0"),
            _agent("source-peek", "control", "nothing the agent can read derives or checks the answer, even "
                   "with this environment's source: replaying the generator for orders near a heuristic "
                   "answer (the contract's secret is not in its view), from the id, commitments in the view",
                   sees_source=True, extra=(AGENTS / "replaylib.py",)),
            _agent("probe-swap", "probe",
                   "partial credit: one adjacent swap scores between controls and oracle",
                   sees_answer_key=True),
            _agent("probe-merge", "probe", "partial credit: two papers merged into one group",
                   sees_answer_key=True, applies_when={"n_papers": 2}),
            _agent("probe-split", "probe", "partial credit: one paper split into two groups",
                   sees_answer_key=True),
        ]

    def findings(self, task: DeshuffleTask) -> list[Finding]:
        return task_findings(task)

    def families(self, taskset: DeshuffleTaskset) -> list[str]:
        """A task's family is its anchor paper's source: every source the config admits."""
        return sorted({p.source for p in taskset.papers})

    def strata(self, task: DeshuffleTask) -> str:
        size = "short" if len(task.gold[0]) <= SHORT_PAPER_UNITS else "long"
        return f"{task.family} / {'1 paper' if task.n_papers == 1 else 'several papers'} / {size}"

    def pilot_variants(self, config: DeshuffleConfig) -> list[tuple[str, DeshuffleConfig]]:
        """The sample is played with headers as the contract says *and* flipped."""
        flipped = config.model_copy(update={"include_headers": not config.include_headers})
        return [(f"headers-{'on' if c.include_headers else 'off'}", c) for c in (config, flipped)]


def task_findings(task: DeshuffleTask) -> list[Finding]:
    out: list[Finding] = []
    gold = [list(t) for t in task.gold]
    blob = b"".join(task.files.values())
    leaks = [task.answer_key, json.dumps(gold, separators=(",", ":")).encode(), json.dumps(gold).encode()]
    if any(leak in blob for leak in leaks):
        out.append(Finding(kind="gold_in_workspace", blocking=True,
                           detail="the workspace files contain the gold answer"))
    short = [pid for pid, t in zip(task.paper_ids, gold, strict=False) if len(t) < 2]
    if short:
        out.append(Finding(kind="single_unit_paper", blocking=True,
                           detail=f"paper(s) {', '.join(short)} have a single unit: no comparable pair, "
                                  f"so norm_kendall_tau is 0 and even the oracle cannot pass"))
    # Lines end at b"\n" only: a paragraph may hold U+2028, which str.splitlines would split.
    texts = [json.loads(line)["text"] for line in task.files[PARAGRAPHS_FILE].split(b"\n") if line]
    first: dict[str, int] = {}
    dupes: list[tuple[int, int]] = []
    for label, text in enumerate(texts, 1):
        if text in first:
            dupes.append((first[text], label))
        else:
            first[text] = label
    if dupes:
        pairs = ", ".join(f"{a}={b}" for a, b in dupes[:5])
        out.append(Finding(kind="duplicate_units", blocking=False,
                           detail=f"{len(dupes)} unit(s) repeat an earlier unit's text (labels {pairs}"
                                  f"{', ...' if len(dupes) > 5 else ''}): their relative order cannot be "
                                  f"recovered from the text"))
    displayed = [label for t in gold for label in t]
    if len(gold) == 1 and displayed == sorted(displayed):
        out.append(Finding(kind="displayed_order_correct", blocking=False,
                           detail="the displayed order is already the true order, so `identity` passes"))
    return out
