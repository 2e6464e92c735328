"""The one renderer of the harness's documents (run reports, eval reports, comparisons) to
Markdown and self-contained HTML.

A document is a list of blocks: ``("h1"|"h2"|"h3", text)``, ``("p", [part, ...])``,
``("table", header, rows)``, ``("svg", markup, label)`` (a figure the harness drew; Markdown
points to the HTML) and ``("message", role, title, text)`` (one message of a trajectory,
shown whole in a preformatted box). A part or a cell is text, or emphasised text the
document itself states (`Bold`, or ``("bold", text)``). All text is escaped — agent and
model output, tool output and error messages included: Markdown through `md_text` (and
fenced blocks whose fence is longer than any backtick run in the text), HTML through
`html.escape`.

The bytes of every report are re-rendered by the audit and compared, so a change here that
changes a byte of any document must bump the version its renderer records.
"""

from __future__ import annotations

import html
import re


class Bold(str):
    """Text the document itself emphasises (never agent text)."""


_MD_INLINE = re.compile(r"([\\`*_{}\[\]<>|~])")
_MD_LEADING = re.compile(r"^(\s*)([#>+\-=]|\d+(?=[.)]))")


def md_text(text: str) -> str:
    """Text made inert in Markdown (agent text included): inline markup characters escaped,
    line breaks flattened, a leading block marker (heading, quote, list) escaped."""
    flat = _MD_INLINE.sub(r"\\\1", str(text).replace("\r", " ").replace("\n", " "))
    return _MD_LEADING.sub(lambda m: m.group(1) + (m.group(2) + "\\" if m.group(2)[0].isdigit()
                                                   else "\\" + m.group(2)), flat)


def _bold(part) -> str | None:
    if isinstance(part, Bold):
        return str(part)
    if isinstance(part, tuple):
        return part[1]
    return None


def _md_part(part) -> str:
    b = _bold(part)
    return md_text(part) if b is None else f"**{md_text(b)}**"


def _html_part(part) -> str:
    b = _bold(part)
    return html.escape(str(part)) if b is None else f"<strong>{html.escape(b)}</strong>"


def to_markdown(doc: list) -> str:
    lines: list[str] = []
    for b in doc:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            lines += ["#" * int(kind[1]) + " " + md_text(b[1]), ""]
        elif kind == "p":
            lines += ["".join(_md_part(x) for x in b[1]), ""]
        elif kind == "table":
            lines += ["| " + " | ".join(md_text(h) for h in b[1]) + " |", "|" + "---|" * len(b[1])]
            lines += ["| " + " | ".join(_md_part(c) for c in row) + " |" for row in b[2]] + [""]
        elif kind == "svg":
            lines += [f"*{md_text(b[2])}: see report.html.*", ""]
        elif kind == "message":
            fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", b[3])), default=0))
            lines += [f"*{md_text(b[1])}* — {md_text(b[2])}", "", fence + "text", b[3], fence, ""]
    return "\n".join(lines)


def to_html(doc: list, title: str, style: str) -> str:
    body = []
    for b in doc:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{html.escape(b[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{''.join(_html_part(x) for x in b[1])}</p>")
        elif kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{_html_part(c)}</td>" for c in r) + "</tr>" for r in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "svg":
            body.append(f'<figure role="img" aria-label="{html.escape(b[2])}">{b[1]}</figure>')
        elif kind == "message":
            role = b[1] if b[1] in ("system", "user", "assistant", "tool") else "other"
            body.append(f'<section class="msg {role}"><header>{html.escape(b[1])} — '
                        f"{html.escape(b[2])}</header><pre>{html.escape(b[3])}</pre></section>")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
