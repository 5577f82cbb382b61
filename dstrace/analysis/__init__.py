"""dstrace's analysis: a folder of per-rank torch.profiler traces turned into a diagnosis.

This face holds the two ways in that the rest of dstrace uses: `load_and_analyze` (folder -> Analysis)
and `report_of` (the rendered report, kept or new). The work is in `loading` (files -> LoadedRun),
`pipeline.analyze` (LoadedRun -> Analysis), `render`, and `report_cache` (a folder analyzed before with
the same options and nothing changed gets its kept report). The `dstrace analyze` verb is
`dstrace.commands.analyze`. Nothing here imports pandas until an analysis runs.
"""
from __future__ import annotations

from dstrace.say import say


def load_and_analyze(run_dir, clock_policy: str = "auto", workers: int | None = None, progress=None):
    """The one way from a run folder to its Analysis: its ranks (each a trace, or a kept reduction that
    answers for it or stands alone) loaded and analyzed. `run_dir`: the folder's path, or its `RunFolder` when
    the caller has listed it. `progress(message)` hears what is being read (default: stderr)."""
    from dstrace.analysis.loading import load_run
    from dstrace.analysis.parallel import release_freed_memory
    from dstrace.analysis.pipeline import analyze

    progress = progress or say
    run = load_run(run_dir, progress=progress, workers=workers)
    progress(f"analyzing {len(run.traces)} rank{'' if len(run.traces) == 1 else 's'}: breakdowns, collectives, "
             "cross-rank alignment")
    analysis = analyze(run, clock_policy=clock_policy)
    del run
    release_freed_memory()  # the run's tables, before the report is rendered
    return analysis


def report_of(run_dir: str, fmt: str, clock_policy: str = "auto", workers: int | None = None,
              screen=None) -> tuple[str, list[str]]:
    """The rendered report and its warnings, kept or analyzed now (`report_cache.report_of`)."""
    from dstrace.analysis import report_cache

    return report_cache.report_of(run_dir, fmt, clock_policy=clock_policy, workers=workers, screen=screen)
