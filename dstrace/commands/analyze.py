"""`dstrace analyze RUN_DIR`: a folder of per-rank torch.profiler traces turned into a diagnosis.

The work is the analysis': `load_and_analyze` (folder -> Analysis), `report_of` (the kept report, else a
new one) and `step_compare` (two step ranges side by side).
"""
from __future__ import annotations

import argparse
import json

from dstrace.errors import UserError
from dstrace.say import warn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dstrace.analysis.options import CLOCK_POLICIES, FORMATS

    parser.add_argument("run_dir", help="folder of per-rank traces (*.pt.trace.json[.gz]), e.g. traces/RUN, or one "
                                        "trace file (a run of one rank)")
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
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="text report: every section, span part and term, each finding whole (default: the "
                             "verdict cut to fit a screen, the tables and the terms they use); markdown and html: "
                             "every term")
    parser.add_argument("--steps", metavar="A:B", default=None,
                        help="compare the traced work of steps A to B (host ops, dstrace ranges and kernels by name, "
                             "ms per step) with the steps of --against, instead of the report")
    parser.add_argument("--against", metavar="C:D", default=None, help="the second step range of --steps")
    parser.add_argument("--rank", type=int, default=None, metavar="N",
                        help="with --steps: compare on rank N only (default: every rank, medians over them)")


def main(args: argparse.Namespace) -> int:
    from dstrace.analysis.options import FORMATS
    from dstrace.report_output import chosen_format, write_report

    fmt = chosen_format(args.format, args.output, FORMATS)
    workers = getattr(args, "parse_workers", None)
    if workers is not None and workers < 1:
        raise UserError(f"--parse-workers takes a number of at least 1, not {workers}")
    if getattr(args, "steps", None) is not None or getattr(args, "against", None) is not None:
        write_report(step_comparison(args.run_dir, args.steps, args.against, getattr(args, "rank", None), fmt,
                                     workers), args.output)
        return 0
    from dstrace.analysis import report_of
    from dstrace.analysis.render.terminal import screen_for

    screen = screen_for(bool(args.output), getattr(args, "verbose", False))
    report, warnings = report_of(args.run_dir, fmt, clock_policy=getattr(args, "align_clocks", "auto"),
                                 workers=workers, screen=screen)
    for warning in warnings:
        warn(warning)
    write_report(report, args.output, escaped=fmt == "text")
    return 0


def step_comparison(run_dir: str, steps: str | None, against: str | None, rank: int | None, fmt: str,
                    workers: int | None = None) -> str:
    """`--steps A:B --against C:D`: the two ranges' traced work side by side (`step_compare`), as text or JSON."""
    from dstrace.analysis.loading import load_run
    from dstrace.analysis.step_compare import compare_steps, parse_range, render_text

    if steps is None or against is None:
        raise UserError("--steps and --against go together: e.g. --steps 2:3 --against 4:5")
    if fmt not in ("text", "json"):
        raise UserError(f"--steps writes text or json, not {fmt}")
    a, b = parse_range(steps, "--steps"), parse_range(against, "--against")
    run = load_run(run_dir, workers=workers)
    c = compare_steps(run, a, b, rank)
    return json.dumps(c.to_json(), indent=2) + "\n" if fmt == "json" else render_text(c)
