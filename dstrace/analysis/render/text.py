"""The terminal report: the verdict first (each finding's cause, remedy and one line of its evidence), then
the numbers behind it, then what the terms it used mean. `--verbose` adds HTA's breakdown, the clock
alignment, every span part and every term, and each finding whole (by default its headline, cause and
remedy are cut at what fits the findings on one screen, two lines each at least). Laid out by rich for the screen it goes to (`terminal`)."""
from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from dstrace.analysis.results import Analysis, Finding, HtaTemporal
from dstrace.analysis.render.common import (
    collective_rows, evidence_line, finding_details, legend, library_rows, rank_rows, ranks_line, ranks_of,
    shown_parts, step_time_line, steps_line, time_scope, used_terms,
)
from dstrace.analysis.render.terminal import Screen, capture
from dstrace.explain import doc_link
from dstrace.say import one_line
from dstrace.units import ms, percent, us

INDENT = 2


def plain(text: str, style: str = "") -> Text:
    """An untrusted value as rich text: one line, control characters escaped, never read as markup."""
    return Text(one_line(text), style=style)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def units_in_head(head: list[str], rows: list[list[str]], unit: str = " ms") -> tuple[list[str], list[list[str]]]:
    """A column whose every value is in ms says so once, in its header: narrower columns, same numbers."""
    head, rows = list(head), [list(r) for r in rows]
    for i in range(len(head)):
        values = [r[i] for r in rows if r[i] != "-"]
        if values and all(v.endswith(unit) and _number(v.removesuffix(unit)) for v in values):
            head[i] += unit
            for r in rows:
                r[i] = r[i].removesuffix(unit)
    return head, rows


def shares_only(rows: list[list[str]], first: int, last: int) -> list[list[str]]:
    """`22.37 ms (2%)` -> `2%` in columns first..last-1: the default table shows the shares, --verbose both."""
    return [r[:first] + [c.rsplit("(", 1)[-1].rstrip(")") if "(" in c else c for c in r[first:last]] + r[last:]
            for r in rows]


def table(head: list[str], rows: list[list[str]], keys: int = 2) -> Table:
    """The first `keys` columns name the row (never wrapped); the others are numbers, right-aligned."""
    head, rows = units_in_head(head, rows)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for i, h in enumerate(head):
        t.add_column(plain(h), justify="left" if i < keys else "right", no_wrap=i < keys, overflow="fold")
    for r in rows:
        t.add_row(*(plain(c) for c in r))
    return t


def labelled(label: str, text: str, style: str = "") -> Text:
    line = Text(f"{label}: ", style="bold")
    line.append_text(plain(text, style))
    return line


SCREEN_LINES = 40
"""The first screen, which the default verdict fills where it can: a terminal of 40 rows or more."""


def verdict_cap(findings: int) -> int:
    """Lines each finding's headline, cause and remedy get by default: what fits the findings on one screen
    (after the report's title, ranks line and heading, each finding also has an evidence line and about two
    of docs), never under two (the rest: --verbose)."""
    return max(2, (SCREEN_LINES - 5 - 3 * findings) // (3 * max(findings, 1)))


def capped(console, text: Text, width: int, lines: int | None) -> tuple[list[Text], bool]:
    """`text` wrapped to `width`, at most `lines` lines (None: all), the last one ending in an ellipsis
    where the text goes on; and whether it was cut."""
    wrapped = list(text.wrap(console, width))
    if lines is None or len(wrapped) <= lines:
        return wrapped, False
    last = wrapped[lines - 1]
    last.rstrip()
    last.truncate(width - 1)
    last.append("…")
    return wrapped[:lines], True


def _finding(console, f: Finding, cap: int | None) -> bool:
    """Print one finding, its headline, cause and remedy cut at `cap` lines each; whether any was cut."""
    from rich.padding import Padding

    head = Text(f"[{f.id}] ", style="bold yellow")
    head.append(f"{ranks_of(f)}: ", style="bold")
    head.append_text(plain(f.summary))
    shown, cut = capped(console, head, console.width - INDENT, cap)
    for line in shown:
        console.print(Padding(line, (0, 0, 0, INDENT)))
    lines = [(label, labelled(label, f"dstrace explain {f.id}, or {doc_link(text)}" if label == "docs" else text,
                              "cyan" if label == "docs" else ""))
             for label, text in finding_details(f)]
    evidence = evidence_line(f)
    if evidence:
        line = labelled("evidence", evidence, "dim")
        if cap is not None:
            line.no_wrap, line.overflow = True, "ellipsis"
        lines.insert(2, ("evidence", line))
    width = console.width - INDENT - 4
    for label, line in lines:
        shown, more = capped(console, line, width, cap if label in ("why", "what to do") else None)
        cut |= more
        for part in shown:
            console.print(Padding(part, (0, 0, 0, INDENT + 4)))
    return cut


def _hta_lines(a: Analysis) -> list[str]:
    out = []
    for r, s in sorted(a.ranks.items()):
        t = s.hta.temporal
        if t and s.sparse:
            out.append(f"rank {r}: HTA's shares left out: {s.sparse}, too little to split (as in the table above)")
        elif t:
            causes = ", ".join(f"{k} {ms(v)}" for k, v in (s.hta.idle_causes_us or {}).items())
            overlap = s.hta.comm_comp_overlap_pct
            out.append(f"rank {r}: HTA's own idle {_hta_pct(t.idle_pct)}, compute {_hta_pct(t.compute_pct)}"
                       + _communication_in_compute(t) + f", non-compute {_hta_pct(t.non_compute_pct)}"
                       + (f", comm/compute overlap {_hta_pct(overlap)}" if overlap is not None and overlap == overlap else "")
                       + (f"; HTA's idle causes (summed over streams, not a share of the GPU's idle): {causes}"
                          if causes else ""))
        where = s.host_time.get("in_dstrace_ranges") or {}
        if where:
            out.append(f"rank {r}: host during GPU idle: " + ", ".join(f"{k} {ms(v)}" for k, v in where.items()))
    return out


def draw(console, a: Analysis, verbose: bool) -> None:
    from rich.padding import Padding

    def heading(title: str) -> None:
        console.print()
        console.print(Text(title, style="bold underline"))

    def items(lines: list[str], style: str = "") -> None:
        for x in lines:
            console.print(Padding(plain(x, style), (0, 0, 0, INDENT)))

    console.print(plain(f"dstrace analysis of {a.trace_dir}", "bold"))
    console.print(plain(ranks_line(a)))
    heading("Verdict")
    if not a.findings:
        items(["none: no finding's evidence holds in these traces"])
    cap = None if verbose else verdict_cap(len(a.findings))
    cut = [_finding(console, f, cap) for f in a.findings]
    if any(cut):
        items(["(… cut to fit the screen: --verbose prints every finding whole)"], "dim")
    lines = [x for x in (step_time_line(a), steps_line(a)) if x]
    if lines:
        heading("Steps")
        items(lines)
    if a.ranks:
        parts = shown_parts(a, every=verbose)
        heading(f"Time per rank ({time_scope(a)}): shares of the span" + ("" if verbose else " (ms: --verbose)"))
        head, rows = rank_rows(a, parts)
        if not verbose:
            rows = shares_only(rows, 2, 2 + len(parts))
        console.print(Padding(table(head, rows, keys=1), (0, 0, 0, INDENT)))
    head, rows = collective_rows(a)
    if rows:
        heading("Collectives")
        console.print(Padding(table(head, rows), (0, 0, 0, INDENT)))
    head, rows = library_rows(a)
    if rows:
        heading("Communication time by library (union of each library's kernels)")
        console.print(Padding(table(head, rows, keys=1), (0, 0, 0, INDENT)))
    if verbose and (hta := _hta_lines(a)):
        heading("HTA breakdown (HTA's own measure: every GPU event with a stream, timestamps cut to whole "
                "microseconds; the idle in the table above is dstrace's, over kernels, copies and memsets)")
        items(hta)
    applied = {r: o for r, o in a.clock.items() if o.applied}
    if verbose and applied:
        heading("Clock alignment (on ends of matched collectives)")
        items([f"rank {r}: offset {us(o.offset_us, signed=True)} vs rank {o.via}, residual {us(o.residual_us or 0)} over "
               f"{o.matched} collectives" for r, o in sorted(applied.items())])
    for label, found, style in (("Notes", a.notes, ""), ("Warnings", a.warnings, "yellow")):
        if found:
            heading(label)
            items(found, style)
    if a.ranks:
        heading("Terms" if verbose else "Terms used above")
        terms = None if verbose else used_terms(a, shown_parts(a, every=False))
        console.print(Padding(terms_grid(legend(a, terms)), (0, 0, 0, INDENT)))


def terms_grid(pairs: list[tuple[str, str]]) -> Table:
    """Term | meaning, the meaning wrapped within its own column."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for term, meaning in pairs:
        grid.add_row(term, meaning)
    return grid


def render_text(a: Analysis, screen: Screen | None = None) -> str:
    screen = screen or Screen()
    return capture(screen, lambda console: draw(console, a, screen.verbose))


def _hta_pct(value: float) -> str:
    """One of HTA's own percentages, already 0-100 (dividing by 100 to use `units.percent` could move a
    rounding at the last digit)."""
    return f"{value:.1f}%"


def _communication_in_compute(temporal: HtaTemporal) -> str:
    """What of HTA's compute is communication dstrace recognised (DeepEP, custom all-reduce...), which HTA
    types as computation: said next to HTA's compute share, never left for a reader to take as compute."""
    typed = temporal.communication_in_compute_us
    span = temporal.span_us or 0.0
    if not typed or not span > 0:
        return ""
    parts = " and ".join(f"{ms(t)} of {lib} communication kernels ({percent(t / span, 1)} of the span)"
                         for lib, t in sorted(typed.items()))
    return f" (it includes {parts}, which HTA types as computation)"
