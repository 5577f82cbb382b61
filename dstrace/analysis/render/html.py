"""One self-contained HTML file: findings, per-rank time bars and collective waits over time as inline SVG.

No script, no CDN, no network: the file opens anywhere and can be attached to an issue.
"""
from __future__ import annotations

import html
import re

from dstrace.analysis.results import SPAN_PARTS, Analysis, span_parts
from dstrace.explain import doc_link
from dstrace.analysis.render.common import (
    collective_rows, finding_details, legend, library_rows, rank_rows, ranks_line, ranks_of,
    shown_parts, step_time_line, steps_line, used_terms,
)
from dstrace.units import ms, percent, step_ms

COLORS = {"compute": "#4c78a8", "transfer": "#e45756", "wait for peers": "#f2a541", "split withheld": "#bab0ac",
          "other busy": "#b279a2", "idle": "#d8d8d8"}
RANK_COLORS = ["#4c78a8", "#e45756", "#54a24b", "#f58518", "#b279a2", "#72b7b2", "#eeca3b", "#9d755d"]
MAX_POINTS = 4000
"""Scatter points drawn at most (evenly thinned): keeps the file small for long windows."""


def _esc(x) -> str:
    return html.escape(str(x))


def _prose(x) -> str:
    """A sentence of a finding: escaped, its `code` spans shown as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _esc(x))


def time_bars(a: Analysis) -> str:
    """Per rank: a bar over its span split into compute, transfer, wait for peers, other busy and idle."""
    width, bar_h, left = 640, 22, 60
    rows = sorted(a.ranks.items())
    h = 30 + len(rows) * (bar_h + 8) + 24
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + left + 20}" height="{h}" role="img" '
           'aria-label="time per rank">']
    for i, (r, s) in enumerate(rows):
        y = 10 + i * (bar_h + 8)
        svg.append(f'<text x="0" y="{y + 15}" font-size="12">rank {r}</text>')
        if s.span_us <= 0:
            continue
        parts = span_parts(s)
        segs = [(k, parts[k]) for k in SPAN_PARTS]
        x = float(left)
        for name, us in segs:
            w = width * us / s.span_us
            if w <= 0:
                continue
            svg.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{COLORS[name]}">'
                       f'<title>rank {r} {name}: {ms(us)} ({percent(us / s.span_us)})</title></rect>')
            x += w
    ly = h - 12
    for j, (name, color) in enumerate(COLORS.items()):
        svg.append(f'<rect x="{left + j * 120}" y="{ly - 10}" width="12" height="12" fill="{color}"/>'
                     f'<text x="{left + j * 120 + 16}" y="{ly}" font-size="12">{name}</text>')
    svg.append("</svg>")
    return "".join(svg)


def wait_scatter(a: Analysis) -> str:
    """Each matched collective: when it started (x) and how long its rank waited for the last peer (y)."""
    df = a.waits_over_time
    if df.empty:
        return "<p>No collectives.</p>"
    if len(df) > MAX_POINTS:
        df = df.iloc[:: len(df) // MAX_POINTS + 1]
    width, height, left, bottom = 640, 220, 60, 30
    xmax = max(float(df["ts_ms"].max()), 1e-9)
    ymax = max(float(df["wait_us"].max()) / 1e3, 1e-9)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + left + 20}" height="{height + bottom + 30}" role="img">',
             f'<line x1="{left}" y1="{height}" x2="{left + width}" y2="{height}" stroke="#333"/>',
             f'<line x1="{left}" y1="0" x2="{left}" y2="{height}" stroke="#333"/>',
             f'<text x="{left}" y="{height + 18}" font-size="11">0</text>',
             f'<text x="{left + width - 60}" y="{height + 18}" font-size="11">{xmax:.1f} ms</text>',
             f'<text x="0" y="12" font-size="11">{ymax:.2f} ms</text>',
             f'<text x="0" y="{height}" font-size="11">0</text>']
    ranks = sorted(df["rank"].unique())
    for rank, ts, wait, kind in zip(df["rank"], df["ts_ms"], df["wait_us"], df["kind"]):
        color = RANK_COLORS[ranks.index(rank) % len(RANK_COLORS)]
        x = left + width * float(ts) / xmax
        y = height - height * float(wait) / 1e3 / ymax
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}">'
                     f'<title>rank {rank} {_esc(kind)} at {ts:.2f} ms: waited {wait / 1e3:.3f} ms</title></circle>')
    for j, rank in enumerate(ranks):
        color = RANK_COLORS[j % len(RANK_COLORS)]
        parts.append(f'<circle cx="{left + 8 + j * 70}" cy="{height + bottom + 10}" r="5" fill="{color}"/>'
                     f'<text x="{left + 16 + j * 70}" y="{height + bottom + 14}" font-size="12">rank {rank}</text>')
    parts.append("</svg>")
    return "".join(parts)


MAX_PLOTTED_CALLS = 8
MAX_PLOTTED_RANKS = 16
KIND_SHAPES = ("circle", "square", "diamond", "triangle")


def _shifts(a: Analysis) -> dict[int, int]:
    """call -> first step of the new level, from the step-time-shift finding."""
    f = next((f for f in a.findings if f.id == "step-time-shift"), None)
    calls = (f.evidence.get("calls") or {}) if f else {}
    return {int(c): int(e["start"]) for c, e in calls.items() if isinstance(e, dict) and "start" in e}


def _marker(kind_index: int, x: float, y: float, color: str, title: str) -> str:
    shape = KIND_SHAPES[kind_index % len(KIND_SHAPES)]
    tip = f"<title>{_esc(title)}</title>"
    if shape == "square":
        return f'<rect x="{x - 3:.1f}" y="{y - 3:.1f}" width="6" height="6" fill="{color}">{tip}</rect>'
    if shape == "diamond":
        return (f'<polygon points="{x:.1f},{y - 4:.1f} {x + 4:.1f},{y:.1f} {x:.1f},{y + 4:.1f} {x - 4:.1f},{y:.1f}" '
                f'fill="{color}">{tip}</polygon>')
    if shape == "triangle":
        return (f'<polygon points="{x:.1f},{y - 4:.1f} {x + 4:.1f},{y + 3:.1f} {x - 4:.1f},{y + 3:.1f}" '
                f'fill="{color}">{tip}</polygon>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}">{tip}</circle>'


def step_plot(a: Analysis, call: int) -> str:
    """One call's decode-step times per rank (the prefill, step 0, left out: it is of another scale), the
    profiled steps shaded between the profiler's start and stop, and the step where the time shifts."""
    series = [s for s in a.step_series if s.call == call][:MAX_PLOTTED_RANKS]
    width, height, left, bottom, top = 640, 200, 60, 34, 18
    last = max(len(s.step_ms) for s in series) - 1
    ymax = max(max(s.step_ms[1:]) for s in series) * 1.05 or 1.0
    kinds = sorted({k for s in series for k in s.kinds[1:]})

    def x_of(step: float) -> float:
        return left + width * (step - 0.5) / max(last, 1)

    def y_of(value: float) -> float:
        return top + height - height * value / ymax

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + left + 30}" height="{height + top + bottom + 26}" '
           f'role="img" class="step-plot" data-call="{call}"><title>call {call}: ms per decode step per rank</title>',
           f'<line x1="{left}" y1="{top + height}" x2="{left + width}" y2="{top + height}" stroke="#333"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + height}" stroke="#333"/>',
           f'<text x="0" y="{top + 4}" font-size="11">{ymax:.1f} ms</text>',
           f'<text x="0" y="{top + height}" font-size="11">0 ms</text>',
           f'<text x="{left}" y="{top + height + 16}" font-size="11">step 1</text>',
           f'<text x="{left + width - 50}" y="{top + height + 16}" font-size="11">step {last}</text>']
    profiled = sorted({p for s in series for p in s.profiled if p >= 1})
    if profiled:
        x0, x1 = x_of(profiled[0] - 0.5), x_of(profiled[-1] + 0.5)
        svg.append(f'<rect class="profiled" x="{x0:.1f}" y="{top}" width="{x1 - x0:.1f}" height="{height}" '
                   f'fill="#4c78a8" fill-opacity="0.12"><title>profiled steps {profiled[0]}-{profiled[-1]}</title>'
                   '</rect>')
        for x in (x0, x1):
            svg.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + height}" stroke="#4c78a8" '
                       f'stroke-dasharray="3,3"/>')
        svg.append(f'<text x="{x0:.1f}" y="{top - 4}" font-size="11" fill="#4c78a8">profiled: steps {profiled[0]}-'
                   f'{profiled[-1]} (the profiler starts before the first and stops after the last)</text>')
    shift = _shifts(a).get(call)
    if shift:
        x = x_of(shift - 0.5)
        svg.append(f'<line class="shift" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + height}" stroke="#e45756" '
                   f'stroke-width="2"><title>step time shifts from step {shift} on</title></line>'
                   f'<text x="{x + 4:.1f}" y="{top + 12}" font-size="11" fill="#e45756">shift at step {shift}</text>')
    for j, s in enumerate(series):
        color = RANK_COLORS[j % len(RANK_COLORS)]
        points = [(i, t) for i, t in enumerate(s.step_ms) if i >= 1]
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="'
                   + " ".join(f"{x_of(i):.1f},{y_of(t):.1f}" for i, t in points) + '"/>')
        for i, t in points:
            kind = s.kinds[i] if i < len(s.kinds) else None
            title = f"rank {s.rank} step {i}: {step_ms(t)}" + (f" ({kind})" if kind else "")
            svg.append(_marker(kinds.index(kind) if kind in kinds else 0, x_of(i), y_of(t), color, title))
    ly = top + height + bottom
    for j, s in enumerate(series):
        svg.append(f'<circle cx="{left + 8 + j * 70}" cy="{ly - 4}" r="5" fill="{RANK_COLORS[j % len(RANK_COLORS)]}"/>'
                   f'<text x="{left + 16 + j * 70}" y="{ly}" font-size="12">rank {s.rank}</text>')
    for j, kind in enumerate(kinds):
        svg.append(_marker(j, left + 8 + j * 110, ly + 18, "#555", kind)
                   + f'<text x="{left + 16 + j * 110}" y="{ly + 22}" font-size="12">{_esc(kind)}</text>')
    svg.append("</svg>")
    return "".join(svg)


def step_plots(a: Analysis) -> str:
    calls = sorted({s.call for s in a.step_series})
    if not calls:
        return ""
    plots = "".join(f"<h3>call {c}</h3>{step_plot(a, c)}" for c in calls[:MAX_PLOTTED_CALLS])
    more = (f"<p>{len(calls) - MAX_PLOTTED_CALLS} more calls not plotted.</p>" if len(calls) > MAX_PLOTTED_CALLS
            else "")
    ranks = len({s.rank for s in a.step_series})
    if ranks > MAX_PLOTTED_RANKS:
        more += f"<p>The first {MAX_PLOTTED_RANKS} of {ranks} ranks are plotted.</p>"
    return ("<h2>Step times per call and rank</h2><p>Each decode step's time as the manifests recorded it "
            "(step 0, the prefill, left out); the shaded steps are those the profiler recorded.</p>" + plots + more)


def _table(head, rows) -> str:
    th = "".join(f"<th>{_esc(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def _finding(f) -> str:
    details = "".join(f"<li><b>{_esc(label)}</b>: " + (f'<a href="{_esc(doc_link(text))}">{_esc(text)}</a>'
                                                       if label == "docs" else _prose(text)) + "</li>"
                      for label, text in finding_details(f))
    return (f"<li><code>{_esc(f.id)}</code> ({_esc(ranks_of(f))}): {_prose(f.summary)}"
            + (f"<ul>{details}</ul>" if details else "") + "</li>")


def render_html(a: Analysis, verbose: bool = False) -> str:
    """The report; its legend has the terms the tables use (every term with `verbose`)."""
    findings = "".join(_finding(f) for f in a.findings) or "<li>none</li>"
    line = "; ".join(x for x in (step_time_line(a), steps_line(a)) if x)
    extra = "".join(f"<h2>{label}</h2><ul>" + "".join(f"<li>{_esc(x)}</li>" for x in items) + "</ul>"
                    for label, items in (("Notes", a.notes), ("Warnings", a.warnings)) if items)
    head, rows = collective_rows(a)
    lib_head, lib_rows = library_rows(a)
    parts = shown_parts(a, every=verbose)
    terms = legend(a, None if verbose else used_terms(a, parts))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dstrace analysis: {_esc(a.run_id or a.trace_dir)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}th{{background:#f3f3f3}}code{{background:#f3f3f3}}</style>
</head><body>
<h1>dstrace analysis</h1>
<p>{_esc(a.trace_dir)}: {_esc(ranks_line(a))}</p>
{f'<p>{_esc(line)}</p>' if line else ''}
<h2>Findings</h2><ul>{findings}</ul>
{step_plots(a)}
<h2>Time per rank (shares of the span)</h2>{time_bars(a)}{_table(*rank_rows(a, parts))}
<h2>Collective waits over time</h2>{wait_scatter(a)}
{('<h2>Collectives</h2>' + _table(head, rows)) if rows else ''}
{('<h2>Communication time by library</h2>' + _table(lib_head, lib_rows)) if lib_rows else ''}
{extra}
{('<h2>Columns</h2><dl>' + "".join(f"<dt>{_esc(t)}</dt><dd>{_esc(m)}</dd>" for t, m in terms) + '</dl>') if terms else ''}
</body></html>
"""
