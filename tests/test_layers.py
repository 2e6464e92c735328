"""The layering of the house, read from the code: every import of every module under
``validate/`` and ``environment/`` (at module level and inside functions, ``from . import``
too), parsed with `ast`, nothing imported or run.

- The project's module graph has no cycle. A cycle hidden in a function-level import is a
  cycle still: the two modules cannot be understood, tested or moved apart.
- Nothing under ``validate/eval/`` imports the audit (``validate.audit.run*``), the report
  (``validate.report.run``) or the command line (``validate.cli.main``): evaluation sits below them.
- An import of a project module inside a function is a decision, so it says why on its own
  line (``# lazy: <why>``: an optional extra the module needs, or the command line's
  start-up). The others stand at the top of their module. They are counted, and the count
  may only fall.

- Every module stands in one of the layers drawn in ``validate/__init__.py``'s docstring
  (`LAYERS`, lowest first, in the same order: packages, never a list of modules) and imports
  only from its own layer or below; ``validate/`` itself holds no module but its own and
  `validate.api`: every other is in a package of its concern.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("validate", "environment")
LAZY = re.compile(r"#\s*lazy:\s*\S")
#: Function-level project imports now; lower it when one goes, never raise it without cause.
#: (5 -> 7: `validate.api` imports what reads a run back only for the commands that read one,
#: in two lines: pandas off a run's driver, ~34 MB of its peak.)
#: (7 -> 9: the one line importing the audits, the package and the report lazily is three since
#: they live in three packages: the same modules, imported for the same reason.)
LAZY_CEILING = 9
#: The layers of ``validate/__init__.py``'s docstring, lowest first: name, its packages (each
#: the package and everything under it; ``validate`` alone is the package's own module).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("environments", ("environment",)),
    ("foundation", ("validate.core",)),
    ("evidence and rules", ("validate.evidence", "validate.agents")),
    ("sandbox", ("validate.sandbox", "validate.taskdir.images", "validate.taskdir.trial")),
    ("contract", ("validate.contract",)),
    ("running", ("validate.run", "validate.kinds", "validate.eval", "validate.taskdir")),
    ("reading", ("validate.report", "validate.view")),
    ("audit", ("validate.audit",)),
    ("surface", ("validate.api", "validate.cli")),
    ("development", ("validate.devtools",)),
]
#: The package's own module (its docstring, its version) stands at the foundation.
ROOT_MODULE = "validate"
#: Modules whose function-level imports are still to be hoisted (none now; keep it empty).
PENDING: dict[str, str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the project module it names
    path: str  # the importing file, relative to the project
    line: int
    in_function: bool
    text: str  # the import's first line, as written


@functools.cache
def _modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _statements(tree: ast.AST):
    """Every import statement with whether it runs inside a function (a class body runs at
    import time, so it counts as module level)."""
    def walk(node, inside):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, inside
            yield from walk(child, inside
                            or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    yield from walk(tree, False)


def _targets(node, package: str, modules: dict[str, Path]) -> list[str]:
    """The project modules an import statement names (a name imported from a package is
    the submodule when there is one, else the package itself)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:  # `import a.b.c` of a name defined in a.b
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


@functools.cache  # the tree does not change during a test session
def project_imports() -> tuple[Import, ...]:
    modules = _modules()
    found = []
    for name, path in modules.items():
        text = path.read_text()
        lines = text.splitlines()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        rel = path.relative_to(ROOT).as_posix()
        for node, inside in _statements(ast.parse(text, filename=rel)):
            for target in _targets(node, package, modules):
                if target != name:
                    found.append(Import(name, target, rel, node.lineno, inside,
                                        lines[node.lineno - 1].strip()))
    return tuple(found)


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as the modules along it (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(v):
        state[v] = 1
        path.append(v)
        for w in sorted(edges.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(edges):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_the_parser_sees_every_kind_of_import():
    """The reader finds relative, function-level and package imports (else the checks below
    prove nothing)."""
    tree = ast.parse("from . import a\nfrom .b import c\ndef f():\n    import validate.core.paths\n")
    modules = {"validate.x": Path(), "validate.x.a": Path(), "validate.x.b": Path(),
               "validate.core.paths": Path()}
    got = [(_targets(n, "validate.x", modules), inside) for n, inside in _statements(tree)]
    assert got == [(["validate.x.a"], False), (["validate.x.b"], False), (["validate.core.paths"], True)]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    imports = project_imports()
    assert len({i.source for i in imports}) > 50
    assert any(i.in_function for i in imports)


def test_no_import_cycle():
    edges: dict[str, set[str]] = {}
    for i in project_imports():
        edges.setdefault(i.source, set()).add(i.target)
    cycle = _cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle) + "; where: " + "; ".join(sorted({
        f"{i.path}:{i.line} {i.text}" for i in project_imports()
        if i.source in cycle and i.target == cycle[cycle.index(i.source) + 1]}))


def test_eval_sits_below_audit_report_and_cli():
    above = re.compile(r"^validate\.(audit\w*|report|cli)$")
    wrong = sorted({f"{i.path}:{i.line} {i.text}" for i in project_imports()
                    if i.source.startswith("validate.eval") and above.match(i.target)})
    assert not wrong, "validate/eval/ imports the audit, report or command line: " + "; ".join(wrong)


def test_function_level_imports_say_why():
    lazy = [i for i in project_imports() if i.in_function and i.path not in PENDING]
    unsaid = sorted({f"{i.path}:{i.line} {i.text}" for i in lazy if not LAZY.search(i.text)})
    assert not unsaid, (f"{len(unsaid)} function-level project import(s) without a `# lazy: <why>` comment "
                        "on the line; move them to the top of the module or say why: " + "; ".join(unsaid))
    count = len({(i.path, i.line) for i in lazy})
    print(f"{count} function-level project imports, each saying why")
    assert count <= LAZY_CEILING, (
        f"{count} function-level project imports, more than the {LAZY_CEILING} allowed"
    )


def _layer(module: str) -> int | None:
    """The layer of `module`: its package's, the most specific package that holds it."""
    if module == ROOT_MODULE:
        return 1
    held = [(len(p), n) for n, (_, packages) in enumerate(LAYERS) for p in packages
            if module == p or module.startswith(p + ".")]
    return max(held)[1] if held else None


def test_validate_holds_packages_by_concern_and_two_modules():
    """``validate/`` holds its own module, `validate.api`, and packages, each one concern."""
    top = sorted(p.name for p in (ROOT / "validate").glob("*.py"))
    assert top == ["__init__.py", "api.py"], top
    packages = sorted(p.name for p in (ROOT / "validate").iterdir() if (p / "__init__.py").is_file())
    placed = {p.split(".")[1] for _, layer in LAYERS for p in layer if p.startswith("validate.")}
    assert set(packages) <= placed, sorted(set(packages) - placed)


def test_the_docstring_draws_these_layers():
    doc = ast.get_docstring(ast.parse((ROOT / "validate/__init__.py").read_text()))
    drawn = re.findall(r"(?m)^(\d+)\. ([a-z ]+) — ", doc)
    assert drawn == [(str(n), name) for n, (name, _) in enumerate(LAYERS, 1)], drawn


def test_every_module_imports_only_its_own_layer_or_below():
    unplaced = sorted(m for m in _modules() if _layer(m) is None)
    assert not unplaced, (
        f"modules in no layer of LAYERS (place each, and draw it in validate/__init__.py): {unplaced}"
    )
    up = sorted({f"{i.path}:{i.line} {i.text} ({LAYERS[_layer(i.source)][0]} -> "
                 f"{LAYERS[_layer(i.target)][0]})"
                 for i in project_imports() if _layer(i.target) > _layer(i.source)})
    assert not up, "imports from a higher layer: " + "; ".join(up)
