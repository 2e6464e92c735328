"""The names rule of issue 18: every file name of a run directory is spelled once, in
`validate.core.paths`, and every role once, in `validate.core.records`; any other module names them
through those constants. This reads every module under validate/ (its AST, so comments and
docstrings are free to mention a file) and fails naming each module:line that spells one.

What counts as spelling a file name: a string constant that is a run directory's file name
(or a distinctive directory name: scorer-cache, checksums), or a relative path one of whose
parts is any name of the tree (``"run/attempts.parquet"``, ``"smoke/"``). Prose (a string with
a space in it) is not a spelling. A role is spelled when a role string is compared with a
role (``a.role == "oracle"``, ``row["role"] in ("oracle", "control")``), passed as ``role=``
or to ``named(...)``, or listed among other roles (a tuple, or the keys of a dict): the same
words are also phase names, table headers and JSON keys of the chat API, which are not roles.

The run kind is read from what a run declares (`validate.evidence.summary.run_kind`); the last tests
hold it to every committed run and to its one documented guess.
"""

from __future__ import annotations

import ast
from pathlib import Path

import validate.core.paths as paths
from validate.core.records import ROLES

VALIDATE = Path(paths.__file__).resolve().parents[1]
HOME = {"names": VALIDATE / "core" / "paths.py", "roles": VALIDATE / "core" / "records.py"}

#: Modules being restructured on another branch when this rule was written: their spellings
#: are listed in that branch's hand-over and replaced when it merges. Remove each entry then;
#: `test_pending_modules_still_exist` keeps the list from outliving them silently.
PENDING: set[str] = set()

TREE = paths.RUN_DIRECTORY_NAMES
#: The names that are never ordinary words ("run", "smoke", "reports" are also commands and phases).
DISTINCT = {n for n in TREE if "." in n} | {paths.SCORER_CACHE, paths.CHECKSUMS}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _spells_file(s: str) -> bool:
    # prose; absolute paths and URLs name none
    if any(c.isspace() for c in s) or s.startswith("/") or "://" in s:
        return False
    if s in DISTINCT:
        return True
    return "/" in s and any(part in TREE for part in s.split("/"))


def _roles_in(node: ast.AST) -> list[str]:
    """The role strings `node` is (a constant) or lists (a tuple, list or set of constants)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [x.value for x in items if isinstance(x, ast.Constant) and x.value in ROLES]


def _is_role(node: ast.AST) -> bool:
    """`node` reads a role: ``x.role``, ``x["role"]``, ``x.get("role")``, ``role``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "role"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "role"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "role"
    return isinstance(node, ast.Name) and node.id == "role"


def _role_spellings(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(_is_role(s) for s in sides) and any(_roles_in(s) for s in sides)
    if isinstance(node, ast.keyword):
        return node.arg == "role" and bool(_roles_in(node.value))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "named":
        return any(_roles_in(a) for a in node.args)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return len(node.elts) >= 2 and len(_roles_in(node)) == len(node.elts)
    if isinstance(node, ast.Dict):
        keys = [k for k in node.keys if k is not None]
        return len(keys) >= 2 and len(_roles_in(ast.Tuple(elts=keys))) == len(keys)
    return False


def violations(source: str, where: str, *, names: bool = True, roles: bool = True) -> list[str]:
    """Each ``where:line: what`` of `source` that spells a run-directory name or a role."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if names and isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                and _spells_file(node.value):
            out.append(f"{where}:{node.lineno}: spells the run-directory name {node.value!r} (use "
                       "validate.core.paths)")
        if roles and _role_spellings(node):
            line = getattr(node, "lineno", None) or getattr(node.value, "lineno", "?")
            out.append(f"{where}:{line}: spells a role as a string (use "
                       "validate.core.records' Role constants)")
    return out


def _modules() -> list[Path]:
    return sorted(p for p in VALIDATE.rglob("*.py") if p.relative_to(VALIDATE).as_posix() not in PENDING)


def test_run_directory_names_and_roles_are_spelled_once():
    found = []
    for p in _modules():
        where = f"validate/{p.relative_to(VALIDATE).as_posix()}"
        found += violations(p.read_text(encoding="utf-8"), where, names=p != HOME["names"],
                            roles=p != HOME["roles"])
    assert not found, "names spelled outside their defining module:\n" + "\n".join(found)


def test_the_rule_catches_each_kind_of_spelling():
    src = '''
def f(a, root, rules, exp, row):
    """Reads root / "run.json" in its docstring: free."""
    x = root / "run.json"
    y = root / "run/attempts.parquet"
    z = rules[a].role == "oracle"
    w = row["role"] in ("oracle", "control")
    v = exp.named("control")
    rank = {"oracle": 0, "control": 1}
    m = dict(role="model")
    ok = ("run.json is prose", "smoke", {"model": "gpt"}, row["phase"] == "oracle")
'''
    found = violations(src, "m.py")
    assert [f.split(": ")[0] for f in found].count("m.py:4") == 1
    assert any(f.startswith("m.py:5:") for f in found)
    assert sorted({int(f.split(":")[1]) for f in found}) == [4, 5, 6, 7, 8, 9, 10]


def test_pending_modules_still_exist():
    assert all((VALIDATE / p).is_file() for p in PENDING), "a PENDING module is gone: drop it from PENDING"


def test_every_name_constant_is_in_the_tree():
    """A name added to validate/core/paths.py without joining RUN_DIRECTORY_NAMES would go unguarded."""
    sandbox = {"DEFAULT_IMAGE", "SANDBOX_WORKSPACE", "SANDBOX_AGENT", "SANDBOX_ANSWER_KEY", "REPLY_FILE",
               "TASK_IMAGES"}  # the image store's, not a run directory's
    constants = {v for k, v in vars(paths).items() if k.isupper() and isinstance(v, str) and k not in sandbox}
    assert constants == set(TREE)


def test_the_tree_docstring_draws_every_name():
    drawn = paths.__doc__
    missing = sorted(n for n in TREE if n not in drawn)
    assert not missing, f"validate/core/paths.py's docstring does not draw {missing}"


# --- the run kind: read from what a run declares, guessed in one place ------------------------

LEDGERS = VALIDATE.parent / "ledgers"


def test_run_kind_reads_what_each_committed_run_declares():
    import json

    from validate.evidence.summary import run_kind

    runs = sorted(p for p in LEDGERS.iterdir() if (p / paths.CHECKSUMS).is_file())
    assert len(runs) >= 3
    for root in runs:
        if (root / paths.EVAL_CONTRACT).is_file():
            assert json.loads((root / paths.EVAL_CONTRACT).read_bytes())["kind"] == run_kind(root) == "eval"
        else:
            assert run_kind(root) == json.loads((root / paths.SUMMARY).read_bytes())["kind"], root


def test_run_kind_guesses_only_when_nothing_declares_it(tmp_path):
    from validate.evidence.summary import run_kind

    assert run_kind(tmp_path) == "run"  # nothing recorded yet: a dataset run, as before
    (tmp_path / paths.SUMMARY).write_text('{"kind": "pilot", "whatever": 1}')
    assert run_kind(tmp_path) == "pilot"
    (tmp_path / paths.SUMMARY).write_text('{"kind": "other"}')
    assert run_kind(tmp_path) == "run"  # a kind no run has: not a declaration; the audit says why
    (tmp_path / paths.EVAL_CONTRACT).write_bytes(b"\xff not json")
    assert run_kind(tmp_path) == "eval"  # an eval contract's presence still decides, exactly as before
    (tmp_path / paths.EVAL_CONTRACT).write_text('{"kind": "eval"}')
    (tmp_path / paths.SUMMARY).write_text('{"kind": "pool"}')
    assert run_kind(tmp_path) == "eval"
