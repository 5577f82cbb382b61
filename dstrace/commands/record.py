"""`dstrace record [options] [--] COMMAND...`: run the user's launch command with every rank traced, then
finish the run folder.

The recording is `recording.launcher.record`; once the command has ended, the run record is filled from
the files the ranks left (`fill_run_record`), each rank's trace is reduced here, in dstrace's own
environment, with the analysis' reduction (the job's environment has only its torch), and `run.json` is
written. This verb is where recording and analysis meet: neither imports the other. dstrace exits with
the command's own exit code.
"""
from __future__ import annotations

import argparse
import signal

from dstrace.errors import UserError
from dstrace.recording.launcher import RecordOptions, fill_run_record, record
from dstrace.recording.window import MODES, WindowOptions
from dstrace.runfolder.records import RunRecord
from dstrace.say import say, warn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", help="run folder (default: traces/<time>-<program>)")
    parser.add_argument("--mode", choices=MODES, default="full",
                        help="full: torch.profiler trace of the window; annotate: ranges and timings only")
    parser.add_argument("--window-call", type=int, default=1, metavar="N",
                        help="which top-level chat()/generate() call to profile (default 1)")
    parser.add_argument("--window-start", type=int, default=2, metavar="STEP",
                        help="first forward step profiled; step 0 is the prefill (default 2)")
    parser.add_argument("--window-steps", type=int, default=3, metavar="K",
                        help="how many forward steps to profile (default 3)")
    parser.add_argument("--window-after", type=float, default=30.0, metavar="SECONDS",
                        help="a job without generate(), optimizer steps, engine.step(), DDP/FSDP forwards or "
                             "profiler steps gets a time-based window this long after recording starts (default 30)")
    parser.add_argument("--window-seconds", type=float, default=2.0, metavar="SECONDS",
                        help="how long the time-based window lasts (default 2)")
    parser.add_argument("--force", action="store_true", help="record into a run folder that has files")
    parser.add_argument("--run-id", metavar="ID",
                        help="the run's id; give every node of a multi-node torchrun run the same one "
                             "(default: torchrun's --rdzv-id, else a new random id); see docs/multi-node.md")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the launch command; everything from its first word on is the command's own "
                             "(options after it go to the program, as with nsys and py-spy); '--' is optional")


def options_from_args(args: argparse.Namespace) -> RecordOptions:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UserError("no command to record: dstrace record [options] [--] COMMAND..., "
                        "e.g. dstrace record torchrun --nproc_per_node 2 main.py")
    if args.window_call < 1 or args.window_start < 0 or args.window_steps < 1:
        raise UserError("the window needs --window-call >= 1, --window-start >= 0 and --window-steps >= 1")
    if args.window_after < 0 or args.window_seconds <= 0:
        raise UserError("the time-based window needs --window-after >= 0 and --window-seconds > 0")
    return RecordOptions(command=command, output=args.output, force=args.force, run_id=args.run_id,
                         window=WindowOptions(mode=args.mode, call=args.window_call,
                                              start=args.window_start, steps=args.window_steps,
                                              after=args.window_after, seconds=args.window_seconds))


def main(args: argparse.Namespace) -> int:
    recording = record(options_from_args(args))
    try:
        finish(recording.run_dir, recording.run, recording.exit_code, recording.node)
        recording.write()
    except Exception as e:  # noqa: BLE001 - the command's exit code comes through whatever befalls the record
        warn(f"could not write the run record {recording.record_path}: {type(e).__name__}: {e}; the ranks' own "
             "files are as they left them")
        return recording.exit_code
    recording.report()
    return recording.exit_code


def finish(run_dir: str, run: RunRecord, exit_code: int, node: str | None = None) -> None:
    """The run record once the command has ended: its files summarized, then its traces reduced; a rank whose
    reduction failed makes the run incomplete, its error line among the problems."""
    fill_run_record(run_dir, run, exit_code, node)
    failed = reduce_traces(run_dir, run)
    if failed:
        run.problems.extend(failed)
        run.status = "incomplete"


def reduce_traces(run_dir: str, run: RunRecord) -> list[str]:
    """Each recorded rank's trace reduced, here in dstrace's own environment (the job's has only its torch),
    with the decoder and reduction `dstrace analyze` uses, and kept beside it (`analysis.kept`): `analyze`
    then decodes no trace, and the folder can travel without its traces. Returns a line for each rank left
    without a kept reduction."""
    traces = {r.rank: r.traces[-1] for r in run.ranks if r.traces}
    if not traces:
        return []
    from dstrace.analysis.kept import write_run_reductions

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # before the line that says Ctrl-C works
    try:
        say(f"reducing {len(traces)} trace(s) for analysis (Ctrl-C leaves this out: dstrace analyze reads the traces)")
        return write_run_reductions(run_dir, traces, run.world_size or 0)
    except KeyboardInterrupt:  # the job has ended and its files are whole: the reduction only saves analyze time
        say("Ctrl-C: the traces are not reduced; dstrace analyze reads them")
        run.notes.append("the traces were not reduced (Ctrl-C while dstrace reduced them); dstrace analyze reads them")
        return []
    except Exception as exc:  # the recording is done and whole: a failed reduction only costs analyze its speed
        return [f"no kept reductions ({type(exc).__name__}: {exc}); dstrace analyze reads the traces"]
    finally:
        signal.signal(signal.SIGINT, previous)
