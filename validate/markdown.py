"""Text made inert in Markdown: what every Markdown document of the harness (the run report,
the eval report, the comparison) does to text it did not write itself (agent and model
output, stderr, error messages), so none of it can become a heading, a link or a table.
Below both renderers (`validate.report`, `validate.eval.render`).
"""

from __future__ import annotations

import re

_MD_INLINE = re.compile(r"([\\`*_{}\[\]<>|~])")
_MD_LEADING = re.compile(r"^(\s*)([#>+\-=]|\d+(?=[.)]))")


def md_text(text: str) -> str:
    """Text made inert in Markdown (agent text included): inline markup characters escaped,
    line breaks flattened, a leading block marker (heading, quote, list) escaped."""
    flat = _MD_INLINE.sub(r"\\\1", str(text).replace("\r", " ").replace("\n", " "))
    return _MD_LEADING.sub(lambda m: m.group(1) + (m.group(2) + "\\" if m.group(2)[0].isdigit()
                                                   else "\\" + m.group(2)), flat)
