"""One error root: every exception class the project defines derives from its package's root,
found by importing every module (`pkgutil`), nothing assumed.

- ``validate/``: `validate.core.errors.ValidateError` (the command line prints one and exits 2).
- ``environment/``: `environment.protocol.EnvError`. Environments import nothing of the
  harness (tests/test_layers.py), so theirs is a root of its own.

A module that does not import fails the test (ray and huggingface_hub are installed where
the suite runs). The files that are programs, never modules of the host (a ``__main__``, a
file outside any package, one importing the sandbox's ``agentlib``: importing it would run
it), are read with `ast` and may define no exception class: one could never reach the harness.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import pkgutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Each top-level package and its root: (module, class).
ROOTS = {"validate": ("validate.core.errors", "ValidateError"),
         "environment": ("environment.protocol", "EnvError")}
#: Modules that must import with the stdlib and their own folder alone, so cannot reach their
#: package's root: {module: why}. Their exception classes derive from a builtin exception.
STANDALONE = {
    "environment.twohop.dataset": "source-peek rebuilds the dataset in a sandbox with only the stdlib "
                                  "(tests/test_twohop_env.py)",
    "environment.twohop.score": "scores replies beside the dataset in that sandbox",
}


def _imports_agentlib(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == "agentlib" for a in n.names)
               or isinstance(n, ast.ImportFrom) and n.module == "agentlib" for n in ast.walk(tree))


@functools.cache
def _walk() -> tuple[dict[str, Path], dict[Path, str]]:
    """({module name: its file} of every module of the packages, {program file: why it is one})."""
    modules: dict[str, Path] = {}
    programs: dict[Path, str] = {}
    for top in ROOTS:
        package = importlib.import_module(top)
        modules[top] = Path(package.__file__)
        found = pkgutil.walk_packages(package.__path__, top + ".", onerror=lambda name: _fail_import(name))
        for info in found:
            path = Path(info.module_finder.path) / (info.name.rpartition(".")[2]
                                                    + ("/__init__.py" if info.ispkg else ".py"))
            if info.name.endswith(".__main__"):
                programs[path] = "a __main__"
            elif _imports_agentlib(ast.parse(path.read_text())):
                programs[path] = "imports the sandbox's agentlib"
            else:
                modules[info.name] = path
    walked = set(modules.values()) | set(programs)
    for top in ROOTS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path not in walked:
                programs[path] = "outside any package"
    return modules, programs


def _fail_import(name: str) -> None:
    raise AssertionError(f"package {name} does not import")  # pkgutil would skip it silently


def _defined(module) -> list[type[BaseException]]:
    return [v for v in vars(module).values()
            if inspect.isclass(v) and issubclass(v, BaseException) and v.__module__ == module.__name__]


def test_every_exception_class_derives_from_its_root():
    modules, _ = _walk()
    roots = {top: getattr(importlib.import_module(module), cls, None) for top, (module, cls) in ROOTS.items()}
    outside, unimportable, checked = [], [], 0
    for name in sorted(modules):
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - named in the failure, never skipped
            unimportable.append(f"{name} ({type(e).__name__}: {e})")
            continue
        root = roots[name.partition(".")[0]]
        for cls in _defined(module):
            checked += 1
            if name in STANDALONE:
                if not all(b.__module__ == "builtins" for b in cls.__bases__):
                    outside.append(f"{name}.{cls.__name__} (standalone: builtin bases only)")
            elif root is None or not issubclass(cls, root):
                outside.append(f"{name}.{cls.__name__}({', '.join(b.__name__ for b in cls.__bases__)})")
    assert not unimportable, f"modules that do not import: {unimportable}"
    assert checked > 40, checked  # the walk reached the packages' modules
    assert set(STANDALONE) <= set(modules), sorted(set(STANDALONE) - set(modules))
    assert not outside, f"{len(outside)} exception classes outside their package's root: " + "; ".join(
        outside
    )
    assert None not in roots.values(), f"a package without its root: {roots}"


def _exception_bases(tree: ast.AST) -> list[str]:
    """Classes of a program whose bases name an exception (a builtin one, or a name ending in
    Error or Exception)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                     for b in node.bases]
            if any(isinstance(getattr(builtins, n, None), type)
                   and issubclass(getattr(builtins, n), BaseException)
                   or n.endswith(("Error", "Exception")) for n in names):
                found.append(node.name)
    return found


def test_programs_define_no_exception_class():
    _, programs = _walk()
    assert any(why == "a __main__" for why in programs.values())  # the reader sees what it must skip
    wrong = sorted(f"{p.relative_to(ROOT)} ({why}): {', '.join(names)}" for p, why in programs.items()
                   if (names := _exception_bases(ast.parse(p.read_text()))))
    assert not wrong, f"programs defining an exception class: {wrong}"


def test_the_reader_sees_exception_bases():
    assert _exception_bases(
        ast.parse("class A(ValueError): pass\nclass B(x.FooError): pass\nclass C: pass\n")
    ) == ["A", "B"]
