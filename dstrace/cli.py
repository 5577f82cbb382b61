"""The `dstrace` command: a thin layer that parses arguments and turns UserError into one line.

Each verb is a module of `dstrace.commands` with `add_arguments(parser)` and `main(args) -> int`; the work
is in the floors below it.
"""
from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys

import dstrace
from dstrace.errors import UserError
from dstrace.say import say

DESCRIPTION = "Record and explain where every rank's time goes in distributed PyTorch / DeepSpeed inference."
# verb -> (module, help, usage)
VERBS = {
    "record": ("dstrace.commands.record", "run a launch command with every rank traced",
               "dstrace record [-o traces/NAME] [options] [--] COMMAND..."),
    "analyze": ("dstrace.commands.analyze", "explain where each rank's time goes", None),
    "compare": ("dstrace.commands.compare", "compare recorded runs side by side", None),
    "try": ("dstrace.commands.try_", "run a command as it is and with DeepSpeed config overrides, then compare",
            "dstrace try [--set KEY=VALUE ...] [--suggested RUN] [--repeats K] [-o DIR] [--] COMMAND..."),
    "sweep": ("dstrace.commands.sweep", "record configurations repeatedly, then compare", None),
    "view": ("dstrace.commands.view", "open a run's timelines in TensorBoard or Perfetto", None),
    "gather": ("dstrace.commands.gather", "merge the per-node folders of a multi-node run into one", None),
    "reduce": ("dstrace.commands.reduce", "reduce traces dstrace did not record into a run folder analyze reads",
               "dstrace reduce [-o RUN_DIR] [--split node|job] TRACES_DIR_OR_FILES..."),
    "explain": ("dstrace.commands.explain", "print what a finding means and what to do, from the docs dstrace ships",
                None),
}


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """All verbs are listed; only the one being run is imported, so `record` starts without pandas."""
    parser = argparse.ArgumentParser(prog="dstrace", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"dstrace {dstrace.__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name, (module_name, help_text, usage) in VERBS.items():
        verb_parser = sub.add_parser(name, help=help_text, usage=usage)
        if name == verb:
            module = importlib.import_module(module_name)
            module.add_arguments(verb_parser)
            verb_parser.set_defaults(handler=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verb = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(verb if verb in VERBS else None)
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 0
    try:
        return args.handler(args)
    except UserError as e:
        say(str(e))
        return e.code
    except KeyboardInterrupt:
        print("dstrace: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The console script: `main`, then an exit that skips the interpreter's teardown, which frees every
    object and module one by one (pandas, HTA, a run's analysis): 65 ms after the imports alone, about a
    tenth of a small run's analysis. Exit handlers still run and the streams are flushed first."""
    code = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what the normal exit would meet too
            code = code or 1
    os._exit(code)


if __name__ == "__main__":
    run()
