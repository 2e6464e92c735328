"""Report rendering: agent text is inert in Markdown and HTML; the plot is one inline SVG."""

from __future__ import annotations

import re

from validate.core.plot import box_plot_svg
from validate.core.render import Bold, md_text, to_html, to_markdown

HOSTILE = "| x | *bold* [link](http://evil) <script>alert(1)</script> `code`\n# heading\n1. list"


def test_agent_text_is_inert_in_markdown():
    md = to_markdown([("p", [HOSTILE]), ("table", ["a", "b"], [[HOSTILE, "ok"]])])
    table_rows = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table_rows) == 3  # header, rule, one row: the injected newline and pipes made no new row
    assert all(len(re.split(r"(?<!\\)\|", row)) == 4 for row in table_rows)  # and no new column
    assert "<script>" not in md and "\\<script\\>" in md and "\\*bold\\*" in md and "\\[link\\]" in md
    assert not any(line.startswith("#") for line in md.splitlines())
    assert md_text("1. x") == "1\\. x" and md_text("- x") == "\\- x"


def test_agent_text_is_inert_in_html_and_only_bold_is_ours():
    page = to_html([("p", [Bold("Dataset verdict: PASS"), HOSTILE]), ("table", ["a"], [[HOSTILE]])],
                   "Validation report", "")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("<strong>") == 1 and "**" not in page


def test_the_plot_is_a_self_contained_svg_with_n_ceilings_and_a_legend():
    svg = box_plot_svg([("oracle", "oracle", [1.0] * 5), ("shuffled", "control", [0.2, 0.3, 0.5]),
                        ("<b>", "control", [])], 1.0, {"shuffled": 0.6})
    assert (
        svg.startswith("<svg")
        and svg.endswith("</svg>")
        and "http" not in svg.replace("http://www.w3.org", "")
    )
    assert "n=5" in svg and "n=3" in svg and "n=0" in svg and "&lt;b&gt;" in svg
    assert "pass threshold 1" in svg and "control ceiling" in svg and 'stroke-dasharray="4 3"' in svg


def test_a_report_reads_exactly_the_files_it_names(tmp_path):
    """Rendering is a pure function of the named files: a later smoke entry, a sibling run or
    a move changes nothing until it is named; a name outside a report's inputs is refused."""
    import shutil
    from pathlib import Path

    import pytest

    from validate.core.errors import EvidenceError
    from validate.report.run import load_run, render, report_inputs

    src = sorted((Path(__file__).resolve().parents[1] / "ledgers").glob("twohop-pool-*"))[-1]
    root = tmp_path / "a" / src.name
    shutil.copytree(src, root)
    names = report_inputs(root)
    assert "run.json" in names and any(n.startswith("smoke/") for n in names)
    before = render(root, names)
    (smoke,) = (root / "smoke").iterdir()
    shutil.copytree(smoke, root / "smoke" / "99990101T000000000000Z")
    shutil.copytree(root, tmp_path / "a" / "sibling")
    moved = tmp_path / "b" / "elsewhere"
    shutil.copytree(root, moved)
    assert render(root, names) == before == render(moved, names)
    again = render(root, report_inputs(root))
    assert again != before and b"the latest of 2" in again["report.md"]
    with pytest.raises(EvidenceError, match="checksums is not a file a report reads"):
        load_run(root, [*names, "checksums"])
