"""Draw the figures of docs/root-cause.md from a `dstrace compare --format json` result, as plain SVG.

    python analysis/figures.py analysis/h200x2-qwen2-1.5b-compare.json docs/figures/h200x2-qwen2-1.5b
"""
from __future__ import annotations

import json
import sys
from html import escape

BAR_H, GAP, LABEL_W, PLOT_W = 22, 10, 170, 420


def bar_chart(title: str, rows: list[tuple[str, float, float, float]], unit: str) -> str:
    """Horizontal bars of each configuration's median with a min-max whisker."""
    top = max(hi for _, _, _, hi in rows) or 1.0
    height = 40 + len(rows) * (BAR_H + GAP)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + PLOT_W + 90}" height="{height}" '
             'font-family="sans-serif" font-size="12">',
             f'<text x="4" y="16" font-weight="bold">{escape(title)}</text>']
    for i, (name, med, lo, hi) in enumerate(rows):
        y = 30 + i * (BAR_H + GAP)
        w = PLOT_W * med / top
        parts.append(f'<text x="4" y="{y + 15}">{escape(name)}</text>')
        parts.append(f'<rect x="{LABEL_W}" y="{y}" width="{w:.1f}" height="{BAR_H}" fill="#4c78a8"/>')
        if hi > lo:
            x0, x1 = LABEL_W + PLOT_W * lo / top, LABEL_W + PLOT_W * hi / top
            mid = y + BAR_H / 2
            parts.append(f'<line x1="{x0:.1f}" y1="{mid}" x2="{x1:.1f}" y2="{mid}" stroke="#222"/>')
        parts.append(f'<text x="{LABEL_W + w + 6 if hi <= lo else LABEL_W + PLOT_W * hi / top + 6:.1f}" '
                     f'y="{y + 15}">{med:.1f} {escape(unit)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def main(result: str, prefix: str) -> None:
    with open(result) as f:
        configs = [c for c in json.load(f)["configs"] if c["status"] == "complete"]
    steps = [(c["name"], c["ms_per_step"]["median"], c["ms_per_step"]["low"], c["ms_per_step"]["high"])
             for c in configs]
    gathered = [(c["name"], (c["gathered_bytes_per_step"] or 0) / 1e9, 0.0, 0.0) for c in configs]
    with open(f"{prefix}-ms-per-step.svg", "w") as f:
        f.write(bar_chart("ms per decode step (median, min-max over repeats)", steps, "ms"))
    with open(f"{prefix}-gathered-per-step.svg", "w") as f:
        f.write(bar_chart("bytes all-gathered per decode step per rank", gathered, "GB"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
