"""HTML out of untrusted text: everything is escaped unless it is `Html` built here.

Agents wrote the replies, stdout, stderr and error messages, and the environment the task
ids; none of it may become markup. `h` escapes any value that is not already `Html`
(``html.escape``, quotes included) and makes invisible characters visible: C0/C1 controls
other than tab and newline, zero-width characters and bidirectional overrides are shown as
``\\xNN``/``\\uNNNN`` so a reply cannot hide or reorder what a reviewer reads. Links are
built from path segments and query pairs, each percent-encoded, never from raw text.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from urllib.parse import quote, urlencode

_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2069\ufeff]"
)


class Html(str):
    """Markup the viewer itself produced (safe to emit as is)."""


def _visible(m: re.Match) -> str:
    c = ord(m.group(0))
    code = f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
    return f'<span class="ctl" title="U+{c:04X}">{code}</span>'


def text(value: object) -> Html:
    """`value` as inert HTML text, invisible characters made visible."""
    return Html(_INVISIBLE.sub(_visible, html.escape(str(value), quote=True)))


def num(value: float | None, digits: int = 4) -> Html:
    if value is None or math.isnan(value):
        return Html("—")
    return Html(f"{value:.{digits}f}")


def h(value: object) -> Html:
    """Any cell value as HTML: `Html` passes, None is a dash, floats get 4 decimals."""
    if isinstance(value, Html):
        return value
    if value is None:
        return Html("—")
    if isinstance(value, float):
        return num(value)
    return text(value)


def url(segments: Sequence[str], query: Mapping[str, object] | None = None) -> str:
    """``/seg/seg?k=v``: each segment percent-encoded whole (``/`` included), empty values dropped."""
    path = "/" + "/".join(quote(str(s), safe="") for s in segments)
    pairs = sorted((k, str(v)) for k, v in (query or {}).items() if v not in (None, ""))
    return path + ("?" + urlencode(pairs) if pairs else "")


def tag(name: str, *children: object, **attrs: object) -> Html:
    """``<name attrs>children</name>``; attribute values escaped; ``class_`` → class."""
    attr = "".join(f' {k.rstrip("_").replace("_", "-")}="{html.escape(str(v), quote=True)}"'
                   for k, v in attrs.items() if v is not None and v is not False)
    return Html(f"<{name}{attr}>{''.join(h(c) for c in children)}</{name}>")


def a(label: object, href: str, **attrs: object) -> Html:
    return tag("a", label, href=href, **attrs)


def join(parts: Iterable[object], sep: str = "") -> Html:
    return Html(html.escape(sep).join(h(p) for p in parts))


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], cls: str | None = None,
          row_classes: Sequence[str | None] | None = None) -> Html:
    head = "".join(f"<th>{text(x)}</th>" for x in headers)
    body = []
    for i, row in enumerate(rows):
        rc = row_classes[i] if row_classes is not None else None
        body.append((f'<tr class="{html.escape(rc)}">' if rc else "<tr>")
                    + "".join(f"<td>{h(c)}</td>" for c in row)
                    + "</tr>")
    return Html(f'<table{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}><thead><tr>{head}</tr></thead>'
                f'<tbody>{"".join(body)}</tbody></table>')


def pre(value: str | None, empty: str = "(empty)") -> Html:
    if value is None or value == "":
        return tag("p", empty, class_="muted")
    return tag("pre", value)


_TONES = {"pass": "pass", "compatible": "pass", "met": "pass", "passed": "pass", "yes": "pass",
          "fail": "fail", "excluded": "fail", "failed": "fail", "no": "fail"}


def tone(word: str) -> str:
    """pass, fail or inc (anything else: incomplete, missing, not run)."""
    return _TONES.get(word.lower(), "inc")


@lru_cache(maxsize=64)
def badge(word: str) -> Html:
    """PASS / FAIL / INCOMPLETE, compatible / excluded / incomplete, met / failed / missing."""
    return tag("span", word, class_=f"badge b-{tone(word)}")


# One rule a line, however long: the stylesheet is data, read as a whole.
STYLE = """
:root{--fg:#1f2328;--muted:#656d76;--line:#d0d7de;--bg2:#f6f8fa;--pass:#1a7f37;--fail:#cf222e;--inc:#9a6700}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);margin:0}
header.top{background:#24292f;color:#fff;padding:.55rem 1.5rem;display:flex;gap:1rem;align-items:baseline}
header.top a{color:#fff;text-decoration:none;font-weight:600}header.top .crumbs{color:#c9d1d9;font-size:.9rem}
header.top .crumbs a{color:#c9d1d9;font-weight:400}
main{padding:1rem 1.5rem 3rem;max-width:110rem}
h1{font-size:1.45rem;margin:.4rem 0 .2rem;word-break:break-all}h2{font-size:1.1rem;margin:1.6rem 0 .5rem;
border-bottom:1px solid var(--line);padding-bottom:.2rem}h3{font-size:1rem;margin:1rem 0 .3rem}
a{color:#0969da}.muted{color:var(--muted)}.sub{color:var(--muted);margin:0 0 .6rem}
table{border-collapse:collapse;margin:.4rem 0 1rem;font-size:.88rem}
th,td{border:1px solid var(--line);padding:.22rem .5rem;text-align:left;vertical-align:top}
th{background:var(--bg2);position:sticky;top:0}tbody tr:nth-child(even){background:#fbfcfd}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv th{position:static;width:11rem;font-weight:600}.grid table.kv{width:100%}
table.kv td{overflow-wrap:anywhere}
.badge{display:inline-block;padding:0 .45rem;border-radius:1rem;font-weight:700;font-size:.8rem;
border:1px solid currentColor;white-space:nowrap}
.b-pass{color:var(--pass)}.b-fail{color:var(--fail)}.b-inc{color:var(--inc)}
.headline{font-size:1.05rem;margin:.5rem 0;padding:.6rem .8rem;border-left:5px solid var(--inc);background:var(--bg2)}
.headline.v-pass{border-color:var(--pass)}.headline.v-fail{border-color:var(--fail)}
.cards{display:flex;flex-wrap:wrap;gap:.5rem;margin:.6rem 0}
.card{border:1px solid var(--line);border-radius:6px;padding:.2rem .7rem;min-width:7rem}
.card b{font-size:1.15rem;margin-right:.35rem}.card span{color:var(--muted);font-size:.82rem}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(26rem,1fr));gap:0 2rem;align-items:start}
ul.links{margin:.3rem 0 .8rem;padding-left:1.1rem;font-size:.9rem}ul.links li{margin:.2rem 0;overflow-wrap:anywhere}
nav.toc{font-size:.9rem;margin:.4rem 0}nav.toc a{margin-right:.9rem}
form.filters{display:flex;flex-wrap:wrap;gap:.8rem;align-items:end;background:var(--bg2);padding:.6rem .8rem;
border:1px solid var(--line);border-radius:6px}
form.filters label{display:flex;flex-direction:column;font-size:.8rem;color:var(--muted)}
form.filters select{font-size:.9rem;padding:.15rem;min-width:9rem}
button{font-size:.9rem;padding:.25rem .9rem}
pre{background:var(--bg2);border:1px solid var(--line);border-radius:4px;padding:.5rem .7rem;margin:.2rem 0 .8rem;
white-space:pre-wrap;overflow-wrap:anywhere;max-height:24rem;overflow:auto;font-size:.82rem}
.ctl{color:#fff;background:#8250df;border-radius:2px;padding:0 1px;font-size:.75rem}
section.attempt{border:1px solid var(--line);border-radius:6px;padding:.2rem .9rem .4rem;margin:.8rem 0}
section.attempt.superseded{opacity:.75;border-style:dashed}
tr.v-excluded td:first-child{border-left:4px solid var(--fail)}tr.v-incomplete td:first-child{border-left:4px solid var(--inc)}
.warn{color:var(--fail);font-weight:700}
.n-pass{color:var(--pass);font-weight:700}.n-fail{color:var(--fail);font-weight:700}.n-inc{color:var(--inc);font-weight:700}
section.msg{border:1px solid var(--line);border-radius:6px;margin:.5rem 0}
section.msg header{font-size:.82rem;padding:.2rem .6rem;background:var(--bg2);border-bottom:1px solid var(--line)}
section.msg pre{margin:0;border:0;border-radius:0 0 6px 6px}
section.msg.user header{background:#ddf4ff}section.msg.assistant header{background:#dafbe1}
section.msg.tool header{background:#fff8c5}
.nw{white-space:nowrap}table.runs td:first-child,table.runs td:nth-child(8){white-space:nowrap}table.runs th:nth-child(6){max-width:11rem}
"""  # noqa: E501


def page(title: str, body: Sequence[object], crumbs: Sequence[tuple[str, str]] = ()) -> bytes:
    """A whole document: a top bar with breadcrumbs, then `body`."""
    trail = "".join(f" › {a(label, href)}" for label, href in crumbs)
    doc = ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
           '<meta name="viewport" content="width=device-width,initial-scale=1">'
           f"<title>{text(title)}</title><style>{STYLE}</style></head><body>"
           f'<header class="top"><a href="/">validate view</a><span class="crumbs">{trail}</span></header>'
           f"<main>{join(body)}</main></body></html>\n")
    return doc.encode("utf-8", "replace")
