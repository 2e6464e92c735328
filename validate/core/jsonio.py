"""Reading JSON that anyone may have written (manifests, run files) without a traceback.

`json.loads` raises `RecursionError` on input nested ~1,000 deep and `ValueError` on an
integer of more than 4,300 digits; invalid UTF-8 raises `UnicodeDecodeError`. `loads`
turns every one of those into `JSONInputError` naming what was wrong, and refuses input
larger than `MAX_BYTES` before parsing it.
"""

from __future__ import annotations

import json
from typing import Any

from validate.core.errors import InputError

MAX_BYTES = 256 * 1024 * 1024


class JSONInputError(InputError, ValueError):
    """Input that `loads` cannot read as JSON, in words. A `ValueError` too, as `json`'s own
    errors are: `validate.audit.reports` catches it as one."""


def loads(data: bytes | str, max_bytes: int = MAX_BYTES):
    if len(data) > max_bytes:
        raise JSONInputError(f"{len(data)} bytes, more than the {max_bytes} this reader accepts")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text)
    except UnicodeDecodeError as e:
        raise JSONInputError(f"not UTF-8 at byte {e.start}") from None
    except json.JSONDecodeError as e:
        raise JSONInputError(f"not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise JSONInputError("nested too deeply") from None
    except ValueError as e:  # an integer too long to convert
        raise JSONInputError(str(e)) from None


def field_differences(x: Any, y: Any, skip: frozenset[str] | set[str] = frozenset(),
                      at: str = "") -> list[str]:
    """Dotted names of every field where two JSON documents differ (dicts are walked; any
    other value is compared whole), sorted; top-level keys in `skip` are left out."""
    if isinstance(x, dict) and isinstance(y, dict):
        return [d for k in sorted(set(x) | set(y)) if not (not at and k in skip)
                for d in field_differences(x.get(k), y.get(k), skip, f"{at}.{k}" if at else k)]
    return [] if x == y else [at]
