"""The HTML report of `dstrace analyze --format html`, written next to the run for a browser to open.

The report is one self-contained file (inline SVG, no script, no network), so the file itself is
what is handed over: its path and file:// address are printed; nothing is served or launched.
"""
from __future__ import annotations

import os
import pathlib
import sys

from dstrace.files import write_text_atomic
from dstrace.errors import UserError
from dstrace.say import warn

REPORT_NAME = "dstrace-report.html"


def write_report(run_dir: str, output: str | None = None, clock_policy: str = "auto") -> str:
    """Analyze the run and write its HTML report (default `<run>/dstrace-report.html`); returns the path."""
    from dstrace.analysis.loading import load_run
    from dstrace.analysis.pipeline import analyze
    from dstrace.analysis.render import render

    analysis = analyze(load_run(run_dir), clock_policy=clock_policy)
    for warning in analysis.warnings:
        warn(warning)
    path = os.path.abspath(output or os.path.join(run_dir, REPORT_NAME))
    try:
        write_text_atomic(path, render(analysis, "html"))
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def show_report(run_dir: str, output: str | None = None, clock_policy: str = "auto") -> int:
    path = write_report(run_dir, output, clock_policy)
    print(f"dstrace: report written to {path}", file=sys.stderr)
    print(pathlib.Path(path).as_uri())
    return 0
