"""Rendering the eval's documents (report, comparison) to Markdown and self-contained HTML.

A document is a list of blocks: ``("h1"|"h2"|"h3", text)``, ``("p", [text or ("bold",
text), ...])``, ``("table", header, rows)`` and ``("message", role, title, text)`` — one
message of a trajectory, shown whole in a preformatted box. All text is escaped (model
output, tool output and error messages included): Markdown through
`validate.markdown.md_text` (and fenced blocks whose fence is longer than any backtick run in
the text), HTML through `html.escape`.
"""

from __future__ import annotations

import html
import re

from validate.markdown import md_text

STYLE = ("body{font-family:system-ui,sans-serif;max-width:80rem;margin:2rem auto;padding:0 1rem;color:#222}"
         "h1,h2,h3{overflow-wrap:anywhere}"
         "table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem;"
         "text-align:left;vertical-align:top;font-size:.9rem}th{background:#f3f3f3}"
         ".msg{border:1px solid #ccc;border-radius:4px;margin:.4rem 0}.msg header{font-size:.8rem;padding:.2rem .5rem;"
         "background:#f3f3f3}.msg pre{margin:0;padding:.4rem .5rem;white-space:pre-wrap;word-break:break-word;"
         "max-height:24rem;overflow:auto;font-size:.8rem}.system header{background:#eee}"
         ".user header{background:#e8f0fe}"
         ".assistant header{background:#e6f4ea}.tool header{background:#fef7e0}")


def _md_inline(part) -> str:
    return f"**{md_text(part[1])}**" if isinstance(part, tuple) else md_text(part)


def to_markdown(doc: list) -> str:
    lines: list[str] = []
    for b in doc:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            lines += ["#" * int(kind[1]) + " " + md_text(b[1]), ""]
        elif kind == "p":
            lines += ["".join(_md_inline(x) for x in b[1]), ""]
        elif kind == "table":
            lines += ["| " + " | ".join(md_text(h) for h in b[1]) + " |", "|" + "---|" * len(b[1])]
            lines += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in b[2]] + [""]
        elif kind == "message":
            fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", b[3])), default=0))
            lines += [f"*{md_text(b[1])}* — {md_text(b[2])}", "", fence + "text", b[3], fence, ""]
    return "\n".join(lines)


def _html_inline(part) -> str:
    return f"<strong>{html.escape(part[1])}</strong>" if isinstance(part, tuple) else html.escape(str(part))


def to_html(doc: list, title: str) -> str:
    body = []
    for b in doc:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{html.escape(b[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{''.join(_html_inline(x) for x in b[1])}</p>")
        elif kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "message":
            role = b[1] if b[1] in ("system", "user", "assistant", "tool") else "other"
            body.append(f'<section class="msg {role}"><header>{html.escape(b[1])} — {html.escape(b[2])}</header>'
                        f"<pre>{html.escape(b[3])}</pre></section>")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")
