"""`dstrace explain FINDING`: every finding's docs pointer leads to a section that exists, printed from the
docs dstrace ships."""
from __future__ import annotations

import re

import pytest

from dstrace.analysis.findings import DOCS
from dstrace.explain import doc_link, section, shipped_doc
from tests.fixtures.processes import dstrace


@pytest.mark.parametrize("finding", sorted(DOCS))
def test_every_findings_doc_section_exists(finding):
    page, _, anchor = DOCS[finding].removeprefix("docs/").partition("#")
    assert section(shipped_doc(page).read_text(), anchor), DOCS[finding]


def test_explain_prints_the_findings_row_and_its_section():
    r = dstrace("explain", "zero3-gathers-model-per-step")
    assert r.returncode == 0, r.stderr
    first, _, rest = r.stdout.partition("\n")
    assert first == f"zero3-gathers-model-per-step: {doc_link(DOCS['zero3-gathers-model-per-step'])}"
    assert re.search(r"^stated when: the median bytes gathered per decode step", rest, re.M)
    assert re.search(r"^## 1\. The mechanism$", rest, re.M) and "## 2. Reproduce" not in rest


def test_explain_without_a_finding_lists_them_and_a_wrong_name_is_one_line():
    r = dstrace("explain")
    assert r.returncode == 0 and [line.split(":")[0] for line in r.stdout.splitlines()] == sorted(DOCS)
    r = dstrace("explain", "no-such-finding")
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "tp-not-applied" in r.stderr


def test_a_link_without_a_project_url_is_the_shipped_page():
    link = doc_link("docs/root-cause.md#1-the-mechanism")
    assert link.endswith("/docs/root-cause.md#1-the-mechanism")
    assert link.startswith(("https://", "file:///"))
