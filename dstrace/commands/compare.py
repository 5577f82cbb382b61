"""`dstrace compare RUN_DIR...`: configurations side by side over their repeats, and the verdict
(`comparison.compare.compare_runs`), written by `comparison.render`."""
from __future__ import annotations

import argparse

from dstrace.say import warn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dstrace.comparison.render import FORMATS

    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run folders, configuration folders (<config>/rep<k>/) or a sweep folder")
    parser.add_argument("--baseline", metavar="NAME",
                        help="configuration the others are measured against (default: the sweep's baseline)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="text (terminal, default), json (dstrace.compare/1), markdown (GitHub issue); "
                             "default: from the -o file's extension (.json, .md), else text")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the comparison to FILE instead of stdout")


def main(args: argparse.Namespace) -> int:
    from dstrace.analysis.render.terminal import screen_for
    from dstrace.comparison.compare import compare_runs
    from dstrace.comparison.render import FORMATS, render
    from dstrace.report_output import chosen_format, write_report

    comparison = compare_runs(args.run_dirs, args.baseline)
    for warning in comparison.warnings:
        warn(warning)
    fmt = chosen_format(args.format, args.output, FORMATS)
    write_report(render(comparison, fmt, screen_for(bool(args.output))), args.output, escaped=fmt == "text")
    return 0
