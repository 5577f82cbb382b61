"""The terminal report: findings first, then the numbers behind them."""
from __future__ import annotations

import textwrap

from dstrace.analysis.model import Analysis
from dstrace.say import one_line
from dstrace.analysis.render.common import (
    LEGEND, collective_rows, finding_details, rank_rows, ranks_line, ranks_of, step_time_line, steps_line, time_scope,
)

WIDTH = 120


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    head, rows = [one_line(x) for x in head], [[one_line(x) for x in r] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows]


def render_text(a: Analysis) -> str:
    out = [f"dstrace analysis of {one_line(a.trace_dir)}", one_line(ranks_line(a)), ""]
    out.append("Findings")
    if not a.findings:
        out.append("  none: no finding's evidence holds in these traces")
    for f in a.findings:
        out.append(f"  [{f.id}] {ranks_of(f)}: {one_line(f.summary)}")
        for label, text in finding_details(f):
            out += textwrap.wrap(f"{label}: {one_line(text)}", WIDTH, initial_indent="      ", subsequent_indent="        ")
    out.append("")
    lines = [x for x in (step_time_line(a), steps_line(a)) if x]
    if lines:
        out += ["Steps"] + [f"  {one_line(x)}" for x in lines] + [""]
    if a.ranks:
        out += [f"Time per rank ({time_scope(a)}): shares of the span"]
        out += ["  " + x for x in table(*rank_rows(a))]
    head, rows = collective_rows(a)
    if rows:
        out += ["", "Collectives"] + ["  " + x for x in table(head, rows)]
    hta_lines = []
    for r, s in sorted(a.ranks.items()):
        t = s.hta.get("temporal")
        if t:
            causes = ", ".join(f"{one_line(k)} {v / 1e3:.2f} ms" for k, v in (s.hta.get("idle_causes_us") or {}).items())
            overlap = s.hta.get("comm_comp_overlap_pct")
            hta_lines.append(f"  rank {r}: HTA's own idle {t['idle_pct']:.1f}%, compute {t['compute_pct']:.1f}%"
                             + _communication_in_compute(t) + f", non-compute {t['non_compute_pct']:.1f}%"
                             + (f", comm/compute overlap {overlap:.1f}%" if overlap is not None else "")
                             + (f"; HTA's idle causes (summed over streams, not a share of the GPU's idle): {causes}"
                                if causes else ""))
        where = s.host_time.get("in_dstrace_ranges") or {}
        if where:
            hta_lines.append(f"  rank {r}: host during GPU idle: "
                             + ", ".join(f"{one_line(k)} {v / 1e3:.2f} ms" for k, v in where.items()))
    if hta_lines:
        out += ["", "HTA breakdown (HTA's own measure: every GPU event with a stream, timestamps cut to whole "
                    "microseconds; the idle in the table above is dstrace's, over kernels, copies and memsets)"] + hta_lines
    applied = {r: o for r, o in a.clock.items() if o.applied}
    if applied:
        out += ["", "Clock alignment (on ends of matched collectives)"]
        out += [f"  rank {r}: offset {o.offset_us:+.1f} us vs rank {o.via}, residual {o.residual_us or 0:.1f} us over {o.matched} collectives"
                for r, o in sorted(applied.items())]
    for label, items in (("Notes", a.notes), ("Warnings", a.warnings)):
        if items:
            out += ["", label] + [f"  {one_line(x)}" for x in items]
    if a.ranks:
        out += ["", "Columns"] + [y for term, meaning in LEGEND for y in textwrap.wrap(
            f"{term}: {meaning}", WIDTH, initial_indent="  ", subsequent_indent="    ")]
    return "\n".join(out) + "\n"


def _communication_in_compute(temporal: dict) -> str:
    """What of HTA's compute is communication dstrace recognised (DeepEP, custom all-reduce...), which HTA
    types as computation: said next to HTA's compute share, never left for a reader to take as compute."""
    typed = temporal.get("communication_in_compute_us") or {}
    span = temporal.get("span_us") or 0.0
    if not typed or not span > 0:
        return ""
    parts = " and ".join(f"{us / 1e3:.2f} ms of {one_line(lib)} communication kernels ({us / span:.1%} of the span)"
                         for lib, us in sorted(typed.items()))
    return f" (it includes {parts}, which HTA types as computation)"
