"""`dstrace analyze`: turn a folder of per-rank torch.profiler traces into a diagnosis.

Entry points for the CLI: `add_arguments(parser)` and `main(args) -> int`. The work is in
`loading` (files -> LoadedRun), `pipeline.analyze` (LoadedRun -> Analysis) and `render`.
"""
from __future__ import annotations

import argparse
import os
import sys

from dstrace.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dstrace.analysis.alignment import CLOCK_POLICIES
    from dstrace.analysis.render import FORMATS
    from dstrace.analysis.summaries import AUTO_MIN_RANKS, SOURCES

    parser.add_argument("trace_dir", help="folder of per-rank traces (*.pt.trace.json[.gz]), e.g. traces/RUN")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="text (terminal, default), json (dstrace.analysis/1), markdown (GitHub issue), "
                             "html (one self-contained file with plots)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    parser.add_argument("--align-clocks", choices=CLOCK_POLICIES, default="auto",
                        help="shift rank clocks to match collective ends: auto = ranks on another host than "
                             "the lowest rank (default), always, never")
    parser.add_argument("--parse-workers", type=int, metavar="N", default=None,
                        help="parse at most N traces at once (default: one per CPU, as many as the free memory "
                             "allows); 1 keeps the peak memory to one trace's parse")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="read the rank summaries (*.summary.json.gz, written by dstrace record) or the "
                             f"traces; auto = summaries when every rank has one and there are >= {AUTO_MIN_RANKS} "
                             "ranks or the traces are large (default)")


def main(args: argparse.Namespace) -> int:
    from dstrace.analysis import summaries
    from dstrace.analysis.loading import load_run
    from dstrace.analysis.pipeline import analyze
    from dstrace.analysis.render import render

    if summaries.choose_source(args.trace_dir, getattr(args, "source", "auto")) == "summaries":
        run = summaries.load_summaries(args.trace_dir)
        print(f"dstrace: analyzing {len(run.traces)} rank summaries: collectives, cross-rank alignment",
              file=sys.stderr, flush=True)
    else:
        workers = getattr(args, "parse_workers", None)
        if workers is not None and workers < 1:
            raise UserError(f"--parse-workers takes a number of at least 1, not {workers}")
        run = load_run(args.trace_dir, workers=workers)
        print(f"dstrace: analyzing {len(run.traces)} rank(s): breakdowns, collectives, cross-rank alignment",
              file=sys.stderr, flush=True)
    analysis = analyze(run, clock_policy=getattr(args, "align_clocks", "auto"))
    for warning in analysis.warnings:
        print(f"dstrace: warning: {warning}", file=sys.stderr)
    report = render(analysis, args.format)
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(report)
        except OSError as exc:
            raise UserError(f"cannot write {args.output}: {exc.strerror or exc}") from None
        print(f"dstrace: wrote {os.path.abspath(args.output)}", file=sys.stderr)
    else:
        sys.stdout.write(report)
    return 0

