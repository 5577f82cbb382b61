"""`dstrace explain [FINDING]`: what a finding means and what to do, from the docs dstrace ships
(`dstrace.explain`); with no finding, every finding and its page."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("finding", nargs="?", help="a finding's id as the reports print it, e.g. tp-not-applied; "
                                                  "none: list them")


def main(args: argparse.Namespace) -> int:
    from dstrace.analysis.findings import DOCS
    from dstrace.explain import doc_link, explanation
    from dstrace.report_output import write_report

    if not args.finding:
        write_report("".join(f"{name}: {doc_link(docs)}\n" for name, docs in sorted(DOCS.items())), None)
        return 0
    write_report(explanation(args.finding), None)
    return 0
