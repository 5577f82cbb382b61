"""The HTML reports in headless Chromium: `analyze`'s of a committed H200 run (its findings' links lead to
sections that exist, code shows as code, each call's step times are plotted with the profiled steps and the
shift) and `compare`'s of the committed sweep (ms per step with its spread). No page asks for the network."""
from __future__ import annotations

import os
import shutil
from urllib.parse import urlsplit

from dstrace.explain import documentation_url, section, shipped_doc
from tests.fixtures.paths import TRACES
from tests.fixtures.processes import dstrace
from tests.viewing.conftest import Console


def open_page(browser, path: str):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    console = Console(page)
    page.goto(f"file://{path}")
    return page, console


def resolves(href: str) -> bool:
    """A docs link names a page dstrace ships and a heading on it: a file:// link to the page itself, or the
    page under the project's documentation URL."""
    parts = urlsplit(href)
    if parts.scheme == "file":
        page = parts.path
    else:
        base = documentation_url()
        if not base or not href.startswith(base + "/"):
            return False
        page = str(shipped_doc(href[len(base) + 1:].split("#")[0]))
    return os.path.isfile(page) and section(open(page).read(), parts.fragment) is not None


def test_analysis_report_links_resolve_code_is_code_and_steps_are_plotted(browser, tmp_path):
    run = shutil.copytree(os.path.join(TRACES, "h200-zero3-tp2-ds0.16.1"), tmp_path / "run")
    out = tmp_path / "report.html"
    r = dstrace("analyze", str(run), "-o", str(out))
    assert r.returncode == 0, r.stderr
    page, console = open_page(browser, str(out))
    findings = page.locator("h2:text('Findings') + ul > li")
    assert findings.count() >= 3
    links = page.locator("h2:text('Findings') + ul a").evaluate_all("els => els.map(e => e.href)")
    assert len(links) == findings.count() and all(resolves(h) for h in links), links
    text = page.locator("h2:text('Findings') + ul").inner_text()
    assert "`" not in text, "code spans are rendered, not shown with backticks"
    assert page.locator("h2:text('Findings') + ul li code").count() > findings.count()

    plot = page.locator("svg.step-plot").first
    assert plot.locator("polyline").count() == 2, "one line per rank"
    assert plot.locator("rect.profiled").count() == 1
    assert "profiled: steps 2-4" in plot.text_content()
    assert plot.locator("line.shift").count() == 1 and "shift at step 6" in plot.text_content()
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert not console.errors and not console.script_errors and not console.failed_requests
    page.close()


def test_compare_report_plots_ms_per_step_with_its_spread(browser, tmp_path):
    runs = shutil.copytree(os.path.join(TRACES, "h200-sweep-qwen2-1.5b"), tmp_path / "sweep")
    out = tmp_path / "compare.html"
    r = dstrace("compare", str(runs), "-o", str(out))
    assert r.returncode == 0, r.stderr
    page, console = open_page(browser, str(out))
    plot = page.locator("svg.ms-plot")
    assert plot.locator("rect.median").count() == 5, "every timed configuration"
    assert plot.locator("circle").count() == 15, "every timed run"
    assert "Not plotted (no timed run): zero3-tp." in page.inner_text("body")
    assert not console.errors and not console.script_errors and not console.failed_requests
    page.close()
