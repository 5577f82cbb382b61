"""Where the AllGather (and every other collective's) wait is computed: waiting for peers vs transfer.

The kernel of a rank that arrives early spins until the last peer arrives: its time splits into
wait = (last start among the peers - own start) and transfer = the rest. The split is withheld
(`withheld` says why, `split` is False, wait and transfer NaN) where it would be a guess: a
point-to-point call whose peer is unnamed or has no trace, an NCCL kernel that names no kind, a call
whose group has members without a trace (the last to arrive may be one of them), a call no rank
matched, and every call of a rank whose clock residual is large against the calls it was measured on.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from dstrace.analysis.clocks import doubtful_clocks
from dstrace.analysis.collectives import in_windows
from dstrace.analysis.matching import (
    CLOCK, GIVEN, GROUP_ABSENT, KIND_UNNAMED, PEER_ABSENT, PEER_UNNAMED, UNMATCHED, absent_members,
)
from dstrace.analysis.results import ClockOffset
from dstrace.rankset import ranks_text


def withhold(coll: pd.DataFrame, offsets: dict[int, ClockOffset], given: str | None = None) -> pd.DataFrame:
    """Withhold the split of every call of a rank whose clock is doubtful (and of its matched calls on other
    ranks, whose split compares against its starts), or of every call when `given` says why."""
    coll = coll.copy(deep=False)  # only `withheld` changes: the other columns are the caller's
    if given is not None:
        coll["withheld"] = GIVEN
        return coll
    doubtful = doubtful_clocks(coll, offsets)
    if doubtful:
        coll["withheld"] = coll["withheld"].copy()
        touched = coll["instance"].isin(set(coll.loc[coll["rank"].isin(doubtful), "instance"]))
        coll.loc[touched & coll["withheld"].isna(), "withheld"] = CLOCK
    return coll


def split_wait(coll: pd.DataFrame) -> pd.DataFrame:
    """wait_us = last start among the instance's ranks - own start (within own duration); transfer = rest.

    `split` is False, and wait_us and transfer_us NaN, for calls whose split is withheld. `waited_for` is
    the rank that arrived last (the one this rank waited on), or -1 for the last rank itself, for calls
    no peer was matched to and for calls whose split is withheld.
    """
    coll = coll.copy(deep=False)  # columns are added, none written into
    if coll.empty:
        for col in ("wait_us", "transfer_us"):
            coll[col] = pd.Series(dtype=float)
        coll["waited_for"] = pd.Series(dtype="int64")
        coll["split"] = pd.Series(dtype=bool)
        return coll
    if "withheld" not in coll:
        coll["withheld"] = None
    ok = coll["withheld"].isna()
    grp = coll.groupby("instance")
    last_start = grp["ts"].transform("max")
    peers = grp["rank"].transform("size") - 1
    last_idx = coll.loc[grp["ts"].idxmax(), ["instance", "rank"]].set_index("instance")["rank"]
    wait = np.clip(last_start - coll["ts"], 0.0, coll["dur"]).where(peers > 0, 0.0)
    del grp, last_start  # each a column of every call (30 MB at 10,000 ranks): let go as soon as used
    coll["wait_us"] = wait.where(ok)
    del wait
    coll["transfer_us"] = coll["dur"] - coll["wait_us"]
    last_rank = coll["instance"].map(last_idx)
    waited = ok & (peers > 0) & (last_rank != coll["rank"])
    del peers
    coll["waited_for"] = np.where(waited, last_rank, -1).astype("int64", copy=False)
    coll["split"] = ok
    return coll


def waits_by_rank(coll: pd.DataFrame, windows: dict[int, tuple[float, float]] | None = None) -> dict[int, dict]:
    """Per rank, over the calls the Collectives table counts (those in the rank's analysed window,
    `collectives.in_windows`, cut at its end): wait, comm time summed per call (and the part of it whose split
    is withheld), who it waited for, and how often it was the one the others waited on. Grouped over all
    ranks at once."""
    coll = in_windows(coll, windows)
    if coll.empty:
        return {}
    unsplit = ~coll["split"].astype(bool)
    wait, comm = rank_sums(coll["rank"], coll["wait_us"]), rank_sums(coll["rank"], coll["dur"])
    withheld = rank_sums(coll.loc[unsplit, "rank"], coll.loc[unsplit, "dur"])
    # the calls that waited for a peer, as arrays: grouped by one integer key each, not a frame of them grouped
    # by two columns (0.2 GB of keys and copies at 10,000 ranks); the same groups, summed in the same order
    late = (coll["waited_for"] >= 0).to_numpy()
    rank, peer = coll["rank"].to_numpy().astype(np.int64, copy=False)[late], coll["waited_for"].to_numpy()[late]
    late_wait = coll["wait_us"].to_numpy(dtype="float64")[late]
    instance = coll["instance"].to_numpy().astype(np.int64, copy=False)[late]
    width, span = (int(peer.max()) + 1, int(instance.max()) + 1) if len(peer) else (1, 1)
    waited = pd.Series(late_wait).groupby(rank * width + peer).sum()  # by (rank, peer), in that order
    waited_for: dict[int, dict[int, float]] = defaultdict(dict)
    for pair, w in waited[waited > 0].items():
        waited_for[int(pair) // width][int(pair) % width] = float(w)
    instances = np.bincount(pd.unique(peer * span + instance) // span, minlength=width)  # distinct, per peer
    late_by = {int(p): (int(instances[p]), float(w)) for p, w in pd.Series(late_wait).groupby(peer).sum().items()}
    ranks = list(dict.fromkeys([*map(int, comm), *late_by]))  # a rank waited on may have no call in its window
    return {r: {"wait_us": float(wait.get(r, 0.0)), "comm_us": float(comm.get(r, 0.0)),
                "unsplit_us": float(withheld.get(r, 0.0)), "waited_for": waited_for.get(r, {}),
                "late_count": late_by.get(r, (0, 0.0))[0], "caused_wait_us": late_by.get(r, (0, 0.0))[1]}
            for r in ranks}


def rank_sums(ranks: pd.Series, values: pd.Series) -> dict:
    """Each rank's sum of `values` (gaps as 0), to the bit what `Series.sum` gives on the rank's rows in their
    order (numpy's pairwise sum; pandas' grouped sum adds in another order): one sort, a numpy sum per slice."""
    keys, vals = ranks.to_numpy(), values.to_numpy(dtype="float64")
    if len(keys) and not (keys[1:] >= keys[:-1]).all():  # calls come in rank order: no sorted copy of them
        order = np.argsort(keys, kind="stable")
        keys, vals = keys[order], vals[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.array([], dtype=int)
    stops = np.r_[starts[1:], len(keys)]
    return {int(keys[a]): np.where(np.isnan(vals[a:b]), 0.0, vals[a:b]).sum()
            for a, b in zip(starts.tolist(), stops.tolist())}


def withheld_warnings(coll: pd.DataFrame, offsets: dict[int, ClockOffset], present, given: str | None = None,
                      windows: dict[int, tuple[float, float]] | None = None) -> list[str]:
    """One line per reason the split is withheld: how many calls of which kinds on which ranks, and why,
    counted over the calls the Collectives table holds (those in each rank's analysed window). Unmatched
    calls are left to the count warning of `match_collectives`."""
    out = []
    if coll.empty or "withheld" not in coll:
        return out
    present = set(present)
    tail = "; peer-wait and communication-bound leave them out"
    kept = in_windows(coll, windows)
    for reason, rows in kept[kept["withheld"].notna()].groupby("withheld"):
        if reason == UNMATCHED:
            continue
        kinds = ", ".join(sorted(set(rows["kind"])))
        head = f"wait/transfer split withheld for {len(rows)} {kinds} call(s) on {ranks_text(set(rows['rank']))}: "
        if reason == PEER_UNNAMED:
            why = ("point-to-point calls whose peer the traces do not name (no Src Rank / Dst Rank): which call "
                   "on which rank is the other side cannot be told, and ranks without a trace may be it")
        elif reason == PEER_ABSENT:
            peers = ranks_text(set(rows["p2p_peer"].astype(int)))
            why = f"point-to-point calls with {peers}, which have no trace here"
        elif reason == KIND_UNNAMED:
            why = ("NCCL kernels whose name and args name no collective (ncclDevKernel_Generic without "
                   "`Collective name`): which calls on other ranks are the same cannot be told; their time is "
                   "counted as communication")
        elif reason == GROUP_ABSENT:
            why = _absent_members(rows, present)
        elif reason == CLOCK:
            r, o = max(doubtful_clocks(coll, offsets).items(),
                       key=lambda ro: ro[1].residual_us / ro[1].call_median_us)
            why = (f"after clock alignment rank {r}'s collective ends still differ from rank {o.via}'s by "
                   f"{o.residual_us / 1e3:.3f} ms (median), {o.residual_us / o.call_median_us:.0%} of the median "
                   f"call they were measured on ({o.call_median_us / 1e3:.3f} ms): start times are not comparable "
                   "to that precision, or the calls were matched wrongly")
        else:
            why = given or "withheld"
        out.append(head + why + tail)
    return out


def _absent_members(rows: pd.DataFrame, present: set[int]) -> str:
    """Which members of the calls' groups have no trace, by name when the traces list the groups' ranks."""
    lacking = absent_members(rows, present)
    size = int(rows["group_size"].max())
    if any(ranks is None for ranks in lacking.values()):
        return (f"their process group has {size} members and some have no trace here: the last member to arrive "
                "may be one of them")
    absent = set().union(*lacking.values())
    return (f"their process group includes {ranks_text(absent)} ({len(absent)} of {size}), without a trace here: "
            "the last member to arrive may be one of them")
