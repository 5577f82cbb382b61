"""`dstrace compare RUN_DIR...`: configurations side by side over their repeats, and the verdict.

Entry points for the CLI: `add_arguments(parser)` and `main(args) -> int`. Run folders are found and
read by `collect`, summarized by `summary`, judged by `verdict` and written by `render`.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

from dstrace.errors import UserError
from dstrace.say import say, warn


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


def compare_runs(run_dirs: list[str], baseline: str | None = None,
                 progress: Callable[[str], None] = say):
    """Find, read, summarize and judge: the whole comparison of the runs under `run_dirs`."""
    from dstrace.comparison.collect import find_runs, read_facts, sweep_record
    from dstrace.comparison.model import Comparison
    from dstrace.comparison.summary import summarize
    from dstrace.comparison.verdict import verdict

    refs = find_runs(run_dirs)
    sweep = sweep_record(run_dirs)
    order = list(sweep.configurations) if sweep else []
    order += sorted({r.config for r in refs} - set(order))
    present = {r.config for r in refs}
    order = [name for name in order if name in present]
    if baseline is None and sweep and sweep.baseline in present:
        baseline = sweep.baseline
    if baseline is not None and baseline not in present:
        raise UserError(f"no configuration named {baseline!r} to use as the baseline; "
                        f"the configurations are: {', '.join(order)}")
    facts = [read_facts(ref, progress) for ref in refs]
    configs = [summarize(name, [f for f in facts if f.config == name]) for name in order]
    warnings = [w for f in facts for w in f.warnings]
    return Comparison(configs=configs, verdict=verdict(configs, baseline), warnings=warnings)


def main(args: argparse.Namespace) -> int:
    from dstrace.comparison.render import FORMATS, render
    from dstrace.report_output import chosen_format, write_report

    comparison = compare_runs(args.run_dirs, args.baseline)
    for warning in comparison.warnings:
        warn(warning)
    from dstrace.analysis.render.terminal import screen_for

    fmt = chosen_format(args.format, args.output, FORMATS)
    write_report(render(comparison, fmt, screen_for(bool(args.output))), args.output, escaped=fmt == "text")
    return 0
