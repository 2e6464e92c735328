"""Theme specs: the hand-authored source of the dataset (``specs/*.json``), their schema and
loading. Rules for writing one are in ``AUTHORING.md`` beside this file.

A spec is one theme: a principle, a decoy that explains every item (intruders included),
8–10 members that fit the principle and 1–3 near-miss intruders that fit only the decoy,
each intruder with a written ``why``. Loading checks the schema and names the file and the
field of any problem (`ConfigError`), never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from environment.protocol import ConfigError

Tier = Literal["obvious", "moderate", "subtle"]
TIERS: tuple[Tier, ...] = ("obvious", "moderate", "subtle")
SPECS_DIR = Path(__file__).resolve().parent / "specs"


class Member(BaseModel):
    """An item that fits the principle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str = Field(min_length=1, max_length=80, description="The item's name as shown to the solver.")
    description: str = Field(min_length=10, max_length=160,
                             description="One short factual sentence; never states the principle's property.")


class Intruder(Member):
    """An item that fits the decoy but not the principle."""

    why: str = Field(min_length=5,
                     description="Why it fails the principle (hidden; for reviewers and the answer key).")


class ThemeSpec(BaseModel):
    """One hand-authored theme."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec_id: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$",
                         description="Stable id; also the file name stem.")
    domain: str = Field(pattern=r"^[a-z]+$", description="Subject area (food, music, ...).")
    difficulty: Tier = Field(description="obvious, moderate or subtle (see AUTHORING.md).")
    principle: str = Field(min_length=5, description="The hidden rule every member satisfies.")
    decoy: str = Field(min_length=5,
                       description="A looser rule that every item, intruders included, satisfies.")
    members: tuple[Member, ...] = Field(min_length=8, max_length=10,
                                        description="Items that fit the principle.")
    intruders: tuple[Intruder, ...] = Field(min_length=1, max_length=3, description="Near-miss items.")

    @model_validator(mode="after")
    def _unique_titles(self) -> ThemeSpec:
        titles = [i.title.casefold() for i in (*self.members, *self.intruders)]
        dupes = sorted({t for t in titles if titles.count(t) > 1})
        if dupes:
            raise ValueError(f"titles repeat within the spec: {', '.join(dupes)}")
        return self


def load_spec(path: Path) -> ThemeSpec:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a readable JSON theme spec ({e}); fix the file") from None
    try:
        spec = ThemeSpec.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(
            f"{path}: field {where}: {first['msg']} ({e.error_count()} problem(s) in all)"
        ) from None
    if spec.spec_id != path.stem:
        raise ConfigError(f"{path}: spec_id {spec.spec_id!r} must equal the file name stem {path.stem!r}")
    return spec


def load_specs(directory: Path = SPECS_DIR) -> list[ThemeSpec]:
    """Every ``*.json`` spec in ``directory``, sorted by spec_id; titles unique across specs."""
    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise ConfigError(f"{directory}: no theme specs (*.json) found; point the loader at the specs folder")
    specs = [load_spec(p) for p in paths]
    seen: dict[str, str] = {}
    for spec in specs:
        for item in (*spec.members, *spec.intruders):
            key = item.title.casefold()
            if key in seen:
                raise ConfigError(f"{directory}: item {item.title!r} appears in both {seen[key]} and "
                                  f"{spec.spec_id}; an item belongs to one theme only")
            seen[key] = spec.spec_id
    return specs
