"""`dstrace view RUN_DIR --tensorboard | --perfetto | --report`: a run's timelines in TensorBoard or Perfetto,
or its report in a browser.

Each view is a module of `dstrace.viewing`: `tensorboard` (serve the run to the PyTorch profiler plugin),
`perfetto` (one merged, clock-aligned trace of all ranks) and `report` (the HTML report of `analyze`).
"""
from __future__ import annotations

import argparse
import os

from dstrace.errors import UserError
from dstrace.runfolder.names import MERGED_NAME

MODES = ("tensorboard", "perfetto", "report")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dstrace.analysis.options import CLOCK_POLICIES

    parser.add_argument("run_dir", help="run folder written by `dstrace record` (per-rank *.pt.trace.json[.gz])")
    parser.add_argument("--tensorboard", action="store_true",
                        help="serve the run to TensorBoard's PyTorch profiler plugin on 127.0.0.1 until Ctrl-C")
    parser.add_argument("--perfetto", action="store_true",
                        help="write one trace of all ranks, clocks aligned and collectives linked, for ui.perfetto.dev")
    parser.add_argument("--report", action="store_true",
                        help="write the HTML report of `dstrace analyze` next to the run and print its address")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help=f"--perfetto: the trace file (default RUN_DIR/{MERGED_NAME}); "
                             "--report: the HTML file (default RUN_DIR/dstrace-report.html)")
    parser.add_argument("--steps", metavar="FIRST:LAST",
                        help="--perfetto: keep only decode steps FIRST to LAST (dstrace/step#N ranges), e.g. 2:4")
    parser.add_argument("--no-cpu-ops", dest="cpu_ops", action="store_false",
                        help="--perfetto: drop CPU-op detail; keep dstrace/user ranges, GPU work and collectives")
    parser.add_argument("--align-clocks", choices=CLOCK_POLICIES, default="auto",
                        help="--perfetto, --report: shift rank clocks as `dstrace analyze` does (default auto)")
    parser.add_argument("--port", type=int, default=0,
                        help="--tensorboard: the port on 127.0.0.1 (default: a free one)")


def _mode(args: argparse.Namespace) -> str:
    chosen = [m for m in MODES if getattr(args, m)]
    if len(chosen) != 1:
        given = " and ".join(f"--{m}" for m in chosen) or "none"
        raise UserError(f"choose one view: --tensorboard, --perfetto or --report (given: {given})")
    mode = chosen[0]
    misplaced = [flag for flag, used, modes in (
        ("-o", args.output is not None, ("perfetto", "report")),
        ("--steps", args.steps is not None, ("perfetto",)),
        ("--no-cpu-ops", not args.cpu_ops, ("perfetto",)),
        ("--port", args.port != 0, ("tensorboard",)),
    ) if used and mode not in modes]
    if misplaced:
        raise UserError(f"{', '.join(misplaced)} do(es) not apply to --{mode}")
    if os.path.isfile(args.run_dir) and mode != "tensorboard":
        return mode  # one trace file: a run of one rank
    if not os.path.isdir(args.run_dir):
        raise UserError(f"{args.run_dir} is not a folder; give the run folder written by `dstrace record`"
                        + ("" if mode == "tensorboard" else ", or one trace file"))
    return mode


def main(args: argparse.Namespace) -> int:
    mode = _mode(args)
    if mode == "tensorboard":
        from dstrace.viewing.tensorboard import serve
        return serve(args.run_dir, port=args.port)
    if mode == "report":
        from dstrace.viewing.report import show_report
        return show_report(args.run_dir, args.output, args.align_clocks)
    from dstrace.viewing.perfetto import write_merged_trace

    write_merged_trace(args.run_dir, args.output, args.steps, args.cpu_ops, args.align_clocks)
    return 0
