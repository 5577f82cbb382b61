"""Markdown to paste into a GitHub issue: findings, tables, and the facts about the traces."""
from __future__ import annotations

from dstrace.analysis.results import Analysis
from dstrace.explain import doc_link
from dstrace.say import md_inline
from dstrace.analysis.render.common import (
    collective_rows, legend, library_rows, finding_details, rank_rows, ranks_line, ranks_of, shown_parts,
    step_time_line, steps_line, used_terms,
)


def md_cell(text: str) -> str:
    """An untrusted value inside a markdown table's cell (`md_inline`, and no `|` that would end the cell)."""
    return md_inline(text).replace("|", "\\|")


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table, every cell `md_cell`: the one table of every markdown report."""
    return ["| " + " | ".join(map(md_cell, head)) + " |", "|" + "---|" * len(head)] + \
        ["| " + " | ".join(map(md_cell, r)) + " |" for r in rows]


def render_markdown(a: Analysis, verbose: bool = False) -> str:
    """The report; its legend has the terms the tables use (every term with `verbose`)."""
    parts = shown_parts(a, every=verbose)
    out = ["## dstrace analysis", "", f"- {md_inline(ranks_line(a))}"]
    for line in (step_time_line(a), steps_line(a)):
        if line:
            out.append(f"- steps: {md_inline(line)}")
    out += ["", "### Findings", ""]
    for f in a.findings:
        out.append(f"- **`{f.id}`** ({ranks_of(f)}): {md_inline(f.summary)}")
        out += [f"  - {label}: " + (f"[{md_inline(text)}]({doc_link(text)})" if label == "docs" else md_inline(text))
                for label, text in finding_details(f)]
    if not a.findings:
        out.append("- none")
    if a.ranks:
        out += ["", "### Time per rank (shares of the span)", ""] + md_table(*rank_rows(a, parts))
    head, rows = collective_rows(a)
    if rows:
        out += ["", "### Collectives", ""] + md_table(head, rows)
    head, rows = library_rows(a)
    if rows:
        out += ["", "### Communication time by library", ""] + md_table(head, rows)
    for label, items in (("Notes", a.notes), ("Warnings", a.warnings)):
        if items:
            out += ["", f"### {label}", ""] + [f"- {md_inline(x)}" for x in items]
    if a.ranks:
        out += ["", "<details><summary>Columns</summary>", ""] + [f"- **{t}**: {m}" for t, m in legend(a, None if verbose else used_terms(a, parts))] \
            + ["", "</details>"]
    out += ["", "<sub>dstrace.analysis/1; the JSON (`--format json`) holds every number and each finding's evidence.</sub>"]
    return "\n".join(out) + "\n"
