"""Renderers of an `Analysis`: text (terminal), json (`dstrace.analysis/1`), markdown (GitHub issue), html."""
from __future__ import annotations

from typing import TYPE_CHECKING

from dstrace.analysis.render.terminal import Screen

if TYPE_CHECKING:  # the model imports pandas: a kept report is printed without it (`report_cache`)
    from dstrace.analysis.results import Analysis


def render(analysis: Analysis, fmt: str, screen: Screen | None = None) -> str:
    """The report in `fmt`; the text one laid out for `screen` (default: 100 plain columns)."""
    if fmt == "json":
        from dstrace.analysis.render.json import render_json

        return render_json(analysis)
    if fmt == "markdown":
        from dstrace.analysis.render.markdown import render_markdown as fn
    elif fmt == "html":
        from dstrace.analysis.render.html import render_html as fn
    else:
        from dstrace.analysis.render.text import render_text

        return render_text(analysis, screen)
    return fn(analysis, verbose=bool(screen and screen.verbose))
