"""The terminal report: findings first, then the numbers behind them."""
from __future__ import annotations

from dstrace.analysis.model import Analysis
from dstrace.analysis.render.common import collective_rows, rank_rows, ranks_line, ranks_of, steps_line, time_scope


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows]


def render_text(a: Analysis) -> str:
    out = [f"dstrace analysis of {a.trace_dir}", ranks_line(a), ""]
    out.append("Findings")
    if not a.findings:
        out.append("  none: no finding's evidence holds in these traces")
    for f in a.findings:
        out.append(f"  [{f.id}] {ranks_of(f)}: {f.summary}")
    out.append("")
    line = steps_line(a)
    if line:
        out += ["Steps", f"  {line}", ""]
    if a.ranks:
        out += [f"Time per rank ({time_scope(a)})"]
        out += ["  " + x for x in table(*rank_rows(a))]
    head, rows = collective_rows(a)
    if rows:
        out += ["", "Collectives"] + ["  " + x for x in table(head, rows)]
    hta_lines = []
    for r, s in sorted(a.ranks.items()):
        t = s.hta.get("temporal")
        if t:
            causes = ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in (s.hta.get("idle_causes_us") or {}).items())
            hta_lines.append(f"  rank {r}: idle {t['idle_pct']:.1f}%, compute {t['compute_pct']:.1f}%, non-compute "
                             f"{t['non_compute_pct']:.1f}%, comm/compute overlap {s.hta.get('comm_comp_overlap_pct')}%"
                             + (f"; idle causes (summed over streams): {causes}" if causes else ""))
        where = s.host_time.get("in_dstrace_ranges") or {}
        if where:
            hta_lines.append(f"  rank {r}: host during GPU idle: " + ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in where.items()))
    if hta_lines:
        out += ["", "HTA breakdown"] + hta_lines
    applied = {r: o for r, o in a.clock.items() if o.applied}
    if applied:
        out += ["", "Clock alignment (on ends of matched collectives)"]
        out += [f"  rank {r}: offset {o.offset_us:+.1f} us vs rank {o.via}, residual {o.residual_us or 0:.1f} us over {o.matched} collectives"
                for r, o in sorted(applied.items())]
    for label, items in (("Notes", a.notes), ("Warnings", a.warnings)):
        if items:
            out += ["", label] + [f"  {x}" for x in items]
    return "\n".join(out) + "\n"
