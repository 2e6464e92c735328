"""Reading a Harbor verifier's reward, and what the agent left where the reward goes.

Harbor's precedence: ``/logs/verifier/reward.json`` if it exists (a number, or a flat object
of finite numbers), else ``reward.txt`` (one float). Harbor raises on an empty, unparsable
or non-finite file; here every way a reward can be unusable is a typed `RewardError`, never
an exception, so the harness records it as a verifier error (never a pass, never a 0 blamed
on the agent). Stricter than Harbor:

- ``reward.txt`` must be one decimal number (Python's ``float()``, which Harbor uses, also
  takes ``"nan"``, ``"inf"``, ``"1_0"`` and Arabic-Indic digits);
- ``reward.json`` may not hold booleans (``true`` is an ``int`` to Python), duplicate keys
  (which a forger could use to show a reader one value and Harbor another), an empty
  object, or keys that are not text (a lone surrogate's escape); and every value must be in the range the
  contract allows (``[0, 1]`` unless told otherwise);
- a file over `MAX_REWARD_BYTES` is refused unread.

Exact: a reward is read as the decimal number its text writes (`decimal.Decimal`), and that
number is what is held to the range and, by the harness, to the pass threshold
(`environment.protocol.exact_reward`): ``0.99999999999999999999`` is below 1 although its
nearest float is 1.0. The float stays for the columns; the text is kept beside it
(`Reward.exact`, `Scored.exact`) wherever the float misreads it.

The functions take bytes, not paths: the harness copies the files out of a container.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Final, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from environment.protocol import EnvError, canonical_json, exact_reward, exact_text, safe_text, sha256_tag

REWARD_JSON: Final = "reward.json"
REWARD_TXT: Final = "reward.txt"
MAX_REWARD_BYTES = 64 * 1024
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class Reward(BaseModel):
    """A usable reward: ``values`` is ``{"reward": x}`` for reward.txt or a bare number."""

    model_config = ConfigDict(frozen=True)

    source: Literal["reward.json", "reward.txt"]
    values: dict[str, float]
    #: Each key whose float misreads the number written (`environment.protocol.exact_text`)
    #: → that number's text.
    exact: dict[str, str] = Field(default_factory=dict)

    def decimal(self, key: str) -> Decimal:
        """The number the verifier wrote for `key`, exactly."""
        return exact_reward(self.values[key], self.exact.get(key))


class RewardError(BaseModel):
    """Why the verifier produced no usable reward: a verifier error, not the agent's fault."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["missing", "empty", "too_large", "not_utf8", "unparsable", "non_numeric",
                  "non_finite", "out_of_range"]
    file: str | None
    detail: str

    def line(self) -> str:
        return f"{self.file or 'reward'}: {self.kind}: {self.detail}"


class Planted(BaseModel):
    """A file that was already in the verifier's log directory before the verifier ran."""

    model_config = ConfigDict(frozen=True)

    path: str
    size: int
    sha256: str


def read_reward(files: Mapping[str, bytes], low: float = 0.0, high: float = 1.0) -> Reward | RewardError:
    """The reward from the verifier directory's files (name → bytes; other names ignored).
    ``reward.json`` wins whenever it exists, even when it is unusable and ``reward.txt`` is
    fine: falling back would let a broken (or planted) JSON choose which file counts."""
    if REWARD_JSON in files:
        got = _parse_json(files[REWARD_JSON])
    elif REWARD_TXT in files:
        got = _parse_txt(files[REWARD_TXT])
    else:
        return RewardError(kind="missing", file=None,
                           detail="the verifier wrote neither reward.json nor reward.txt")
    if isinstance(got, RewardError):
        return got
    bad = sorted(k for k in got.values if not exact_reward(low) <= got.decimal(k) <= exact_reward(high))
    if bad:
        key = bad[0]
        shown = got.exact.get(key) or repr(got.values[key])
        return RewardError(kind="out_of_range", file=got.source,
                           detail=f"{key} = {shown} is outside [{low}, {high}]")
    return got


class VerifierRecord(BaseModel):
    """What the harness read where the verifier writes its reward, once every process of the
    trial was gone: the bytes of the reward files (base64), the key and range the contract
    asks, or the harness's own reason there was nothing to read (the verifier timed out, ran
    out of memory, left a reward path that is not a regular file). Kept whole as the
    attempt's reply, so the audit reads the reward again from these bytes by the same rule
    (`score_record`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(default="reward", description="the reward key that must reach the threshold, or 'all' "
                                                   "(every key)")
    low: float = 0.0
    high: float = 1.0
    failed: str | None = Field(default=None,
                               description="why nothing was read, from the harness's own signals")
    files: dict[str, str] = Field(default_factory=dict,
                                  description="reward.json / reward.txt → base64 of its bytes")
    image: str | None = Field(default=None, description="the task image the trial ran in (its id)")
    replayed: VerifierRecord | None = Field(default=None, description=(
        "the same read after the verifier was replayed in the agent's own container (a trusted trial of the "
        "reference solution that did not pass and changed paths outside its work paths); absent otherwise"))

    @model_serializer(mode="wrap")
    def _omit_unreplayed(self, handler: SerializerFunctionWrapHandler) -> dict:
        # Written only when there was a replay: every record kept before the field keeps its bytes.
        data = handler(self)
        if data.get("replayed") is None:
            data.pop("replayed", None)
        return data

    @classmethod
    def of(cls, files: Mapping[str, bytes], key: str = "reward", low: float = 0.0, high: float = 1.0,
           failed: str | None = None) -> VerifierRecord:
        kept = {n: base64.b64encode(files[n]).decode() for n in (REWARD_JSON, REWARD_TXT) if n in files}
        return cls(key=key, low=low, high=high, failed=failed, files={} if failed else kept)

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))


class VerifierFailed(EnvError):
    """The verifier gave no usable reward: the task's (or its verifier's) error, never the agent's."""


#: The reward-key rule under which every key the verifier wrote must reach the pass threshold.
ALL_KEYS = "all"


def reward_under(reward: Reward, rule: str) -> str:
    """The key whose value is the task's reward under the contract's key `rule`: that key, or
    with `ALL_KEYS` the key of the least value, compared exactly (so the reward reaches the
    pass threshold only when each key does). A key the rule names but the reward lacks is a
    verifier error (`VerifierFailed`)."""
    if rule == ALL_KEYS:  # a usable reward holds at least one key (`read_reward`)
        return min(sorted(reward.values), key=reward.decimal)
    if rule not in reward.values:
        raise VerifierFailed(f"{reward.source}: no key {rule!r} (keys: {', '.join(sorted(reward.values))})")
    return rule


class Scored(NamedTuple):
    """A `VerifierRecord`'s reward under the contract's key rule: the float (for the columns),
    its exact text where the float misreads it (None: the float is exact), every key's float."""

    reward: float
    exact: str | None
    values: dict[str, float]


def score_record(data: bytes, rule: str | None = None) -> tuple[float, dict[str, float]]:
    """`read_record`'s float reward and every key's value."""
    got = read_record(data, rule)
    return got.reward, got.values


def read_record(data: bytes, rule: str | None = None) -> Scored:
    """The reward a `VerifierRecord` holds under the contract's key `rule` (None: the key the
    record names); raises `VerifierFailed` for anything else (a failed verifier, an unusable
    file, a missing key, a record read under another rule than the contract's, bytes that
    are not a record)."""
    try:
        record = VerifierRecord.model_validate_json(data)
        files = {n: base64.b64decode(v, validate=True) for n, v in record.files.items()}
    except (ValidationError, ValueError):
        raise VerifierFailed("no verifier record: the verifier never ran to the end") from None
    if rule is not None and record.key != rule:
        raise VerifierFailed(f"the verifier record names reward key {record.key!r}, the contract's "
                             f"rule is {rule!r}")
    if record.failed is not None:
        raise VerifierFailed(record.failed)
    got = read_reward(files, record.low, record.high)
    if isinstance(got, RewardError):
        raise VerifierFailed(got.line())
    key = reward_under(got, record.key)
    return Scored(got.values[key], got.exact.get(key), dict(got.values))


def _text(data: bytes, name: str) -> str | RewardError:
    if len(data) > MAX_REWARD_BYTES:
        return RewardError(kind="too_large", file=name, detail=f"{len(data)} bytes > {MAX_REWARD_BYTES}")
    if not data.strip():
        return RewardError(kind="empty", file=name, detail="empty")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return RewardError(kind="not_utf8", file=name, detail=f"not UTF-8 (byte {e.start})")


def _parse_txt(data: bytes) -> Reward | RewardError:
    text = _text(data, REWARD_TXT)
    if isinstance(text, RewardError):
        return text
    token = text.strip()
    if token.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return RewardError(kind="non_finite", file=REWARD_TXT, detail=f"{token!r} is not finite")
    if not _DECIMAL.fullmatch(token):
        return RewardError(kind="unparsable", file=REWARD_TXT,
                           detail=f"not one decimal number: {token[:60]!r}")
    return _numbers(REWARD_TXT, {"reward": token})


class _Refused(EnvError):
    pass


def _no_constants(name: str):
    raise _Refused(f"{name} is not a number")


def _unique_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Refused(f"duplicate key {sorted(k for k in keys if keys.count(k) > 1)[0]!r}")
    return dict(pairs)


def _parse_json(data: bytes) -> Reward | RewardError:
    text = _text(data, REWARD_JSON)
    if isinstance(text, RewardError):
        return text
    try:  # a fraction as the decimal it writes (`_numbers`), never first a float; an integer is exact
        value = json.loads(text, parse_constant=_no_constants, object_pairs_hook=_unique_keys,
                           parse_float=Decimal)
    except _Refused as e:
        return RewardError(kind="non_finite" if "not a number" in str(e) else "unparsable", file=REWARD_JSON,
                           detail=str(e))
    except InvalidOperation:  # Decimal refused a number's exponent
        return RewardError(kind="unparsable", file=REWARD_JSON, detail="a number's exponent is out of range")
    except (ValueError, RecursionError) as e:
        return RewardError(kind="unparsable", file=REWARD_JSON, detail=f"not JSON: {str(e)[:80]}")
    values = value if isinstance(value, dict) else {"reward": value}
    if not values:
        return RewardError(kind="non_numeric", file=REWARD_JSON, detail="an empty object holds no reward")
    odd = sorted(safe_text(k) for k in values if safe_text(k) != k)
    if odd:  # a JSON escape of a lone surrogate (\ud800): no text names such a key
        return RewardError(kind="unparsable", file=REWARD_JSON,
                           detail=f'key "{odd[0]}" is not text (a lone surrogate); keys are reward names')
    for key, v in sorted(values.items()):
        if isinstance(v, bool) or not isinstance(v, (int, Decimal)):  # true is an int to Python
            return RewardError(kind="non_numeric", file=REWARD_JSON,
                               detail=f"{key!r} is {type(v).__name__}, not a number (a flat "
                                      "object of numbers)")
    return _numbers(REWARD_JSON, values)


def _numbers(source: Literal["reward.json", "reward.txt"],
             numbers: Mapping[str, Decimal | int | str]) -> Reward | RewardError:
    """The reward of `numbers` (key → a JSON number, or the decimal text of reward.txt): each
    key's float, and its exact text where the float misreads it; any that no float holds
    (``1e999``, a 400-digit integer) is not finite."""
    values: dict[str, float] = {}
    exact: dict[str, str] = {}
    for key, number in sorted(numbers.items()):
        try:
            d = Decimal(number)
        except InvalidOperation:  # an exponent beyond what a decimal holds (1e-9999999999999999999)
            return RewardError(kind="unparsable", file=source, detail=f"{str(number)[:60]!r}: its exponent "
                                                                      "is out of range")
        f = float(d)
        if not math.isfinite(f):
            shown = f"{str(number)[:60]!r}" if source == REWARD_TXT else repr(key)
            return RewardError(kind="non_finite", file=source, detail=f"{shown} is not finite")
        values[key] = f
        if (text := exact_text(d)) is not None:
            exact[key] = text
    return Reward(source=source, values=values, exact=exact)


def planted(files: Mapping[str, bytes]) -> list[Planted]:
    """What was in the verifier's log directory before the verifier ran (name → bytes):
    the harness creates that directory empty, so anything here was left by the agent
    phase — recorded on the attempt, then removed. A planted ``reward.json`` or
    ``reward.txt`` is the forgery Harbor's readers report; any other file is recorded too."""
    return [
        Planted(path=name, size=len(data), sha256=sha256_tag(data)) for name, data in sorted(files.items())
    ]


def planted_rewards(files: Mapping[str, bytes]) -> list[Planted]:
    """The planted files that are reward files (the ones that would have decided the trial)."""
    return [p for p in planted(files) if p.path.rsplit("/", 1)[-1] in (REWARD_JSON, REWARD_TXT)]
