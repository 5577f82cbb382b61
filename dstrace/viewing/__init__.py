"""`dstrace view`: a run's timelines in TensorBoard or Perfetto, or its report in a browser.

Entry points for the CLI: `add_arguments(parser)` and `main(args) -> int`. Each view is its own
module: `tensorboard` (serve the run to the PyTorch profiler plugin), `timeline` + `perfetto` (one
merged, clock-aligned trace of all ranks) and `report` (the HTML report of `analyze`).
"""
from __future__ import annotations

import argparse
import os
import sys

from dstrace.runfolder.names import MERGED_NAME, TRACE_SUFFIXES
from dstrace.errors import UserError

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


def beside(run_dir: str, default_name: str) -> str:
    """Where a view writes by default: in the run folder, or beside a single trace file, named after it."""
    if not os.path.isfile(run_dir):
        return os.path.join(run_dir, default_name)
    stem = os.path.basename(run_dir)
    for suffix in TRACE_SUFFIXES + (".json.gz", ".json"):
        if stem.endswith(suffix):
            stem = stem[:-len(suffix)]
            break
    return os.path.join(os.path.dirname(os.path.abspath(run_dir)), f"{stem}.{default_name}")


def write_merged_trace(run_dir: str, output: str | None = None, steps: str | None = None, cpu_ops: bool = True,
                       clock_policy: str = "auto") -> str:
    """Load the run, build the merged timeline and write it as a Perfetto trace; returns the path."""
    from dstrace.analysis.loading import load_run
    from dstrace.runfolder.files import atomic_file, output_file
    from dstrace.viewing.perfetto import write_perfetto
    from dstrace.viewing.timeline import build_timeline, parse_step_window

    window = parse_step_window(steps)
    run = load_run(run_dir, events=True)
    if not run.traces:
        raise UserError(f"no traces in {run_dir}: the ranks ended before their profiling window")
    timeline = build_timeline(run, window=window, cpu_ops=cpu_ops, clock_policy=clock_policy)
    path = os.path.abspath(output or beside(run_dir, MERGED_NAME))
    try:
        with (output_file if output else atomic_file)(path, "wb") as f:
            count = write_perfetto(timeline, f)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    shifted = ", ".join(f"rank {p.rank} {p.clock_shift_us / 1e3:+.3f} ms" for p in timeline.processes if p.clock_shift_us)
    print(f"dstrace: {count} slices of {len(timeline.processes)} rank(s), {timeline.flow_count} collective links"
          + (f", clocks shifted: {shifted}" if shifted else "") + "; open it at https://ui.perfetto.dev",
          file=sys.stderr)
    print(path)
    return path


def main(args: argparse.Namespace) -> int:
    mode = _mode(args)
    if mode == "tensorboard":
        from dstrace.viewing.tensorboard import serve
        return serve(args.run_dir, port=args.port)
    if mode == "report":
        from dstrace.viewing.report import show_report
        return show_report(args.run_dir, args.output, args.align_clocks)
    write_merged_trace(args.run_dir, args.output, args.steps, args.cpu_ops, args.align_clocks)
    return 0
