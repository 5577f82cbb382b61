"""The views in a real browser: TensorBoard's PyTorch profiler plugin over a recorded run, and the HTML report.

Headless Debian Chromium loads each page; the screenshots are left in the test's tmp folder.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request

import pytest

from tests.fixtures.processes import cpu_env, dstrace, start_dstrace
from tests.fixtures.runs import manifests
from tests.viewing.conftest import Console

CHARTS_LOADER = "https://www.gstatic.com/charts/loader.js"
# The plugin's page loads Google Charts from this CDN and waits for it before drawing anything. Where
# the CDN cannot be reached (here, CI, air-gapped clusters) these are the only errors that may appear.
OFFLINE_SCRIPT_ERRORS = {"google is not defined"}
OFFLINE_CONSOLE_ERROR = re.compile(r"Failed to load resource: net::ERR_(NAME_NOT_RESOLVED|INTERNET_DISCONNECTED|"
                                   r"CONNECTION_REFUSED|ADDRESS_UNREACHABLE|NETWORK_ACCESS_DENIED|TIMED_OUT)")
URL_LINE = re.compile(r"TensorBoard at (http://127\.0\.0\.1:\d+/)\S*")
START_TIMEOUT_S = 60


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


@pytest.fixture
def tensorboard(recorded, tmp_path):
    """`dstrace view RUN --tensorboard` running; yields (process, base URL, its TMPDIR)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = start_dstrace("view", recorded, "--tensorboard", env=cpu_env(TMPDIR=str(tmpdir)))
    try:
        line = proc.stdout.readline()
        m = URL_LINE.search(line)
        assert m, f"no URL printed: {line!r}"
        yield proc, m.group(1), tmpdir
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def _wait_for_run(base: str, run_name: str) -> dict:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        runs = _get_json(base + "data/plugin/pytorch_profiler/runs")
        if run_name in runs["runs"]:
            return runs
        time.sleep(0.5)
    pytest.fail(f"the profiler plugin did not list run {run_name} within {START_TIMEOUT_S} s")


def test_tensorboard_lists_every_rank_and_stops_cleanly(recorded, tensorboard, browser, tmp_path):
    proc, base, tmpdir = tensorboard
    run_name = os.path.basename(recorded)
    workers = sorted(f"{m['host']}_rank{r}" for r, m in manifests(recorded).items())
    _wait_for_run(base, run_name)
    views = _get_json(f"{base}data/plugin/pytorch_profiler/views?run={run_name}")
    assert "Overview" in views and "Trace" in views
    assert sorted(_get_json(f"{base}data/plugin/pytorch_profiler/workers?run={run_name}&view=Overview")) == workers
    overview = _get_json(f"{base}data/plugin/pytorch_profiler/overview?run={run_name}&worker={workers[1]}&span=1")
    assert overview["steps"]["rows"], "the plugin parsed rank 1's steps"

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    console = Console(page)
    page.goto(base + "#pytorch_profiler")
    plugin = page.frame_locator("iframe")
    plugin.get_by_text(run_name, exact=True).wait_for(timeout=30_000)
    plugin.get_by_text(workers[0], exact=True).click()
    listed = plugin.get_by_role("option")
    listed.first.wait_for(timeout=10_000)
    assert sorted(listed.all_inner_texts()) == workers
    page.wait_for_timeout(1500)
    shot = tmp_path / "tensorboard-workers.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000

    charts_offline = CHARTS_LOADER in console.failed_requests
    unexpected_failures = [u for u in console.failed_requests if u != CHARTS_LOADER]
    assert not unexpected_failures
    if charts_offline:
        assert set(console.script_errors) <= OFFLINE_SCRIPT_ERRORS
        assert all(OFFLINE_CONSOLE_ERROR.search(e) for e in console.errors), console.errors
    else:
        assert not console.script_errors and not console.errors
        assert plugin.locator("svg").count() > 0, "with Google Charts reachable the overview charts render"
    page.close()

    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert not any(n.startswith("dstrace-tensorboard-") for n in os.listdir(tmpdir)), "temporary log folder removed"


def test_report_renders_per_rank_plots_without_errors(recorded, browser, tmp_path):
    out = tmp_path / "report.html"
    result = dstrace("view", recorded, "--report", "-o", str(out))
    assert result.returncode == 0, result.stderr
    uri = result.stdout.strip()
    assert uri == out.as_uri()
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    console = Console(page)
    page.goto(uri)
    bars = page.locator('svg[aria-label="time per rank"]')  # the step-time plots come before it
    assert {"rank 0", "rank 1"} <= set(bars.locator("text").all_text_contents())
    assert bars.locator("rect").count() >= 2 + 4, "per-rank bars and the legend"
    assert page.locator("svg circle").count() > 2, "collective waits plotted"
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert not console.errors and not console.script_errors and not console.failed_requests
    page.close()


def test_report_defaults_next_to_the_run(gpu_run):
    result = dstrace("view", gpu_run, "--report")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("/gpu_run/dstrace-report.html")
    assert os.path.getsize(os.path.join(gpu_run, "dstrace-report.html")) > 1000
