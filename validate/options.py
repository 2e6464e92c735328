"""Command-line options made from pydantic models, so ``--help`` teaches from the same field
descriptions the schema documents, and a bad value's error names the field.

`add_model_options` adds one ``--field-name`` per field (booleans as ``--x/--no-x``);
values stay strings until `model_values` hands them to the model, whose validation speaks.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel

from validate.errors import ValidateError


def _plain(annotation) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def add_model_options(group, model: type[BaseModel], prefix: str, skip: tuple[str, ...] = ("schema_version",)) -> None:
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        kind = _plain(info.annotation)
        default = info.get_default(call_default_factory=True)
        shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else default
        help_text = f"{info.description or name} (default: {shown})".replace("%", "%%")
        dest = f"{prefix}{name}"
        if kind is bool:
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=help_text)
        elif typing.get_origin(kind) is Literal:
            group.add_argument(flag, dest=dest, choices=[str(c) for c in typing.get_args(kind)],
                               default=argparse.SUPPRESS, help=help_text)
        else:
            group.add_argument(flag, dest=dest, default=argparse.SUPPRESS, metavar=name.split("_")[-1].upper(),
                               help=help_text)


def given(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    return {k[len(prefix):]: v for k, v in vars(args).items() if k.startswith(prefix)}


def model_values(model: type[BaseModel], base: dict[str, Any], overrides: dict[str, Any], what: str) -> BaseModel:
    """`model` from `base` (e.g. a TOML file) updated with `overrides`; a `ValidateError` naming
    the option on a bad value."""
    from pydantic import ValidationError

    from validate.jsonio import JSONInputError, loads

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
