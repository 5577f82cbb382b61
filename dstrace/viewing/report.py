"""The HTML report of `dstrace analyze --format html`, written next to the run for a browser to open.

The report is one self-contained file (inline SVG, no script, no network), so the file itself is
what is handed over: its path and file:// address are printed; nothing is served or launched.
"""
from __future__ import annotations

import os
import pathlib

from dstrace.runfolder.files import write_output, write_text_atomic
from dstrace.runfolder.names import REPORT_NAME, beside
from dstrace.errors import UserError
from dstrace.say import say, warn


def write_report(run_dir: str, output: str | None = None, clock_policy: str = "auto") -> str:
    """The run's HTML report (kept, or analyzed now) at `output` (default `<run>/dstrace-report.html`)."""
    from dstrace.analysis import report_of

    report, warnings = report_of(run_dir, "html", clock_policy=clock_policy)
    for warning in warnings:
        warn(warning)
    path = os.path.abspath(output or beside(run_dir, REPORT_NAME))
    try:
        (write_output if output else write_text_atomic)(path, report)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def show_report(run_dir: str, output: str | None = None, clock_policy: str = "auto") -> int:
    path = write_report(run_dir, output, clock_policy)
    say(f"report written to {path}")
    print(pathlib.Path(path).as_uri())
    return 0
