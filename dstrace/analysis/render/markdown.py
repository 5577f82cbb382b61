"""Markdown to paste into a GitHub issue: findings, tables, and the facts about the traces."""
from __future__ import annotations

from dstrace.analysis.model import Analysis
from dstrace.analysis.render.common import collective_rows, rank_rows, ranks_line, ranks_of, steps_line


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(map(_cell, head)) + " |", "|" + "---|" * len(head)] + \
        ["| " + " | ".join(map(_cell, r)) + " |" for r in rows]


def render_markdown(a: Analysis) -> str:
    out = ["## dstrace analysis", "", f"- {ranks_line(a)}"]
    line = steps_line(a)
    if line:
        out.append(f"- steps: {line}")
    out += ["", "### Findings", ""]
    out += [f"- **`{f.id}`** ({ranks_of(f)}): {f.summary}" for f in a.findings] or ["- none"]
    if a.ranks:
        out += ["", "### Time per rank", ""] + md_table(*rank_rows(a))
    head, rows = collective_rows(a)
    if rows:
        out += ["", "### Collectives", ""] + md_table(head, rows)
    for label, items in (("Notes", a.notes), ("Warnings", a.warnings)):
        if items:
            out += ["", f"### {label}", ""] + [f"- {x}" for x in items]
    out += ["", "<sub>dstrace.analysis/1; the JSON (`--format json`) holds every number and each finding's evidence.</sub>"]
    return "\n".join(out) + "\n"
