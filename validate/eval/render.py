"""The eval documents' (report, comparison) stylesheet; they are rendered by the harness's
one renderer, `validate.core.render`."""

from __future__ import annotations

STYLE = ("body{font-family:system-ui,sans-serif;max-width:80rem;margin:2rem auto;padding:0 1rem;color:#222}"
         "h1,h2,h3{overflow-wrap:anywhere}"
         "table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem;"
         "text-align:left;vertical-align:top;font-size:.9rem}th{background:#f3f3f3}"
         ".msg{border:1px solid #ccc;border-radius:4px;margin:.4rem 0}"
         ".msg header{font-size:.8rem;padding:.2rem .5rem;background:#f3f3f3}"
         ".msg pre{margin:0;padding:.4rem .5rem;white-space:pre-wrap;word-break:break-word;max-height:24rem;"
         "overflow:auto;font-size:.8rem}.system header{background:#eee}"
         ".user header{background:#e8f0fe}"
         ".assistant header{background:#e6f4ea}.tool header{background:#fef7e0}")
