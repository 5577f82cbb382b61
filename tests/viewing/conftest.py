"""Fixtures for the views: a GPU-shaped run with known clocks, and headless Chromium driven by Playwright."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.fixtures.traces import write_zero3_traces


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CLOCK_AHEAD_US = 5000.0
"""Rank 1's host clock runs this far ahead of rank 0's in the GPU run: the merged trace must undo it."""
LATE_US = 300.0


@pytest.fixture(scope="session")
def gpu_run(tmp_path_factory) -> str:
    """Two ranks on two hosts, NCCL AllGathers that rank 1 reaches LATE_US late, rank 1's clock ahead."""
    folder = str(tmp_path_factory.mktemp("gpu") / "gpu_run")
    os.makedirs(folder)
    write_zero3_traces(folder, late_rank=1, late_us=LATE_US, host_of=lambda r: f"node{r}",
                       clock_offsets={1: CLOCK_AHEAD_US})
    return folder


@pytest.fixture(scope="session")
def recorded(zero3_run) -> str:
    """The session's recorded ZeRO-3 chat run (tests/conftest.py), which must have recorded."""
    run_dir, result = zero3_run
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, with a fresh profile; never a browser that Playwright downloads."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed: `make browser` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


class Console:
    """What a page reported: console errors, uncaught script errors, failed requests."""

    def __init__(self, page):
        self.errors: list[str] = []
        self.script_errors: list[str] = []
        self.failed_requests: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.script_errors.append(str(e)))
        page.on("requestfailed", lambda r: self.failed_requests.append(r.url))
