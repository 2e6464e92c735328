"""A Harbor task-directory dataset behind the environment seam: config, taskset, findings.

The dataset is found by its revision, not by the working directory: `load` tries the
config's ``dataset`` path as given, then each ``--data`` path (a folder holding a directory
or file of that name, or the dataset itself), then that path below the project's root. At
freeze time (no revision yet) the first dataset found is used and its revision (a sha256
over every file of every task, `environment.harbor.taskdir`) becomes the contract's;
afterwards only a dataset with that revision is.

A dataset is a directory of task directories, or one as it is published
(`environment.harbor.published`): a Parquet file, or a folder of them, holding a row per
task with the task directory packed in it, or ``hf://owner/name@revision``, such a folder on
the Hugging Face Hub (`environment.harbor.hub`). A published dataset's revision is the
sha256 over its files' hashes; its source record (the files, and on the Hub the commit the
revision resolved to) is the taskset's ``source``, which the contract freezes and hands back
(`LoadHints.source`) so a later load reads that commit and those bytes only. Its rows are
unpacked into a private directory, and its tasks read from there like a directory's.

A task is one task directory, in the loader's sorted order: its id is the directory's path
in the dataset, its hash covers the whole directory, its prompt is ``instruction.md``. Its
family is the ``[metadata]`` key the config names (``category``, ``difficulty``) or, without
one, its top folder. A task that did not parse keeps its place with the loader's problems as
blocking findings (``invalid_task_or_verifier``, naming the file), so the rest of the
dataset still validates.

How an attempt at these tasks is played (the task's image, the agent, the verifier inside
the container) is the harness's ``trial`` attempt kind; nothing here runs anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from environment.harbor.hub import is_hub, snapshot
from environment.harbor.patches import TaskPatch, patched_copy, read_patch_set
from environment.harbor.published import (
    ARCHIVE,
    PublishedSource,
    is_published,
    open_source,
    parquet_files,
    unpack_source,
)
from environment.harbor.reward import ALL_KEYS, read_record
from environment.harbor.taskdir import DatasetError, HarborDataset, HarborTask, InvalidTask, load_dataset
from environment.protocol import (
    AgentSpec,
    ConfigError,
    Environment,
    Finding,
    LoadHints,
    MetaValue,
    Score,
    canonical_json,
    meta_value,
    sha256_tag,
)

ENV_NAME = "harbor"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
AGENTS = Path(__file__).resolve().parent / "agents"


class HarborConfig(BaseModel):
    """What a Harbor dataset's contract freezes about reading it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(min_length=1, description="The dataset: a directory (every task directory under it "
                                                   "is a task), a Parquet file or folder of them in the "
                                                   "published shape (a row per task: path, task_binary), "
                                                   "found as given, under each --data path, or below the "
                                                   "project; or hf://owner/name@revision on the Hugging Face "
                                                   "Hub (the hub extra).")
    family_key: str | None = Field(default=None, min_length=1,
                                   description="The [metadata] key whose value is a task's family (e.g. "
                                               "category); unset: the task's top folder.")
    reward_key: str = Field(default="reward", min_length=1, max_length=128,
                            description="Which reward must reach the pass threshold: a reward.json key "
                                        "(default 'reward', Harbor's; reward.txt and a bare number are "
                                        f"'reward'), or '{ALL_KEYS}': every key the verifier wrote (the "
                                        "task's reward is then the least of them). A key the rule names but "
                                        "the reward lacks is a verifier error, never a pass and never a 0.")
    patches: str | None = Field(default=None, min_length=1,
                                description="A directory of offline patches, one <task id>.diff per task, "
                                            "applied to a copy of the dataset (found like the dataset); the "
                                            "contract holds the patched tasks' hashes.")


@dataclass(frozen=True)
class HarborTaskRef:
    """One task of the dataset, as the harness's `Task` protocol sees it."""

    id: str
    idx: int
    hash: str
    prompt: str
    family: str
    meta: Mapping[str, MetaValue]
    #: The parsed task, or None when it did not parse (its findings say why).
    parsed: HarborTask | None
    problems: tuple[Finding, ...] = ()
    files: Mapping[str, bytes] = field(default_factory=dict)
    requires_network_isolation: bool = True

    @property
    def answer_key(self) -> bytes:
        return b""  # the reference solution stays in the task directory; only the oracle's trial gets it


def _meta(metadata: Mapping[str, object]) -> dict[str, MetaValue]:
    """The whole [metadata] table, every key and TOML type (a float, a list of tags, a nested
    table, a date), as the JSON values `meta_value` defines, sorted."""
    return {k: meta_value(v) for k, v in sorted(metadata.items())}


class HarborTaskset:
    """The tasks of one dataset directory, in the loader's order."""

    metric_names: tuple[str, ...] = ()

    def __init__(self, found: Found, config: HarborConfig) -> None:
        self.root, self.dataset, self.config = found.root, found.dataset, config
        self.revision = found.dataset.revision
        self.patches = {p.task_id: p for p in found.patches}
        self.data_files = found.sources or (found.root,)
        #: A published dataset's source record (`PublishedSource`), frozen in the contract.
        self.source = None if found.source is None else found.source.model_dump(mode="json",
                                                                                exclude_none=True)
        self.columns = found.columns

    @cached_property
    def _tasks(self) -> list[HarborTaskRef]:
        loaded: list[HarborTask | InvalidTask] = sorted([*self.dataset.tasks, *self.dataset.invalid],
                                                        key=lambda t: t.id)
        return [self._ref(i, t) for i, t in enumerate(loaded)]

    def _ref(self, idx: int, t: HarborTask | InvalidTask) -> HarborTaskRef:
        top = t.id.split("/")[0] if "/" in t.id else "tasks"
        if isinstance(t, InvalidTask):
            patch = self.patches.get(t.id)
            return HarborTaskRef(id=t.id, idx=idx, hash=t.hash, prompt="", family=top, meta={}, parsed=None,
                                 problems=(*t.findings(), *((patch.finding(),) if patch else ())))
        meta = {**_meta(t.config.metadata), **self.columns.get(t.id, {})}
        key = self.config.family_key
        family = str(meta[key]) if key is not None and key in meta else top
        patch = self.patches.get(t.id)
        return HarborTaskRef(id=t.id, idx=idx, hash=t.hash, prompt=t.instruction, family=family, meta=meta,
                             parsed=t, problems=(patch.finding(),) if patch else ())

    @property
    def size(self) -> int:
        return len(self._tasks)

    def task(self, idx: int) -> HarborTaskRef:
        if not 0 <= idx < len(self._tasks):
            raise IndexError(f"task idx {idx}: the dataset has {len(self._tasks)} tasks")
        return self._tasks[idx]

    def task_dir(self, task: HarborTaskRef) -> Path:
        return self.root / task.id

    def score(self, task: HarborTaskRef, reply: bytes, cache_dir: Path | None = None) -> Score:
        """A task is scored by its own verifier inside its container (the ``trial`` attempt
        kind); its reply is the `VerifierRecord` of what the verifier wrote, and this reads the
        reward from it again by Harbor's rule (raising `VerifierFailed` where it gave none), with
        its exact text where the float misreads it (`Score.exact`)."""
        got = read_record(reply, self.config.reward_key)
        return Score(got.reward, {}, got.exact)


def _places(location: str, hints: LoadHints, loose: bool = True) -> list[Path]:
    """Where `location` may lie: as given, under (or, when `loose` or the name matches, as)
    each ``--data`` path, below the project."""
    name = Path(location).name
    search = [p / name if (p / name).exists() else p for p in hints.search if loose or (p / name).is_dir()
              or p.name == name]
    return list(dict.fromkeys([Path(location), *search, PROJECT_ROOT / location]))


@dataclass(frozen=True)
class Found:
    """A dataset found: the directory its tasks are read from, the dataset, the patches
    applied, the places it was read from, and for a published dataset its source record and
    each task's row columns."""

    root: Path
    dataset: HarborDataset
    patches: list[TaskPatch] = field(default_factory=list)
    sources: tuple[Path, ...] = ()
    source: PublishedSource | None = None
    columns: Mapping[str, Mapping[str, MetaValue]] = field(default_factory=dict)


def _pinned(location: str, hints: LoadHints) -> str | None:
    """The commit a contract froze for `location` (a Hub dataset), if it froze one."""
    src = hints.source or {}
    return src.get("commit") if src.get("kind") == "hub" and src.get("location") == location else None


def _published(files: list[tuple[str, Path]], kind, location: str, hints: LoadHints, **hub) -> Found | None:
    """A published dataset's files, unpacked, unless their bytes are not the contract's."""
    source = open_source(files, kind, location, **hub)
    frozen = (hints.source or {}).get("files")
    if frozen is not None and frozen != source.files:
        return None  # not the files the contract froze: nothing to unpack
    root, dataset, columns = unpack_source(source, files, log=hints.log)
    return Found(root, dataset, source=source, columns=columns)


def _open(place: Path, location: str, hints: LoadHints) -> Found | None:
    """The dataset at `place`: a Parquet file, a folder of them, or a directory of tasks."""
    if place.is_file() and place.suffix == ".parquet":
        return _published([(place.name, place)], "parquet", location, hints)
    if not place.is_dir():
        return None
    if is_published(place):
        return _published(parquet_files(place), "parquet", location, hints)
    try:
        return Found(place.resolve(), load_dataset(place), sources=(place.resolve(),))
    except DatasetError:
        return None


def _candidates(location: str, hints: LoadHints):
    """Every dataset `location` may name, as (where it was tried, what was found there)."""
    if is_hub(location):
        folder, repo, requested, commit = snapshot(location, _pinned(location, hints),
                                                   hints.log or (lambda m: None))
        files = parquet_files(folder)
        if not files:
            raise ConfigError(f"dataset: {location} (commit {commit}) holds no Parquet files; a published "
                              f"Harbor dataset has one row per task ('path', '{ARCHIVE}')")
        if hints.log:
            hints.log(f"dataset {location}: commit {commit}, {len(files)} Parquet file(s)")
        found = _published(files, "hub", location, hints, repo=repo, requested=requested, commit=commit)
        yield f"{location} (commit {commit})", found and dataclasses.replace(found, sources=(folder,))
        return
    for place in _places(location, hints):
        yield str(place), _open(place, location, hints)


def _revision(found: Found, patched: HarborDataset) -> str:
    """A patched dataset's revision: the patched tasks', and for a published one its source's too."""
    if found.source is None:
        return patched.revision
    return sha256_tag(canonical_json([found.source.revision(), patched.revision]))


def _with_patches(found: Found, patch_dirs: list[Path], errors: list[ConfigError]) -> Iterable[Found]:
    dataset = found.dataset
    ids = sorted([*(t.id for t in dataset.tasks), *(t.id for t in dataset.invalid)])
    for patch_dir in patch_dirs:
        try:
            patches = read_patch_set(patch_dir, ids)
            copy = patched_copy(found.root, dataset.revision, patches)
        except ConfigError as e:  # this patch set is not for this dataset; say so if nothing else fits
            errors.append(e)
            continue
        patched = load_dataset(copy)
        loaded = {t.id for t in patched.tasks}
        # rows refused before anything was unpacked stay refused, in their place
        kept = [t for t in dataset.invalid if not (copy / t.id).is_dir() and t.id not in loaded]
        patched = patched.model_copy(update={"revision": _revision(found, patched),
                                             "invalid": [*patched.invalid, *kept]})
        yield dataclasses.replace(found, root=copy, dataset=patched, patches=patches,
                                  sources=(*found.sources, patch_dir.resolve()))


def find_dataset(location: str, hints: LoadHints, patches: str | None = None) -> Found:
    """The dataset the config and hints point at, loaded, with the patch set applied when
    there is one (see the module docstring and `environment.harbor.patches`)."""
    patch_dirs = [p for p in _places(patches, hints, loose=False) if p.is_dir()] if patches else []
    if patches and not patch_dirs:
        raise ConfigError(f"patches: no directory {patches!r} at "
                          f"{', '.join(map(str, _places(patches, hints, loose=False)))}; pass its location "
                          "with --data PATH")
    tried: list[str] = []
    errors: list[ConfigError] = []
    for where, found in _candidates(location, hints):
        tried.append(where)
        if found is None:
            continue
        for candidate in (_with_patches(found, patch_dirs, errors) if patch_dirs else (found,)):
            if hints.revision is None or candidate.dataset.revision == hints.revision:
                return candidate
    if errors:
        raise errors[0]
    want = f" with revision {hints.revision}" if hints.revision else ""
    raise ConfigError(f"dataset: no Harbor dataset directory{want} at {', '.join(tried)}; pass its location "
                      "with --data PATH (a dataset is a directory of tasks, a Parquet file or folder of them "
                      "in the published shape, or hf://owner/name@revision)")


class HarborEnvironment(Environment):
    """Harbor task directories: each task its own image, reference solution and in-container
    verifier, played by the ``trial`` attempt kind."""

    name = ENV_NAME
    Config = HarborConfig
    attempt_kind = "trial"

    def load(self, config: HarborConfig, hints: LoadHints = LoadHints()) -> HarborTaskset:
        return HarborTaskset(find_dataset(config.dataset, hints, config.patches), config)

    def agents(self, config: HarborConfig) -> Sequence[AgentSpec]:
        return [
            AgentSpec(name="oracle", role="oracle", program=AGENTS / "oracle.sh",
                      tests="the task's reference solution (solution/solve.sh) passes its verifier"),
            AgentSpec(name="nop", role="control", program=AGENTS / "nop.sh", baseline=True,
                      tests="an untouched container: a pass means the verifier checks nothing "
                            "the agent must do"),
            AgentSpec(name="reward-forger", role="control", program=AGENTS / "forger.sh",
                      tests="the reward channel: both reward files planted and rewritten by a "
                            "process left behind"),
            AgentSpec(name="test-reader", role="control", program=AGENTS / "reader.py",
                      tests="answers left in the image: test files, solutions, expected outputs, checksums "
                            "copied into the places the instruction names"),
            AgentSpec(name="history-miner", role="control", program=AGENTS / "miner.py",
                      tests="answers in version-control history: every file restored from .git objects, "
                            "stashes and refs under the filesystem"),
            AgentSpec(name="tamper-binaries", role="control", program=AGENTS / "tamper_binaries.sh",
                      tampers=True, tests="the verifier's programs replaced in place (the shells, python3, "
                            "pytest, every program test.sh names) by a script that writes a passing reward"),
            AgentSpec(name="tamper-path", role="control", program=AGENTS / "tamper_path.sh", tampers=True,
                      tests="the verifier's programs shadowed earlier on PATH, and pytest as a module in the "
                            "working directory"),
            AgentSpec(name="tamper-python", role="control", program=AGENTS / "tamper_python.sh", tampers=True,
                      tests="Python start-up hooks: a .pth file, sitecustomize.py and usercustomize.py in "
                            "every site directory, making the verifier's Python processes pass"),
            AgentSpec(name="tamper-pytest", role="control", program=AGENTS / "tamper_pytest.sh", tampers=True,
                      tests="pytest hooks on the tests' ancestors: conftest.py and pytest's configuration "
                            "files at / and on the working directory's path"),
            AgentSpec(name="tamper-loader", role="control", program=AGENTS / "tamper_loader.sh", tampers=True,
                      support=(AGENTS / "hook.c",),
                      tests="the dynamic linker: a library preloaded into every program (/etc/ld.so.preload, "
                            "resolved through a regenerated cache) that writes a passing reward"),
        ]

    def findings(self, task: HarborTaskRef) -> list[Finding]:
        return list(task.problems)

    def not_applicable(self, agent: AgentSpec, task: HarborTaskRef) -> str | None:
        """No agent plays a task that did not load (its findings say why); the oracle (by its
        declared role) does not play a task without a reference solution, which its controls
        still test (the verdict: ``no_reference_solution``, runtime-tested only)."""
        if task.parsed is None:
            return "the task did not load (its findings name the file)"
        if agent.role == "oracle" and not task.parsed.has_solution:
            return (
                "no solution/solve.sh: the task ships no reference solution, so the oracle cannot certify it"
            )
        return None
