"""The `dstrace.analysis/1` JSON of every committed reference run is what the code before the typed decoder
(issue #18) wrote: `reports/` holds those reports, made by that code (commit c862626, the analysis of issues
#15 and #17 included) from a fresh parse. The repository's
path is the only thing that differs from one checkout to another, so it is written as `<repo>`.

    python -m tests.analysis.test_reports_unchanged   # from the checkout: rewrite reports/ with its code
"""
from __future__ import annotations

import glob
import os

import pytest

from tests.fixtures.paths import ROOT, TRACES

REPORTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reports")


def reference_runs() -> list[str]:
    """Every committed run folder (one with a run.json), relative to the repository."""
    found = glob.glob(os.path.join(TRACES, "h200-*", "**", "run.json"), recursive=True)
    return sorted(os.path.relpath(os.path.dirname(p), ROOT) for p in found)


def stored_name(run: str) -> str:
    return run.replace(os.sep, "__") + ".json"


def report(run: str) -> str:
    """The JSON report of a run folder, parsed afresh (no cache of another code version can answer)."""
    from dstrace.analysis.loading import load_run
    from dstrace.analysis.pipeline import analyze
    from dstrace.analysis.render import render

    analysis = analyze(load_run(os.path.join(ROOT, run), progress=lambda m: None, workers=1))
    return render(analysis, "json").replace(ROOT, "<repo>")


@pytest.mark.parametrize("run", reference_runs())
def test_report_is_unchanged(run):
    with open(os.path.join(REPORTS, stored_name(run)), encoding="utf-8") as f:
        assert report(run) == f.read()


if __name__ == "__main__":
    os.makedirs(REPORTS, exist_ok=True)
    for run in reference_runs():
        with open(os.path.join(REPORTS, stored_name(run)), "w", encoding="utf-8") as f:
            f.write(report(run))
        print(run)
