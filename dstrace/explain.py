"""A finding's page of the docs shipped inside dstrace (`explanation`, what `dstrace explain FINDING` prints,
from `dstrace.commands.explain`), and the links the reports give for a finding's `docs` (`docs/PAGE.md#anchor`,
a path in the repository).

A link is absolute: the project's documentation URL from the installed package's metadata when it has
one, else the page's file inside this installation (a checkout run from PYTHONPATH has no metadata).
"""
from __future__ import annotations

import re
from importlib import metadata, resources
from pathlib import Path

from dstrace.errors import UserError

DISTRIBUTION = "dstrace-profiler"
"""The name on the package index (`dstrace` there is another project); the command stays `dstrace`."""


def documentation_url() -> str | None:
    """`Project-URL: Documentation, URL` of the installed distribution, or None."""
    try:
        urls = metadata.metadata(DISTRIBUTION).get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return None
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "documentation" and url.strip():
            return url.strip().rstrip("/")
    return None


def shipped_doc(page: str) -> Path:
    """A page of docs/ as installed with dstrace (package data `dstrace/docs`)."""
    return Path(str(resources.files("dstrace").joinpath("docs", page)))


def doc_link(docs: str) -> str:
    """An absolute link for a finding's `docs` path (`docs/root-cause.md#1-the-mechanism`)."""
    page, _, anchor = docs.removeprefix("docs/").partition("#")
    base = documentation_url()
    link = f"{base}/{page}" if base else shipped_doc(page).resolve().as_uri()
    return f"{link}#{anchor}" if anchor else link


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def section(text: str, anchor: str) -> str | None:
    """The markdown section whose heading's anchor is `anchor`, up to the next heading of its level or
    above; the whole page for no anchor; None when no heading has that anchor."""
    if not anchor:
        return text
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(#+)\s+(.*)", line)
        if m and _slug(m.group(2)) == anchor:
            level = len(m.group(1))
            end = next((j for j in range(i + 1, len(lines))
                        if (h := re.match(r"(#+)\s", lines[j])) and len(h.group(1)) <= level), len(lines))
            return "\n".join(lines[i:end]).rstrip() + "\n"
    return None


def explanation(finding: str) -> str:
    """The finding's row of the findings table (what states it, its evidence) and its page's section."""
    from dstrace.analysis.findings import DOCS

    if finding not in DOCS:
        raise UserError(f"no finding is named {finding!r}; the findings are: {', '.join(sorted(DOCS))}")
    page, _, anchor = DOCS[finding].removeprefix("docs/").partition("#")
    try:
        text = shipped_doc(page).read_text(encoding="utf-8")
        schema = shipped_doc("analysis-schema.md").read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"this installation of dstrace has no docs ({exc.strerror or exc}): read them at "
                        f"{doc_link(DOCS[finding])}") from None
    row = next((line for line in schema.splitlines() if line.startswith(f"| `{finding}` |")), None)
    out = [f"{finding}: {doc_link(DOCS[finding])}", ""]
    if row:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        out += [f"stated when: {cells[1]}", f"evidence: {cells[2]}", ""] if len(cells) >= 3 else []
    out.append(section(text, anchor) or text)
    return "\n".join(out).rstrip() + "\n"
