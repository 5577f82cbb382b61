"""`dstrace gather OUT [NODE_FOLDER...]`: one run folder, and its run.json, from the nodes of a multi-node run
(`recording.gather`)."""
from __future__ import annotations

import argparse
import os

from dstrace.say import say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", metavar="OUT",
                        help="the run folder to write; with no NODE_FOLDER, the shared folder every node wrote into")
    parser.add_argument("nodes", nargs="*", metavar="NODE_FOLDER",
                        help="per-node run folders (copied from each node's disk) to merge into OUT")


def main(args: argparse.Namespace) -> int:
    from dstrace.recording.gather import gather

    run = gather(args.output, args.nodes)
    say(f"{run.status} run {run.run_id}: {len(run.ranks)} rank(s) of world {run.world_size} "
        f"in {os.path.abspath(args.output)}")
    for problem in run.problems:
        say(problem)
    return 0
