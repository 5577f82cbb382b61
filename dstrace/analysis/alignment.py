"""The one cross-rank pass over a run's collectives: match them (`matching`), put every rank on one clock
(`clocks`), split each call's time into waiting for peers and transfer (`peer_wait`). `analyze`
(pipeline) and `view --perfetto` (timeline) both call `align`.
"""
from __future__ import annotations

import pandas as pd

from dstrace.analysis.clocks import apply_offsets, estimate_clock_offsets, refuse_unsupported
from dstrace.analysis.matching import match_collectives
from dstrace.analysis.results import ClockOffset
from dstrace.analysis.peer_wait import split_wait, withhold

def align(coll: pd.DataFrame, steps: pd.DataFrame | None, hosts: dict[int, str | None],
          policy: str = "auto",
          withhold_all: str | None = None) -> tuple[pd.DataFrame, dict[int, ClockOffset], list[str]]:
    """Match, estimate and apply clock offsets, split waits: the whole cross-rank pass. `hosts` names every
    rank with a trace; `withhold_all`, when given, is why no call gets a split. The warnings are the
    matching's; why splits are withheld is said over the analysed span (`peer_wait.withheld_warnings`)."""
    coll, warnings = match_collectives(coll, steps, hosts)
    offsets = estimate_clock_offsets(coll, hosts, policy)
    # each step returns a new frame: rebinding `coll` lets the one before go (millions of calls at 10,000 ranks)
    coll = apply_offsets(coll, offsets)
    coll, refused = refuse_unsupported(coll, offsets)
    warnings = warnings + refused
    coll = withhold(coll, offsets, withhold_all)
    return split_wait(coll), offsets, warnings


def host_only_reason(run) -> str | None:
    """Why no call of a run gets a split when only its host side is read (`LoadedRun.device` "host-only")."""
    if run.device != "host-only":
        return None
    traces = f"{' and '.join(run.accelerators)} traces" if run.accelerators else "a GPU job traced without its GPU"
    return f"host-side ops of {traces}, which launch the transfer rather than do it"
