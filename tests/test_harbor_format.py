"""The Harbor task-directory format: task.toml models, the dataset loader, content hashes,
reward parsing, and the labels of the committed sample dataset. Pure Python on temporary
directories; every hostile input must come back as a problem or a typed error, never an
exception and never a hang."""

from __future__ import annotations

import hashlib
import json
import os
import time
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from environment.harbor.config import TaskConfig
from environment.harbor.reward import (
    MAX_REWARD_BYTES,
    Reward,
    RewardError,
    planted,
    planted_rewards,
    read_reward,
)
from environment.harbor.taskdir import (
    DatasetError,
    HarborTask,
    InvalidTask,
    Limits,
    load_dataset,
    load_task,
    strip_canary,
)
from validate.core.records import Reason

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"

MINIMAL_TOML = """schema_version = "1.4"
[task]
name = "t/minimal"
[verifier]
timeout_sec = 30
"""


def make_task(root: Path, name: str = "t1", *, toml: str | bytes = MINIMAL_TOML,
              instruction: str | None = "Do it.\n",
              dockerfile: str | None = "FROM python:3.11-slim-bookworm\n", test: str | None = "#!/bin/bash\n",
              solve: str | None = "#!/bin/bash\n") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "task.toml").write_bytes(toml if isinstance(toml, bytes) else toml.encode())
    for rel, text in (("instruction.md", instruction), ("environment/Dockerfile", dockerfile),
                      ("tests/test.sh", test), ("solution/solve.sh", solve)):
        if text is not None:
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
    return d


def only_problem(root: Path, name: str = "t1", limits: Limits = Limits()) -> str:
    got = load_task(root, name, limits)
    assert isinstance(got, InvalidTask), got
    return "; ".join(p.line() for p in got.problems)


# --- task.toml ---------------------------------------------------------------------------


def test_defaults_and_unknown_keys_are_ignored():
    c = TaskConfig.from_toml('future_key = 1\n[environment]\nshiny = "new"\n[verifier]\nalso = 2\n'
                             '[brand_new]\nx = 1\n')
    assert c.schema_version == "1.4" and c.task is None
    assert c.verifier.timeout_sec == 600 and c.environment.build_timeout_sec == 600
    assert c.environment.network_mode == "public" and c.agent.timeout_sec is None
    assert not c.verifier.separate() and c.agent_network() == ("public", [])


def test_every_section_parses():
    c = TaskConfig.from_toml("""
schema_version = "1.3"
[task]
name = "org/name"
version = "2"
authors = [{name = "A", email = "a@example.org"}]
keywords = ["k"]
[metadata]
difficulty = "hard"
nested = {x = [1, 2]}
[verifier]
timeout_sec = 90
env = {A = "1"}
user = "root"
network_mode = "allowlist"
allowed_hosts = ["Example.COM.", "*.example.org", "10.0.0.0/8", "::1"]
[agent]
timeout_sec = 30
user = 1000
network_mode = "no-network"
[environment]
cpus = 2.0
memory_mb = 4096
storage_mb = 10240
gpus = 0
workdir = "/app"
env = {B = "2"}
healthcheck = {command = "true", retries = 5}
[solution]
env = {C = "3"}
""")
    assert c.task.name == "org/name" and c.task.authors[0].email == "a@example.org"
    assert c.metadata["nested"] == {"x": [1, 2]}
    assert c.verifier_network() == ("allowlist", ["example.com", "*.example.org", "10.0.0.0/8", "::1"])
    assert c.agent_network() == ("no-network", []) and c.agent.user == 1000
    assert c.environment.cpus == 2 and c.environment.healthcheck.retries == 5 and c.solution.env == {"C": "3"}


def test_legacy_spellings():
    c = TaskConfig.from_toml('version = "1.0"\n[environment]\nmemory = "2G"\nstorage = "512M"\n'
                             'allow_internet = false\n')
    assert c.schema_version == "1.0" and c.environment.memory_mb == 2048 and c.environment.storage_mb == 512
    assert c.environment.network_mode == "no-network" and c.environment.allow_internet is None
    both = TaskConfig.from_toml('version = "1.0"\nschema_version = "1.4"\n[environment]\nmemory = "4096K"\n')
    assert both.schema_version == "1.4" and both.environment.memory_mb == 4
    explicit = TaskConfig.from_toml('[environment]\nnetwork_mode = "public"\nallow_internet = false\n')
    assert explicit.environment.network_mode == "public"  # the explicit mode wins, as in Harbor
    venv = TaskConfig.from_toml('[verifier.environment]\nallow_internet = true\n[environment]\n'
                                'allow_internet = false\n')
    assert (
        venv.verifier.environment.network_mode == "public" and venv.environment.network_mode == "no-network"
    )


@pytest.mark.parametrize("text,field", [
    ('[environment]\nmemory = "lots"\n', "environment"),
    ('[environment]\nmemory = "2G"\nmemory_mb = 1000\n', "environment"),
    ('[environment]\nnetwork_mode = "internet"\n', "environment.network_mode"),
    ('[environment]\nallowed_hosts = ["a.example"]\n', "environment"),
    ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["https://a.example/x"]\n', "agent.allowed_hosts"),
    ("[verifier]\ntimeout_sec = nan\n", "verifier.timeout_sec"),
    ("[agent]\ntimeout_sec = -1\n", "agent.timeout_sec"),
    ("[environment]\ncpus = inf\n", "environment.cpus"),
    ("[environment]\nmemory_mb = 0\n", "environment.memory_mb"),
    ('[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ndocker_image = "x"\n', "verifier"),
    ('[task]\nname = "no-slash"\n', "task.name"),
    ('[task]\nname = "a/../b"\n', "task.name"),
    ('[[steps]]\nname = ".."\n', "steps.0.name"),
    ('[[steps]]\nname = "a/b"\n', "steps.0.name"),
    ('[[steps]]\nname = "Step"\n[[steps]]\nname = "step"\n', "steps"),
    ('artifacts = ["/ok", "/app/../../etc"]\n', "artifacts.1.source"),
    ('artifacts = [{source = "/x", destination = "../../up"}]\n', "artifacts.0.destination"),
    ('artifacts = [{source = "/x", destination = "/abs"}]\n', "artifacts.0.destination"),
])
def test_invalid_values_name_their_field(text, field):
    with pytest.raises(ValidationError) as e:
        TaskConfig.from_toml(text)
    assert ".".join(str(p) for p in e.value.errors()[0]["loc"]) == field


def test_verifier_mode_follows_harbor():
    assert TaskConfig.from_toml('[verifier]\nenvironment_mode = "separate"\n').verifier.separate()
    assert TaskConfig.from_toml('[verifier.environment]\ndocker_image = "v"\n').verifier.separate()
    assert not TaskConfig.from_toml('[verifier]\nenvironment_mode = "shared"\n').verifier.separate()
    c = TaskConfig.from_toml('[verifier.environment]\nnetwork_mode = "no-network"\n[environment]\n'
                             'network_mode = "public"\n')
    assert c.verifier_network() == ("no-network", []) and c.agent_network() == ("public", [])


# --- the loader --------------------------------------------------------------------------


def test_a_good_task_loads(tmp_path):
    make_task(tmp_path, instruction="<!-- my-canary GUID 1234 -->\n# CANARY string\n\n\nSolve it.\n"
                                    "# canary later stays\n")
    t = load_task(tmp_path, "t1")
    assert isinstance(t, HarborTask), t
    assert t.instruction == "Solve it.\n# canary later stays\n"
    assert (t.environment, t.verifier, t.has_solution, t.steps) == ("dockerfile", "shared", True, [])
    assert [e.path for e in t.entries] == ["environment/Dockerfile", "instruction.md", "solution/solve.sh",
                                           "task.toml", "tests/test.sh"]


def test_strip_canary_like_harbor():
    assert strip_canary("# harbor-canary x\n\nBody\n") == "Body\n"
    assert strip_canary("Body\n# canary\n") == "Body\n# canary\n"
    assert strip_canary("<!-- not a marker -->\nBody") == "<!-- not a marker -->\nBody"
    assert strip_canary("  # Canary GUID  \n  \nBody") == "Body"


def test_kinds_of_environment_and_verifier(tmp_path):
    make_task(tmp_path, "image",
              toml=MINIMAL_TOML + '[environment]\ndocker_image = "python:3.11-slim-bookworm"\n',
              dockerfile=None)
    make_task(tmp_path, "compose", dockerfile=None)
    (tmp_path / "compose/environment").mkdir()
    (tmp_path / "compose/environment/docker-compose.yaml").write_text("services: {}\n")
    make_task(tmp_path, "sep", toml=MINIMAL_TOML + 'environment_mode = "separate"\n')
    (tmp_path / "sep/tests/Dockerfile").write_text("FROM x\n")
    make_task(tmp_path, "sep-image", toml=MINIMAL_TOML + '[verifier.environment]\ndocker_image = "v:1"\n')
    make_task(tmp_path, "sep-own", toml=MINIMAL_TOML + 'environment_mode = "separate"\n')
    make_task(tmp_path, "dockerfile-but-shared")
    (tmp_path / "dockerfile-but-shared/tests/Dockerfile").write_text("FROM x\n")
    make_task(tmp_path, "no-solution", solve=None)
    got = {t.id: t for t in load_dataset(tmp_path).tasks}
    assert got["image"].environment == "image" and got["image"].docker_image == "python:3.11-slim-bookworm"
    assert got["compose"].environment == "compose"
    assert (got["sep"].verifier, got["sep"].verifier_build) == ("separate", "dockerfile")
    assert got["sep-image"].verifier_build == "image" and got["sep-own"].verifier_build == "environment"
    # a tests/Dockerfile alone does not make it separate
    assert got["dockerfile-but-shared"].verifier == "shared"
    assert not got["no-solution"].has_solution


@pytest.mark.parametrize("setup,expect", [
    (lambda d: (d / "task.toml").unlink(), "task.toml: missing"),
    (lambda d: (d / "instruction.md").unlink(), "instruction.md: missing"),
    (lambda d: (d / "instruction.md").write_text("<!-- canary -->\n\n"), "instruction.md: empty"),
    (lambda d: (d / "environment/Dockerfile").unlink(), "no environment"),
    (lambda d: (d / "tests/test.sh").unlink(), "tests/test.sh: missing"),
    (lambda d: (d / "task.toml").write_bytes(b'[task]\nname = "o/\xff\xfe"\n'),
     "task.toml: not UTF-8 (byte 17)"),
    (lambda d: (d / "task.toml").write_text("[task\nname = 1\n"), "task.toml: not TOML"),
    (lambda d: (d / "task.toml").write_text("a = " + "[" * 50_000 + "]" * 50_000),
     "task.toml: nested too deeply"),
    (lambda d: (d / "task.toml").write_text('[metadata]\nm = ' + "{a = " * 5000 + "1" + "}" * 5000),
     "task.toml: nested"),
    (lambda d: (d / "task.toml").write_text("[environment]\ncpus = -2\n"), "task.toml [environment.cpus]"),
    (lambda d: (d / "task.toml").write_text('[[steps]]\nname = ".."\n'), "task.toml [steps.0.name]"),
    (lambda d: (d / "instruction.md").write_bytes(b"\x80abc"), "instruction.md: not UTF-8"),
    (lambda d: (d / "environment/passwd").symlink_to("/etc/passwd"), "environment/passwd: symlink out"),
    (lambda d: (d / "tests/up").symlink_to("../../.."), "tests/up: symlink out"),
    (lambda d: os.mkfifo(d / "tests/pipe"), "tests/pipe: not a regular file"),
    (lambda d: (d / os.fsdecode(b"tests/bad-\xff-name")).write_text("x"), "file name is not UTF-8"),
])
def test_every_malformed_task_is_a_problem_naming_the_file(tmp_path, setup, expect):
    setup(make_task(tmp_path))
    assert expect in only_problem(tmp_path)


def test_a_symlink_chain_that_leaves_the_task_is_caught(tmp_path):
    d = make_task(tmp_path)
    (tmp_path / "outside.txt").write_text("secret")
    (d / "tests/hop2").symlink_to("../../outside.txt")
    (d / "tests/hop1").symlink_to("hop2")
    (d / "tests/inside").symlink_to("test.sh")  # staying inside is fine
    problems = only_problem(tmp_path)
    assert "tests/hop1: symlink out" in problems and "tests/hop2: symlink out" in problems
    assert "tests/inside" not in problems


def test_internal_symlinks_are_hashed_by_target_not_followed(tmp_path):
    d = make_task(tmp_path)
    (d / "tests/alias").symlink_to("test.sh")
    (d / "tests/loop").symlink_to("loop")  # a loop resolves to itself, inside the task
    t = load_task(tmp_path, "t1")
    assert isinstance(t, HarborTask), t
    assert {e.path: e.digest for e in t.entries}["tests/alias"] == "symlink:test.sh"


def test_a_task_directory_that_is_a_symlink_is_refused(tmp_path):
    real = make_task(tmp_path / "elsewhere", "real")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds/linked").symlink_to(real)
    make_task(tmp_path / "ds", "fine")
    ds = load_dataset(tmp_path / "ds")
    assert [t.id for t in ds.tasks] == ["fine"]
    assert ds.invalid[0].id == "linked" and "is a symlink" in ds.invalid[0].problems[0].line()


def test_names_and_link_targets_that_are_not_utf8_are_problems_stored_escaped(tmp_path):
    """Bytes a task directory holds in a name are data: its task is invalid, its id and detail
    the bytes escaped, and the revision is still a hash (it once raised UnicodeEncodeError)."""
    make_task(tmp_path, os.fsdecode(b"bad\xffname"))
    good = make_task(tmp_path, "linked")
    os.symlink(b"/elsewhere\xfe", os.fsencode(good / "environment" / "link"))
    ds = load_dataset(tmp_path)
    problems = {t.id: [p.detail for p in t.problems] for t in ds.invalid}
    assert problems == {"bad\\xffname": ["the task directory's path is not UTF-8 (bad\\xffname, its bytes "
                                         "escaped); rename it"],
                        "linked": ["symlink out of the task directory (to '/elsewhere\\\\xfe')"]}
    assert ds.revision.startswith("sha256:") and json.dumps(ds.model_dump(), ensure_ascii=False).encode()


def test_huge_files_are_refused_unread(tmp_path):
    d = make_task(tmp_path)
    with open(d / "environment/blob.bin", "wb") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GiB of nothing, which a reader would take seconds on
    t0 = time.monotonic()
    assert "environment/blob.bin: file larger than" in only_problem(tmp_path)
    assert time.monotonic() - t0 < 2
    (d / "environment/blob.bin").unlink()
    (d / "task.toml").write_text(MINIMAL_TOML + "#" * 5000 + "\n")
    assert "task.toml: larger than 1000 bytes" in only_problem(tmp_path, limits=Limits(max_text_bytes=1000))
    for i in range(3):
        (d / f"environment/f{i}").write_bytes(b"x" * 600)
    assert "task larger than 1500 bytes" in only_problem(tmp_path, limits=Limits(max_task_bytes=1500))
    assert "more than 4 entries" in only_problem(tmp_path, limits=Limits(max_entries=4))


def test_dataset_layout_groups_and_bad_neighbours(tmp_path):
    make_task(tmp_path / "family-a", "one")
    make_task(tmp_path / "family-a", "two", toml=b"\xff\xfe not toml")
    make_task(tmp_path, "top")
    (tmp_path / "empty-leaf").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "README.md").write_text("dataset card\n")
    ds = load_dataset(tmp_path)
    assert [t.id for t in ds.tasks] == ["family-a/one", "top"]
    assert {t.id: t.problems[0].file for t in ds.invalid} == {"family-a/two": "task.toml",
                                                              "empty-leaf": "task.toml"}
    finding = ds.invalid[0].findings()[0]
    assert (finding.kind, finding.blocking) == ("malformed_task",
                                                True) and finding.detail.startswith("task.toml: ")
    with pytest.raises(DatasetError, match="not a directory"):
        load_dataset(tmp_path / "README.md")


# --- hashes -------------------------------------------------------------------------------


def _digest(entries: list[list[str]]) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(sorted(entries), separators=(",", ":"), ensure_ascii=False)
                                      .encode()).hexdigest()


def test_task_hash_is_the_documented_digest_of_the_whole_directory(tmp_path):
    d = make_task(tmp_path)
    t = load_task(tmp_path, "t1")
    files = sorted(p for p in d.rglob("*") if p.is_file())
    want = _digest([[p.relative_to(d).as_posix(), "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()]
                    for p in files])
    assert t.hash == want
    ds = load_dataset(tmp_path)
    assert ds.revision == _digest([[f"t1/{p.relative_to(d).as_posix()}",
                                    "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()] for p in files])


def test_hashes_move_with_every_byte_and_name_and_nothing_else(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_task(a, "x", test="#!/bin/bash\necho 1\n")
    # the same content written in another order, with other mtimes and modes
    d = b / "x"
    for rel in [
        "tests/test.sh",
        "solution/solve.sh",
        "environment/Dockerfile",
        "instruction.md",
        "task.toml",
    ]:
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes((a / "x" / rel).read_bytes())
    (d / "tests/test.sh").chmod(0o755)
    os.utime(d / "task.toml", (0, 0))
    base = load_dataset(a)
    assert load_dataset(b).revision == base.revision
    assert load_task(b, "x").hash == load_task(a, "x").hash
    (d / "tests/test.sh").write_text("#!/bin/bash\necho 2\n")
    assert load_dataset(b).revision != base.revision
    (d / "tests/test.sh").write_bytes((a / "x/tests/test.sh").read_bytes())
    (d / "tests/test.sh").rename(d / "tests/test2.sh")
    assert load_dataset(b).revision != base.revision
    (d / "tests/test2.sh").rename(d / "tests/test.sh")
    (b / "x").rename(b / "y")
    assert load_task(b, "y").hash == load_task(a, "x").hash  # a task's hash is relative to the task
    assert load_dataset(b).revision != base.revision  # the revision names where each task is


def test_an_invalid_task_still_counts_in_the_revision(tmp_path):
    make_task(tmp_path, "good")
    bad = make_task(tmp_path, "bad", instruction=None)
    before = load_dataset(tmp_path).revision
    (bad / "tests/test.sh").write_text("#!/bin/bash\nexit 3\n")
    assert load_dataset(tmp_path).revision != before


# --- rewards ------------------------------------------------------------------------------


@pytest.mark.parametrize("files,values", [
    ({"reward.txt": b"1"}, {"reward": 1.0}),
    ({"reward.txt": b" 0.25\n"}, {"reward": 0.25}),
    ({"reward.txt": b"1e-1"}, {"reward": 0.1}),
    ({"reward.json": b"0"}, {"reward": 0.0}),
    ({"reward.json": b'{"b": 0.5, "a": 1}', "reward.txt": b"0"}, {"a": 1.0, "b": 0.5}),
    ({"reward.txt": b"0.5", "other.log": b"junk"}, {"reward": 0.5}),
])
def test_usable_rewards(files, values):
    got = read_reward(files)
    assert isinstance(got, Reward) and got.values == values
    assert got.source == ("reward.json" if "reward.json" in files else "reward.txt")


@pytest.mark.parametrize("files,kind", [
    ({}, "missing"),
    ({"result.txt": b"1"}, "missing"),
    ({"reward.txt": b""}, "empty"),
    ({"reward.txt": b" \n\t"}, "empty"),
    ({"reward.txt": b"PASSED"}, "unparsable"),
    ({"reward.txt": b"0.5\n0.7"}, "unparsable"),
    ({"reward.txt": b"1_0"}, "unparsable"),
    ({"reward.txt": "١".encode()}, "unparsable"),
    ({"reward.txt": b"0x1"}, "unparsable"),
    ({"reward.txt": b"nan"}, "non_finite"),
    ({"reward.txt": b"-Infinity"}, "non_finite"),
    ({"reward.txt": b"1e999"}, "non_finite"),
    ({"reward.txt": b"100"}, "out_of_range"),
    ({"reward.txt": b"-0.1"}, "out_of_range"),
    ({"reward.txt": b"\xff\xfe1"}, "not_utf8"),
    ({"reward.txt": b"0" * (MAX_REWARD_BYTES + 1)}, "too_large"),
    ({"reward.json": b"NaN"}, "non_finite"),
    ({"reward.json": b'{"reward": Infinity}'}, "non_finite"),
    ({"reward.json": b"1e309"}, "non_finite"),
    ({"reward.json": b"1" + b"0" * 400}, "non_finite"),
    ({"reward.json": b'{"reward": 1, "style": NaN}'}, "non_finite"),
    ({"reward.json": b"true"}, "non_numeric"),
    ({"reward.json": b'"1"'}, "non_numeric"),
    ({"reward.json": b"[1]"}, "non_numeric"),
    ({"reward.json": b"{}"}, "non_numeric"),
    ({"reward.json": b'{"reward": {"inner": 1}}'}, "non_numeric"),
    ({"reward.json": b'{"reward": null}'}, "non_numeric"),
    ({"reward.json": b'{"reward": 1, "reward": 0}'}, "unparsable"),
    ({"reward.json": b'{"\\ud800": 1}'}, "unparsable"),  # a lone surrogate's escape: no text names the key
    ({"reward.json": b'{"reward": 1, "\\udcff": 1}'}, "unparsable"),
    ({"reward.json": b"1 2"}, "unparsable"),
    ({"reward.json": b"[" * 60_000}, "unparsable"),  # deeper than the recursion limit
    ({"reward.json": b'{"a": 1, "b": 3}'}, "out_of_range"),
    # reward.json wins even when it is unusable: a broken JSON never hands the decision to reward.txt
    ({"reward.json": b"garbage", "reward.txt": b"1"}, "unparsable"),
])
def test_unusable_rewards_are_typed_errors(files, kind):
    got = read_reward(files)
    assert isinstance(got, RewardError), got
    assert got.kind == kind and got.line()


@pytest.mark.parametrize("files,value,exact", [
    ({"reward.txt": b"0.99999999999999999999"}, 1.0, "0.99999999999999999999"),
    ({"reward.json": b'{"reward": 0.99999999999999999999}'}, 1.0, "0.99999999999999999999"),
    ({"reward.txt": b"1e-400"}, 0.0, "1E-400"),
    ({"reward.txt": b"0.7"}, 0.7, None),  # the float's own shortest text: nothing to keep
    ({"reward.json": b"1"}, 1.0, None),
])
def test_a_reward_keeps_its_exact_text_where_the_float_misreads_it(files, value, exact):
    got = read_reward(files)
    assert got.values == {"reward": value} and got.exact.get("reward") == exact


@pytest.mark.parametrize("text", [b"1.00000000000000001", b"-1e-400"])
def test_the_range_is_held_exactly(text):
    """Each one's nearest float (1.0, -0.0) lies in [0, 1]; the number written does not."""
    assert read_reward({"reward.txt": text}).kind == "out_of_range"


def test_reward_range_is_the_callers():
    assert isinstance(read_reward({"reward.txt": b"100"}, low=0, high=100), Reward)
    assert read_reward({"reward.json": b'{"a": 0.2}'}, low=0.5).kind == "out_of_range"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["reward.json", "reward.txt", "x"]), st.binary(max_size=64)))
def test_any_bytes_give_a_result_never_an_exception(files):
    got = read_reward(files)
    if isinstance(got, Reward):
        assert got.values and all(0.0 <= v <= 1.0 for v in got.values.values())


def test_planted_files_are_recorded():
    found = planted({"reward.txt": b"1", "reward.json": b'{"reward": 1}', "notes/keep.txt": b"x"})
    assert [p.path for p in found] == ["notes/keep.txt", "reward.json", "reward.txt"]
    assert found[2].sha256 == "sha256:" + hashlib.sha256(b"1").hexdigest() and found[2].size == 1
    assert [p.path for p in planted_rewards({"a/reward.txt": b"1", "b.txt": b""})] == ["a/reward.txt"]
    assert planted({}) == []


# --- the sample dataset -------------------------------------------------------------------

SOUND_KINDS = {"edit-config", "c-fix-build", "pytest-in-tests", "sqlite-archive", "loopback-service",
               "unicode-names"}
EVERY_OUTCOME = {"oracle-fails", "nop-passes", "answer-in-image", "answer-in-git-history",
                 "no-reward-written", "flaky-test", "verifier-needs-network", "unmapped-base",
                 "copy-outside-context", "gpu-required", "solve-too-slow", "verifier-hangs",
                 "garbage-reward-txt", "multi-key-reward", "separate-verifier", "no-solution",
                 "python-pytest", "install-local-deb"}


def _labels() -> dict[str, tuple[str, str]]:
    import tomllib

    out = {}
    for d in sorted(p for p in SAMPLE.iterdir() if p.is_dir()):
        meta = tomllib.loads((d / "task.toml").read_text()).get("metadata", {})
        out[d.name] = (meta.get("expected_verdict"), meta.get("expected_reason"))
    return out


def test_the_sample_dataset_is_labelled_with_the_harness_vocabulary():
    labels = _labels()
    reasons = set(typing.get_args(Reason))  # no_reference_solution included
    assert len(labels) >= 30
    for name, (verdict, reason) in labels.items():
        assert (verdict, reason == "") in (("compatible", True), ("excluded", False)), name
        assert verdict == "compatible" or reason in reasons, (name, reason)
    assert sum(v == "compatible" for v, _ in labels.values()) >= 10
    assert SOUND_KINDS <= {n for n, (v, _) in labels.items() if v == "compatible"}
    assert EVERY_OUTCOME <= set(labels)


def test_the_sample_dataset_loads_as_labelled():
    ds = load_dataset(SAMPLE)
    assert {t.id for t in ds.invalid} == {"bad-task-toml", "no-instruction"}
    assert all(_labels()[t.id] == ("excluded", "invalid_task_or_verifier") for t in ds.invalid)
    tasks = {t.id: t for t in ds.tasks}
    assert any("é" in e.path for e in tasks["unicode-names"].entries)
    assert tasks["no-solution"].has_solution is False and tasks["separate-verifier"].verifier == "separate"
    assert tasks["gpu-required"].config.environment.needs_gpu() and tasks["multi-step"].steps == [
        "write",
        "double",
    ]
    assert tasks["csv-to-json"].config.environment.memory_mb == 1024
    assert not tasks["csv-to-json"].instruction.lstrip().startswith(("<!--", "#"))
    for t in ds.tasks:
        df = Path(SAMPLE, t.id, "environment/Dockerfile")
        if df.exists() and t.id != "unmapped-base":
            assert df.read_text().startswith(("FROM python:3.11-slim-bookworm\n",
                                              "FROM debian:bookworm-slim\n")), t.id


def test_a_task_directory_given_as_the_dataset_is_refused_in_one_line(tmp_path):
    d = make_task(tmp_path)
    with pytest.raises(DatasetError, match="is itself a task directory"):
        load_dataset(d)


def test_base_images_are_read_from_the_dockerfile(tmp_path):
    make_task(tmp_path, dockerfile="""# syntax=docker/dockerfile:1
FROM --platform=linux/amd64 golang:1.22 AS Build
RUN go build \\
  FROM not-an-image
FROM build
from python:3.11-slim-bookworm
ARG BASE=debian:bookworm-slim
FROM ${BASE}
FROM scratch
""")
    t = load_task(tmp_path, "t1")
    assert t.base_images == ["golang:1.22", "python:3.11-slim-bookworm", "${BASE}"]
    ds = {t.id: t for t in load_dataset(SAMPLE).tasks}
    assert ds["unmapped-base"].base_images == ["ubuntu:24.04"]
    assert ds["prebuilt-image"].base_images == [] and ds["edit-config"].base_images == [
        "python:3.11-slim-bookworm"
    ]


def test_a_file_edited_between_hashing_and_parsing_is_a_problem(tmp_path, monkeypatch):
    import environment.harbor.taskdir as taskdir

    d = make_task(tmp_path)
    walk = taskdir._walk

    def walk_then_edit(task_dir, limits):
        got = walk(task_dir, limits)
        # after hashing, before parsing
        (d / "task.toml").write_text(MINIMAL_TOML + "[environment]\ngpus = 8\n")
        return got

    monkeypatch.setattr(taskdir, "_walk", walk_then_edit)
    assert "task.toml: changed while the task was being read" in only_problem(tmp_path)


def test_an_internal_symlink_to_the_config_is_read_and_checked(tmp_path):
    d = make_task(tmp_path)
    (d / "config").mkdir()
    (d / "task.toml").rename(d / "config/task.toml")
    (d / "task.toml").symlink_to("config/task.toml")
    t = load_task(tmp_path, "t1")
    assert isinstance(t, HarborTask) and t.config.task.name == "t/minimal"
