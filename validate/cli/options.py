"""Command-line options made from pydantic models, so ``--help`` teaches from the same field
descriptions the schema documents, and a bad value's error names the field.

`add_model_options` adds one ``--field-name`` per field (booleans as ``--x/--no-x``);
values stay strings until `model_values` hands them to the model, whose validation speaks.

The path checks (`output_file`, `output_dir`, `run_directory`, `existing_dir`,
`existing_file`) run before a command does anything: a path that cannot be written is
found by writing there (a probe file, removed at once), not at the end of a run that then
has nowhere to put its evidence. `min_count` and `model_spec` check option values whose
model alone would not say which option to fix.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from validate.core.errors import ValidateError
from validate.core.jsonio import JSONInputError, loads
from validate.eval.contract import ModelSpec
from validate.sandbox.storage import _NAME as PLAIN_NAME

#: Attempts at once unless told otherwise: two per usable core. An attempt waits on process
#: start-up, the daemon and namespace teardown about as much as it computes; on 2 cores,
#: -c 4 beat -c 2 on both backends (docs/performance.md).
DEFAULT_CONCURRENCY = 2 * len(os.sched_getaffinity(0))


def _plain(annotation) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def add_model_options(group, model: type[BaseModel], prefix: str,
                      skip: tuple[str, ...] = ("schema_version",)) -> None:
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        kind = _plain(info.annotation)
        default = info.get_default(call_default_factory=True)
        shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else default
        said = "required" if info.is_required() else f"default: {shown}"
        help_text = f"{info.description or name} ({said})".replace("%", "%%")
        dest = f"{prefix}{name}"
        if kind is bool:
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
        elif typing.get_origin(kind) is Literal:
            group.add_argument(flag, dest=dest, choices=[str(c) for c in typing.get_args(kind)],
                               default=argparse.SUPPRESS, help=help_text)
        else:
            group.add_argument(flag, dest=dest, default=argparse.SUPPRESS,
                               metavar=name.split("_")[-1].upper(), help=help_text)


def given(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    return {k[len(prefix):]: v for k, v in vars(args).items() if k.startswith(prefix)}


def model_values(model: type[BaseModel], base: dict[str, Any], overrides: dict[str, Any],
                 what: str) -> BaseModel:
    """`model` from `base` (e.g. a TOML file) updated with `overrides`; a `ValidateError` naming
    the option on a bad value."""
    from pydantic import ValidationError

    merged = {**base, **overrides}
    for k in overrides:
        annotation = model.model_fields[k].annotation
        kind = _plain(annotation)
        if merged[k] == "none" and kind is not annotation:
            merged[k] = None
        elif typing.get_origin(kind) in (list, dict, tuple) and isinstance(merged[k], str):
            try:
                merged[k] = loads(merged[k])
            except JSONInputError as e:
                raise ValidateError(f"--{k.replace('_', '-')}: expected JSON such as [1, 2] ({e})") from None
    try:
        return model.model_validate(merged, strict=False)
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        shown = f"--{field.replace('_', '-')}" if field in overrides else f"{what}.{field}" if field else what
        raise ValidateError(f"{shown}: {err['msg']} (got {err.get('input')!r})") from None


def utf8_path(path: Path, option: str) -> None:
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise ValidateError(f"{option}: the path {ascii(str(path))} is not valid UTF-8; every path the "
                            "evidence records must be: choose another name") from None


def _probe(directory: Path, option: str, target: Path) -> None:
    """Refuse unless a file can be created where `target` goes: in `directory`, or (when it does
    not exist yet) in its nearest existing ancestor, where it would be made."""
    base = directory
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise ValidateError(f"{option}: cannot write {target}: {base} is not a directory")
    try:
        fd, name = tempfile.mkstemp(prefix=".validate-probe.", dir=base)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise ValidateError(f"{option}: cannot write {target} ({e.strerror or e}); choose a path in a "
                            "writable directory") from None


def output_file(path: str | Path, option: str) -> Path:
    """A file the command will write (a manifest, a contract)."""
    p = Path(path)
    utf8_path(p, option)
    if p.is_dir():
        raise ValidateError(f"{option}: {p} is a directory; give the path of the file to write")
    _probe(p.parent, option, p)
    return p


def outside_data(paths: typing.Iterable[Path], data: typing.Iterable[Path], option: str, given: Path) -> None:
    """Refuse outputs inside the data a command reads (a dataset directory, a patch directory,
    or over a data file): read back as part of it, they would change what it froze (a
    manifest's build logs were once read as a Harbor dataset's one task). `given` is the path
    as the user gave it, for the message."""
    for place in data:
        where = Path(os.path.abspath(place)).resolve()
        for p in paths:
            p = Path(os.path.abspath(p)).resolve()
            if p == where or where in p.parents:
                raise ValidateError(f"{option}: {given} is inside the dataset {place}, which the freeze "
                                    "reads (its output would be read back as part of it); write it outside, "
                                    "e.g. manifests/<name>.json")


def output_dir(path: str | Path, option: str) -> Path:
    """A directory the command will write into (made when missing)."""
    p = Path(path)
    utf8_path(p, option)
    if p.exists() and not p.is_dir():
        raise ValidateError(f"{option}: {p} exists and is not a directory")
    _probe(p, option, p)
    return p


def run_directory(path: str | Path, option: str) -> Path:
    """A run directory: its name is the run's id, which also names its sandboxes' storage, so it
    follows the storage's rule for a plain file name."""
    p = output_dir(path, option)
    if not PLAIN_NAME.match(p.name):
        raise ValidateError(f"{option}: the run directory's name {p.name!r} is the run id and must be a "
                            "plain file name (letters, digits, '.', '_', '-'; at most 200 characters, not "
                            "starting with '.', '_' or '-')")
    return p


def existing_dir(path: str | Path, option: str) -> Path:
    p = Path(path)
    utf8_path(p, option)
    if not p.is_dir():
        raise ValidateError(f"{option}: {p}: {'not a directory' if p.exists() else 'no such directory'}")
    return p


def existing_file(path: str | Path, option: str) -> Path:
    p = Path(path)
    utf8_path(p, option)
    if not p.is_file():
        raise ValidateError(f"{option}: {p}: {'not a regular file' if p.exists() else 'no such file'}")
    return p


def min_count(value: int | None, n: int) -> None:
    """`--min-count` against the `n` tasks selected: a minimum the selection cannot reach (or a
    minimum of none, which any run meets) is refused."""
    if value is not None and not 1 <= value <= n:
        why = f"exceeds the {n} tasks selected" if value > n else "must be ≥ 1"
        raise ValidateError(f"--min-count: {value} {why}; give 1 to {n} (or select more tasks)")


#: The `validate eval freeze` option of each `ModelSpec` field, and what it accepts.
MODEL_OPTIONS = {"id": ("--model", "the model name the endpoint serves"),
                 "revision": ("--model-revision", "the exact checkpoint: a commit, a sha256, a tag"),
                 "server": ("--server", "what serves the model, in words"),
                 "base_url": ("--base-url", "an http:// or https:// URL naming the endpoint's host, e.g. "
                                            "http://127.0.0.1:8000/v1"),
                 "api_key_env": ("--api-key-env", "the name of an environment variable (letters, digits and "
                                                  "_, not starting with a digit), never the key itself")}


def model_spec(**fields: Any):
    """The contract's `ModelSpec`, or one line naming the option and what it accepts."""
    from urllib.parse import urlsplit

    from pydantic import ValidationError

    try:
        spec = ModelSpec(**fields)
    except ValidationError as e:  # pydantic's own text is several lines of internals
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        option, accepted = MODEL_OPTIONS.get(field, (field or "model", err["msg"]))
        raise ValidateError(f"{option}: {fields.get(field)!r} is not accepted; give {accepted}") from None
    if not urlsplit(spec.base_url).hostname:
        raise ValidateError(f"--base-url: {spec.base_url!r} names no host; give "
                            f"{MODEL_OPTIONS['base_url'][1]}")
    return spec
