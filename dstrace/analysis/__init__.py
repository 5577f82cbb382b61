"""`dstrace analyze`: turn a folder of per-rank torch.profiler traces into a diagnosis.

Entry points for the CLI: `add_arguments(parser)` and `main(args) -> int`. The work is in
`loading` (files -> LoadedRun), `pipeline.analyze` (LoadedRun -> Analysis) and `render`; a folder
analyzed before with the same options and nothing changed gets its kept report (`report_cache`).
"""
from __future__ import annotations

import argparse
import sys

from dstrace.errors import UserError
from dstrace.say import warn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dstrace.analysis.options import AUTO_MIN_RANKS, CLOCK_POLICIES, FORMATS, SOURCES

    parser.add_argument("trace_dir", help="folder of per-rank traces (*.pt.trace.json[.gz]), e.g. traces/RUN")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="text (terminal), json (dstrace.analysis/1), markdown (GitHub issue), html (one "
                             "self-contained file with plots); default: from the -o file's extension (.json, .md, "
                             ".html), else text")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    parser.add_argument("--align-clocks", choices=CLOCK_POLICIES, default="auto",
                        help="shift rank clocks to match collective ends: auto = ranks on another host than "
                             "the lowest rank (default), always, never")
    parser.add_argument("--parse-workers", type=int, metavar="N", default=None,
                        help="parse N traces at once (default: one per CPU, as many as keep the peak memory within "
                             "2x the largest trace's JSON, or 512 MiB when that is more); each adds about 1.6x a trace")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="read the rank summaries (*.summary.json.gz, written by dstrace record) or the "
                             f"traces; auto = summaries when every rank has one and there are >= {AUTO_MIN_RANKS} "
                             "ranks or the traces are large (default)")


def main(args: argparse.Namespace) -> int:
    from dstrace.analysis import report_cache
    from dstrace.analysis.options import FORMATS
    from dstrace.report_output import chosen_format, write_report

    args.format = chosen_format(args.format, args.output, FORMATS)
    workers = getattr(args, "parse_workers", None)
    if workers is not None and workers < 1:
        raise UserError(f"--parse-workers takes a number of at least 1, not {workers}")
    options = {"format": args.format, "align_clocks": getattr(args, "align_clocks", "auto"),
               "source": getattr(args, "source", "auto")}
    key = report_cache.key(args.trace_dir, options)  # None for a folder that cannot be read
    kept = report_cache.read(args.trace_dir, args.format, key) if key else None
    if kept is not None:
        print("dstrace: nothing in the folder changed since the last analysis: its report, from "
              f"{report_cache.path(args.trace_dir, args.format)}", file=sys.stderr, flush=True)
        report, warnings = kept
    else:
        report, warnings = _analyze(args, workers)
        if key:
            report_cache.write(args.trace_dir, args.format, key, report, warnings)
    for warning in warnings:
        warn(warning)
    write_report(report, args.output)
    return 0


def _analyze(args: argparse.Namespace, workers: int | None) -> tuple[str, list[str]]:
    """Load the folder (its traces or rank summaries), analyze it, render it: (report, warnings)."""
    from dstrace.analysis import summaries
    from dstrace.analysis.loading import load_run
    from dstrace.analysis.pipeline import analyze
    from dstrace.analysis.render import render

    if summaries.choose_source(args.trace_dir, getattr(args, "source", "auto")) == "summaries":
        run = summaries.load_summaries(args.trace_dir)
        print(f"dstrace: analyzing {len(run.traces)} rank summaries: collectives, cross-rank alignment",
              file=sys.stderr, flush=True)
    else:
        run = load_run(args.trace_dir, workers=workers)
        print(f"dstrace: analyzing {len(run.traces)} rank(s): breakdowns, collectives, cross-rank alignment",
              file=sys.stderr, flush=True)
    analysis = analyze(run, clock_policy=getattr(args, "align_clocks", "auto"))
    return render(analysis, args.format), list(analysis.warnings)
