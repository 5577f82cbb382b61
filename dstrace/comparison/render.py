"""A comparison as text (terminal), markdown (GitHub issue) or JSON (`dstrace.compare/1`)."""
from __future__ import annotations

import dataclasses
import json
import math

from dstrace.analysis.render.common import size
from dstrace.comparison.model import Comparison, ConfigSummary, Spread
from dstrace.say import md_inline

FORMATS = ("text", "json", "markdown")
HEAD = ["configuration", "status", "runs", "ms/step median [min-max]", "tok/s per seq", "tok/s all seqs",
        "vs baseline", "transfer", "wait for peers", "gathered/step", "eff. TP", "held", "DeepSpeed"]


TEXT_TABLES = (("Configurations: time", (0, 1, 2, 3, 6, 4, 5)),
               ("Configurations: model and collectives", (0, 7, 8, 9, 10, 11, 12)))
"""HEAD's columns in two tables on a terminal, so that each fits its width."""


def _spread(s: Spread | None, digits: int = 1) -> str:
    return "-" if s is None else f"{s.median:.{digits}f} [{s.low:.{digits}f}-{s.high:.{digits}f}]"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _row(c: ConfigSummary, comparison: Comparison) -> list[str]:
    ratio = comparison.verdict.ratios.get(c.name, {}).get("ms_per_step")
    ok = sum(r.status == "complete" for r in c.runs)
    agg = c.aggregate_tokens_per_s
    return [c.name, c.status, f"{ok}/{len(c.runs)}", _spread(c.ms_per_step), _spread(c.tokens_per_s),
            "-" if agg is None else f"{agg.median:.1f} ({c.sequences} seq)",
            "-" if ratio is None else f"{ratio:.2f}x ms", _pct(c.transfer_share), _pct(c.wait_share),
            size(c.gathered_bytes_per_step),
            "-" if c.effective_tp is None else str(c.effective_tp), _pct(c.held_fraction),
            ", ".join(c.deepspeed_versions) or "-"]


def _details(c: ConfigSummary) -> str:
    parts = [f"TP requested: {'; '.join(c.tp_requested) or 'none'}"]
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
        lines.append(f"{name}: {r['ms_per_step']:.2f}x the ms per step of {v.baseline}, "
                     f"{r['tokens_per_s']:.2f}x its tokens/s per sequence"
                     + (f", {agg:.2f}x its tokens/s over all sequences" if agg is not None else ""))
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


def _cell(text: str) -> str:
    return md_inline(text).replace("|", "\\|")


def render_markdown(comparison: Comparison) -> str:
    out = [f"### dstrace comparison: {len(comparison.configs)} configurations, "
           f"{sum(len(c.runs) for c in comparison.configs)} runs", "",
           "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(_cell(x) for x in _row(c, comparison)) + " |" for c in comparison.configs]
    out += ["", "**Configurations**", ""] + [f"- {_cell(_details(c))}" for c in comparison.configs]
    v = comparison.verdict
    out += ["", f"**Indistinguishable** ({v.rule}):", ""]
    out += [f"- `{a}` ~ `{b}`" for a, b in v.indistinguishable] or ["- none"]
    if v.baseline:
        out += ["", f"**Against the baseline `{v.baseline}`**", ""] + ([f"- {x}" for x in _ratio_lines(comparison)]
                                                                      or ["- no timed run of the baseline"])
    out += ["", "**Why**", ""] + ([y for e in v.explanations for y in [f"- `{e.id}`: {_cell(e.summary)}"]
                                   + ([f"  - what to do: {_cell(e.remedy)}"] if e.remedy else [])]
                                  or ["- nothing to explain"])
    if comparison.warnings:
        out += ["", "<details><summary>Warnings</summary>", ""] + [f"- {_cell(w)}" for w in comparison.warnings] \
               + ["", "</details>"]
    out += ["", "<details><summary>Columns</summary>", ""] + [f"- {_cell(x)}" for x in legend(comparison)] \
        + ["", "</details>"]
    return "\n".join(out) + "\n"


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_dict(comparison: Comparison) -> dict:
    data = dataclasses.asdict(comparison)
    return _clean({"schema": data.pop("schema"), **data})


def render_json(comparison: Comparison) -> str:
    return json.dumps(to_dict(comparison), indent=1) + "\n"


def render(comparison: Comparison, fmt: str, screen=None) -> str:
    if fmt == "text":
        return render_text(comparison, screen)
    return {"json": render_json, "markdown": render_markdown}.get(fmt, render_text)(comparison)
