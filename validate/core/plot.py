"""An inline SVG box plot of rewards per agent: no plotting stack, one self-contained string.

Each box spans the quartiles with the median inside and whiskers to the extremes; n is
written under each box; a green line marks the pass threshold and a dashed red tick each
control's own ceiling; a legend names both.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Sequence

from validate.core.records import CONTROL, MODEL, ORACLE, PROBE

WIDTH, HEIGHT = 900, 380
LEFT, RIGHT, TOP, BOTTOM = 56, 170, 24, 70
COLORS: dict[str, str] = {ORACLE: "#2b7a3d", CONTROL: "#b03a2e", PROBE: "#8a6d1f", MODEL: "#2e5aa8"}


def _quartiles(values: Sequence[float]) -> tuple[float, float, float, float, float]:
    v = sorted(values)
    if len(v) == 1:
        return v[0], v[0], v[0], v[0], v[0]
    q1, med, q3 = statistics.quantiles(v, n=4, method="inclusive")
    return v[0], q1, med, q3, v[-1]


def box_plot_svg(series: Sequence[tuple[str, str, Sequence[float]]], threshold: float,
                 ceilings: dict[str, float]) -> str:
    """`series`: (agent, role, rewards in [0, 1]) in display order."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def y(r: float) -> float:
        return TOP + plot_h * (1 - min(max(r, 0.0), 1.0))

    step = plot_w / max(len(series), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
             f'height="{HEIGHT}" font-family="sans-serif" font-size="12">',
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{LEFT - 4}" x2="{LEFT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     f'stroke="#999"/><text x="{LEFT - 8}" y="{y(tick) + 4:.1f}" '
                     f'text-anchor="end">{tick:.2f}</text>')
    parts.append(f'<text x="14" y="{TOP + plot_h / 2:.1f}" transform="rotate(-90 14 {TOP + plot_h / 2:.1f})" '
                 f'text-anchor="middle">reward</text>')
    parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(threshold):.1f}" y2="{y(threshold):.1f}" '
                 f'stroke="#2b7a3d" stroke-width="1.5"/>')
    for i, (agent, role, rewards) in enumerate(series):
        cx = LEFT + step * (i + 0.5)
        half = min(step * 0.3, 30)
        color = COLORS.get(role, "#555")
        label = html.escape(agent)
        if rewards:
            lo, q1, med, q3, hi = _quartiles(rewards)
            parts.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(hi):.1f}" y2="{y(lo):.1f}" '
                         f'stroke="{color}"/><rect x="{cx - half:.1f}" y="{y(q3):.1f}" '
                         f'width="{2 * half:.1f}" height="{max(y(q1) - y(q3), 1.0):.1f}" fill="{color}" '
                         f'fill-opacity="0.25" stroke="{color}"/><line x1="{cx - half:.1f}" '
                         f'x2="{cx + half:.1f}" y1="{y(med):.1f}" y2="{y(med):.1f}" stroke="{color}" '
                         'stroke-width="2"/>')
        if agent in ceilings:
            parts.append(f'<line x1="{cx - half - 6:.1f}" x2="{cx + half + 6:.1f}" '
                         f'y1="{y(ceilings[agent]):.1f}" y2="{y(ceilings[agent]):.1f}" stroke="#b03a2e" '
                         'stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{cx:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{label}</text>'
                     f'<text x="{cx:.1f}" y="{TOP + plot_h + 32}" text-anchor="middle" '
                     f'fill="#555">n={len(rewards)}</text>')
    lx = LEFT + plot_w + 16
    parts.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{TOP + 10}" y2="{TOP + 10}" stroke="#2b7a3d" '
                 f'stroke-width="1.5"/><text x="{lx + 30}" y="{TOP + 14}">pass threshold {threshold:g}</text>'
                 f'<line x1="{lx}" x2="{lx + 24}" y1="{TOP + 30}" y2="{TOP + 30}" stroke="#b03a2e" '
                 f'stroke-dasharray="4 3"/><text x="{lx + 30}" y="{TOP + 34}">control ceiling</text>')
    for j, (role, color) in enumerate(COLORS.items()):
        parts.append(f'<rect x="{lx}" y="{TOP + 48 + 18 * j}" width="24" height="10" fill="{color}" '
                     f'fill-opacity="0.25" stroke="{color}"/><text x="{lx + 30}" '
                     f'y="{TOP + 57 + 18 * j}">{role}</text>')
    parts.append("</svg>")
    return "".join(parts)
