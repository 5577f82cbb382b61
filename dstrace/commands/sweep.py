"""`dstrace sweep SPEC -o OUT`: record every configuration of a sweep spec K times (`comparison.sweep`),
then compare them; the comparison goes to `OUT/compare.json` and `OUT/compare.md`, and is printed."""
from __future__ import annotations

import argparse
import os

from dstrace.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="sweep spec (JSON), e.g. launch/sweeps/cpu-tiny.json")
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="sweep folder: OUT/<name>/rep<k>/")
    parser.add_argument("--repeats", type=int, default=3, metavar="K", help="runs of each configuration (default 3)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="overrides",
                        help="give a spec variable a value (size, tokens, nproc, ...); repeatable")
    parser.add_argument("--only", metavar="NAME,...", help="record only these configurations")
    parser.add_argument("--run-timeout", type=float, default=None, metavar="SECONDS",
                        help="stop a run that takes longer (SIGTERM, then SIGKILL); it counts as a failed run")
    parser.add_argument("--baseline", metavar="NAME", help="baseline of the comparison (default: the spec's)")


def main(args: argparse.Namespace) -> int:
    from dstrace.analysis.render.terminal import screen_for
    from dstrace.comparison.compare import compare_runs
    from dstrace.comparison.render import render, render_json
    from dstrace.comparison.spec import load_spec, parse_overrides
    from dstrace.comparison.sweep import COMPARE_FILE, COMPARE_MARKDOWN, record_sweep
    from dstrace.report_output import write_report

    if args.repeats < 1:
        raise UserError("--repeats needs at least 1")
    spec = load_spec(args.spec, parse_overrides(args.overrides))
    selected = spec.configurations
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in {c.name for c in spec.configurations}]
        if unknown:
            raise UserError(f"--only {unknown[0]}: no such configuration in {args.spec}; "
                            f"it has: {', '.join(c.name for c in spec.configurations)}")
        selected = [c for c in spec.configurations if c.name in wanted]
    baseline = args.baseline or spec.baseline
    if baseline is not None and baseline not in {c.name for c in spec.configurations}:
        raise UserError(f"--baseline {baseline}: no such configuration in {args.spec}")
    out = os.path.abspath(args.output)
    outcomes, planned = record_sweep(spec, selected, args.repeats, out, baseline, args.run_timeout)
    comparison = compare_runs([out])
    write_report(render_json(comparison), os.path.join(out, COMPARE_FILE))
    write_report(render(comparison, "markdown"), os.path.join(out, COMPARE_MARKDOWN))
    write_report(render(comparison, "text", screen_for(False)), None, escaped=True)
    return 0 if len(outcomes) == planned else 1
