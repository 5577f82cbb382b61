"""`dstrace try [--set KEY=VALUE ...] [--suggested RUN] -- COMMAND`: the user's unchanged command as it is
and with DeepSpeed config overrides, K times each, alternating, then compared.

Each run is `dstrace record --mode annotate` (ranges and timings, no profiler cost in the times) into
`DIR/as-is/rep<k>` or `DIR/variant/rep<k>` (`trying.runs`). The overrides reach the job in
DSTRACE_CONFIG_OVERRIDES and are set by the recording code on every config the job hands DeepSpeed
(recording/overrides.py). A run that fails as it is stops `try` with the job's exit code; one that fails with
the overrides is a result. The comparison is `dstrace compare`'s; `DIR/try.json` and `DIR/try.md` keep it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time

from dstrace.errors import UserError
from dstrace.say import say

RESULT_FILE = "try.json"
RESULT_MARKDOWN = "try.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dstrace.trying.render import FORMATS

    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                        help="a DeepSpeed config path and its value (JSON where it parses, else a string), e.g. "
                             "zero_optimization.stage=0; repeatable")
    parser.add_argument("--suggested", metavar="RUN", help="try the config change a finding of RUN's analysis names")
    parser.add_argument("--repeats", type=int, default=3, metavar="K", help="runs of each side (default 3)")
    parser.add_argument("-o", "--output", metavar="DIR", help="where the runs go (default: traces/try-<time>)")
    parser.add_argument("--format", choices=FORMATS, default="text", help="what is printed (default text)")
    parser.add_argument("--mode", choices=("annotate", "full"), default="annotate",
                        help="recording mode of every run (default annotate: no profiler cost in the timings)")
    parser.add_argument("--run-timeout", type=float, default=None, metavar="SECONDS",
                        help="stop a run that takes longer (it counts as failed)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the launch command, after --")


def command_of(args) -> list[str]:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UserError("no command to try: dstrace try --set KEY=VALUE -- COMMAND..., "
                        "e.g. dstrace try --set zero_optimization.stage=0 -- torchrun --nproc_per_node 2 main.py")
    return command


def _output_dir(given: str | None) -> str:
    from dstrace.trying.result import AS_IS, VARIANT

    out = os.path.abspath(given or os.path.join("traces", f"try-{time.strftime('%Y%m%d-%H%M%S')}"))
    if os.path.islink(out) or (os.path.exists(out) and not os.path.isdir(out)):
        raise UserError(f"-o {given}: not a folder; choose another")
    if any(os.path.exists(os.path.join(out, x)) for x in (AS_IS, VARIANT, RESULT_FILE)):
        raise UserError(f"-o {given or out}: holds an earlier try; choose another folder")
    os.makedirs(out, exist_ok=True)
    return out


def main(args: argparse.Namespace) -> int:
    from dstrace.comparison.sweep import SweepStopped, on_sigterm
    from dstrace.recording.overrides import ENV_OVERRIDES
    from dstrace.trying.keys import check_path, describe, parse_sets
    from dstrace.trying.result import AS_IS, VARIANT
    from dstrace.trying.runs import AsIsFailed, record_all

    command = command_of(args)
    if args.repeats < 1:
        raise UserError("--repeats needs at least 1")
    notes: list[str] = []
    overrides: list[tuple[str, object]] = []
    if args.suggested:
        from dstrace.trying.suggest import suggested

        overrides, notes = suggested(args.suggested)
        for path, value in overrides:
            check_path(path, value)
    given = parse_sets(args.sets)
    overrides = [(p, v) for p, v in overrides if p not in dict(given)] + given
    if not overrides:
        raise UserError("nothing to try: give --set KEY=VALUE (e.g. zero_optimization.stage=0) or --suggested RUN")
    out = _output_dir(args.output)
    for note in notes:
        say(note)
    say(f"trying {describe(overrides)}: {args.repeats} run(s) as-is and {args.repeats} with it, alternating, in {out}")
    sides = {AS_IS: dict(os.environ), VARIANT: dict(os.environ, **{ENV_OVERRIDES: json.dumps(overrides)})}
    sides[AS_IS].pop(ENV_OVERRIDES, None)
    plan = [(k, s) for k in range(1, args.repeats + 1) for s in (AS_IS, VARIANT)]
    previous = signal.signal(signal.SIGTERM, on_sigterm)  # the runs are in their own sessions: stop them too
    try:
        runs = record_all(out, plan, command, sides, args.mode, args.run_timeout)
    except SweepStopped:
        say("stopped by SIGTERM; the runs recorded so far are in " + out)
        return 128 + signal.SIGTERM
    except AsIsFailed as failed:
        say(f"the command fails as it is (exit code {failed.code}): nothing to compare the change with")
        return failed.code if failed.code is not None else 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _report(out, overrides, notes, runs, args.format)


def _report(out: str, overrides, notes: list[str], runs, fmt: str) -> int:
    from dstrace.comparison.compare import compare_runs
    from dstrace.report_output import write_report
    from dstrace.trying.render import build, render
    from dstrace.trying.runs import manifests

    comparison = compare_runs([out], baseline="as-is")
    result = build(comparison, overrides, notes, runs, {r.path: manifests(r.path) for r in runs})
    write_report(render(result, "json", comparison), os.path.join(out, RESULT_FILE))
    write_report(render(result, "markdown", comparison), os.path.join(out, RESULT_MARKDOWN))
    write_report(render(result, fmt, comparison), None)
    return 0 if result["variant"]["complete"] == result["variant"]["runs"] else 1
