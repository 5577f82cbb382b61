"""A comparison as text (terminal), markdown (GitHub issue) or JSON (`dstrace.compare/1`)."""
from __future__ import annotations

import dataclasses
import json

from dstrace.analysis.render.json import json_safe
from dstrace.analysis.render.markdown import md_cell, md_table
from dstrace.comparison.model import Comparison, ConfigSummary, Spread
from dstrace.units import percent, ratio, size, spread, step_ms

FORMATS = ("text", "json", "markdown", "html")
HEAD = ["configuration", "status", "runs", "ms/step median [min-max]", "tok/s per seq", "tok/s all seqs",
        "vs baseline", "transfer", "wait for peers", "gathered/step", "eff. TP", "held", "DeepSpeed"]


TEXT_TABLES = (("Configurations: time", (0, 1, 2, 3, 6, 4, 5)),
               ("Configurations: model and collectives", (0, 7, 8, 9, 10, 11, 12)))
"""HEAD's columns in two tables on a terminal, so that each fits its width."""


def _spread(s: Spread | None) -> str:
    return "-" if s is None else spread(s.median, s.low, s.high)


def _row(c: ConfigSummary, comparison: Comparison) -> list[str]:
    times = comparison.verdict.ratios.get(c.name, {}).get("ms_per_step")
    ok = sum(r.status == "complete" for r in c.runs)
    agg = c.aggregate_tokens_per_s
    return [c.name, c.status, f"{ok}/{len(c.runs)}", _spread(c.ms_per_step), _spread(c.tokens_per_s),
            "-" if agg is None else f"{agg.median:.1f} ({c.sequences} seq)",
            "-" if times is None else f"{ratio(times)} ms", percent(c.transfer_share), percent(c.wait_share),
            size(c.gathered_bytes_per_step),
            "-" if c.effective_tp is None else str(c.effective_tp), percent(c.held_fraction),
            ", ".join(c.deepspeed_versions) or "-"]


def _details(c: ConfigSummary) -> str:
    parts = [f"TP requested: {'; '.join(c.tp_requested) or 'none recorded'}"]
    if c.findings:
        parts.append(f"findings: {', '.join(c.findings)}")
    if c.reason:
        parts.append(f"not complete: {c.reason}")
    parts += c.notes
    return f"{c.name}: " + "; ".join(parts)


def legend(comparison: Comparison) -> list[str]:
    """What the table's columns mean, and which steps its ms per step covers."""
    covers = sorted({c.ms_per_step_covers for c in comparison.configs if c.ms_per_step_covers})
    return ([f"ms/step: median ms per decode step of each run, over its {x}; the configuration's median and "
             "min-max over its runs" for x in covers]
            + ["transfer / wait for peers: collective kernel time over the traced span (median over ranks), split "
               "into moving data after every rank arrived and spinning until the last one did: waiting is not "
               "communicating",
               "gathered/step: bytes the ZeRO-3 all-gathers bring to each rank per decode step; eff. TP: the "
               "tensor-parallel degree measured from the weights' shapes; held: weight elements a rank holds"])


def _ratio_lines(comparison: Comparison) -> list[str]:
    v = comparison.verdict
    lines = []
    for name, r in v.ratios.items():
        if name == v.baseline:
            continue
        agg = r.get("aggregate_tokens_per_s")
        lines.append(f"{name}: {ratio(r['ms_per_step'])} the ms per step of {v.baseline}, "
                     f"{ratio(r['tokens_per_s'])} its tokens/s per sequence"
                     + (f", {ratio(agg)} its tokens/s over all sequences" if agg is not None else ""))
    return lines


def _draw(console, comparison: Comparison) -> None:
    from rich.padding import Padding
    from rich.text import Text

    from dstrace.analysis.render.text import plain, table

    def heading(title: str) -> None:
        console.print()
        console.print(plain(title, "bold underline"))

    def items(lines: list[str], style: str = "") -> None:
        for x in lines:
            console.print(Padding(plain(x, style), (0, 0, 0, 2)))

    console.print(plain(f"dstrace comparison: {len(comparison.configs)} configurations, "
                        f"{sum(len(c.runs) for c in comparison.configs)} runs", "bold"))
    v = comparison.verdict
    heading("Why")
    if not v.explanations:
        items(["nothing to explain"])
    for e in v.explanations:
        line = Text(f"[{e.id}] ", style="bold yellow")
        line.append_text(plain(e.summary))
        console.print(Padding(line, (0, 0, 0, 2)))
        if e.remedy:
            console.print(Padding(plain(f"what to do: {e.remedy}"), (0, 0, 0, 6)))
    if v.baseline:
        heading(f"Against the baseline {v.baseline}")
        items(_ratio_lines(comparison) or ["no timed run of the baseline"])
    heading(f"Indistinguishable ({v.rule})")
    items([f"{a} ~ {b}" for a, b in v.indistinguishable] or ["none"])
    rows = [_row(c, comparison) for c in comparison.configs]
    for title, columns in TEXT_TABLES:
        heading(title)
        console.print(Padding(table([HEAD[i] for i in columns], [[r[i] for i in columns] for r in rows], keys=1),
                              (0, 0, 0, 2)))
    items([_details(c) for c in comparison.configs])
    if comparison.warnings:
        heading("Warnings")
        items(comparison.warnings, "yellow")
    heading("Columns")
    items(legend(comparison))


def render_text(comparison: Comparison, screen=None) -> str:
    """The verdict (why, against the baseline, which runs cannot be told apart) first, then the table; laid
    out for `screen` (`dstrace.analysis.render.terminal`; default 100 plain columns)."""
    from dstrace.analysis.render.terminal import Screen, capture

    return capture(screen or Screen(), lambda console: _draw(console, comparison))


def render_markdown(comparison: Comparison) -> str:
    out = [f"### dstrace comparison: {len(comparison.configs)} configurations, "
           f"{sum(len(c.runs) for c in comparison.configs)} runs", ""]
    out += md_table(HEAD, [_row(c, comparison) for c in comparison.configs])
    out += ["", "**Configurations**", ""] + [f"- {md_cell(_details(c))}" for c in comparison.configs]
    v = comparison.verdict
    out += ["", f"**Indistinguishable** ({v.rule}):", ""]
    out += [f"- `{a}` ~ `{b}`" for a, b in v.indistinguishable] or ["- none"]
    if v.baseline:
        out += ["", f"**Against the baseline `{v.baseline}`**", ""] + ([f"- {x}" for x in _ratio_lines(comparison)]
                                                                      or ["- no timed run of the baseline"])
    out += ["", "**Why**", ""] + ([y for e in v.explanations for y in [f"- `{e.id}`: {md_cell(e.summary)}"]
                                   + ([f"  - what to do: {md_cell(e.remedy)}"] if e.remedy else [])]
                                  or ["- nothing to explain"])
    if comparison.warnings:
        out += ["", "<details><summary>Warnings</summary>", ""] + [f"- {md_cell(w)}" for w in comparison.warnings] \
               + ["", "</details>"]
    out += ["", "<details><summary>Columns</summary>", ""] + [f"- {md_cell(x)}" for x in legend(comparison)] \
        + ["", "</details>"]
    return "\n".join(out) + "\n"


def ms_plot(comparison: Comparison) -> str:
    """Each configuration's ms per decode step: every run a dot, the median a bar, min-max a whisker;
    inline SVG, no script."""
    from html import escape

    configs = [c for c in comparison.configs if c.ms_per_step is not None]
    if not configs:
        return "<p>No configuration has a timed run.</p>"
    row_h, left, width, top = 26, 170, 520, 20
    xmax = max(max([c.ms_per_step.high] + [r.ms_per_step for r in c.runs if r.ms_per_step is not None])
               for c in configs) * 1.08
    height = top + row_h * len(configs) + 30

    def x_of(ms: float) -> float:
        return left + width * ms / xmax

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 30}" height="{height}" role="img" '
           'class="ms-plot"><title>ms per decode step per configuration</title>',
           f'<line x1="{left}" y1="{top + row_h * len(configs)}" x2="{left + width}" '
           f'y2="{top + row_h * len(configs)}" stroke="#333"/>']
    for tick in range(5):
        ms = xmax * tick / 4
        svg.append(f'<text x="{x_of(ms):.1f}" y="{top + row_h * len(configs) + 16}" font-size="11" '
                   f'text-anchor="middle">{ms:.0f} ms</text>')
    for i, c in enumerate(configs):
        y = top + i * row_h + row_h / 2
        s = c.ms_per_step
        svg.append(f'<text x="{left - 8}" y="{y + 4:.1f}" font-size="12" text-anchor="end">{escape(c.name)}</text>'
                   f'<line x1="{x_of(s.low):.1f}" y1="{y:.1f}" x2="{x_of(s.high):.1f}" y2="{y:.1f}" stroke="#4c78a8" '
                   f'stroke-width="2"/>'
                   f'<rect class="median" x="{x_of(s.median) - 1.5:.1f}" y="{y - 8:.1f}" width="3" height="16" '
                   f'fill="#e45756"><title>{escape(c.name)}: median {step_ms(s.median)} per step over {s.runs} runs, '
                   f'{s.low:.1f}-{s.high:.1f}</title></rect>')
        for r in c.runs:
            if r.ms_per_step is not None:
                svg.append(f'<circle cx="{x_of(r.ms_per_step):.1f}" cy="{y:.1f}" r="3" fill="#4c78a8" '
                           f'fill-opacity="0.6"><title>{escape(c.name)} {escape(r.repeat)}: {step_ms(r.ms_per_step)} '
                           'per step</title></circle>')
    svg.append("</svg>")
    untimed = [c.name for c in comparison.configs if c.ms_per_step is None]
    note = f"<p>Not plotted (no timed run): {escape(', '.join(untimed))}.</p>" if untimed else ""
    return "".join(svg) + note


def render_html(comparison: Comparison) -> str:
    """One self-contained page: the plot of ms per step, then the markdown report's content as HTML lists."""
    from html import escape

    v = comparison.verdict
    rows = "".join("<tr>" + "".join(f"<td>{escape(x)}</td>" for x in _row(c, comparison)) + "</tr>"
                   for c in comparison.configs)
    why = "".join(f"<li><code>{escape(e.id)}</code>: {_code(e.summary)}"
                  + (f"<ul><li><b>what to do</b>: {_code(e.remedy)}</li></ul>" if e.remedy else "") + "</li>"
                  for e in v.explanations) or "<li>nothing to explain</li>"
    ratios = "".join(f"<li>{escape(x)}</li>" for x in _ratio_lines(comparison))
    same = "".join(f"<li>{escape(a)} ~ {escape(b)}</li>" for a, b in v.indistinguishable) or "<li>none</li>"
    warnings = "".join(f"<li>{escape(w)}</li>" for w in comparison.warnings)
    title = (f"dstrace comparison: {len(comparison.configs)} configurations, "
             f"{sum(len(c.runs) for c in comparison.configs)} runs")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}th{{background:#f3f3f3}}code{{background:#f3f3f3}}</style>
</head><body>
<h1>{escape(title)}</h1>
<h2>ms per decode step</h2><p>Each run a dot, each configuration's median a red bar, its runs' min-max the line.</p>
{ms_plot(comparison)}
<h2>Why</h2><ul>{why}</ul>
{f'<h2>Against the baseline {escape(v.baseline)}</h2><ul>{ratios}</ul>' if v.baseline and ratios else ''}
<h2>Indistinguishable</h2><p>{escape(v.rule)}</p><ul>{same}</ul>
<h2>Configurations</h2><table><thead><tr>{"".join(f"<th>{escape(h)}</th>" for h in HEAD)}</tr></thead>
<tbody>{rows}</tbody></table>
<ul>{"".join(f"<li>{escape(_details(c))}</li>" for c in comparison.configs)}</ul>
{f'<h2>Warnings</h2><ul>{warnings}</ul>' if warnings else ''}
<h2>Columns</h2><ul>{"".join(f"<li>{escape(x)}</li>" for x in legend(comparison))}</ul>
</body></html>
"""


def _code(text: str) -> str:
    import re
    from html import escape

    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def to_dict(comparison: Comparison) -> dict:
    data = dataclasses.asdict(comparison)
    return json_safe({"schema": data.pop("schema"), **data})


def render_json(comparison: Comparison) -> str:
    return json.dumps(to_dict(comparison), indent=1) + "\n"


def render(comparison: Comparison, fmt: str, screen=None) -> str:
    if fmt == "text":
        return render_text(comparison, screen)
    return {"json": render_json, "markdown": render_markdown, "html": render_html}.get(fmt, render_text)(comparison)
