"""Clock offsets between ranks, from the ends of matched collectives.

A collective's kernels finish together on all ranks (the last byte arrives everywhere at about the same
time), so the median of (end on rank r - end on the reference rank) estimates rank r's clock offset.
Ranks on the reference's host share its clock and are left alone unless asked.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

from dstrace.analysis.results import ClockOffset
from dstrace.rankset import ranks_text

RESIDUAL_MAX_SHARE = 0.25
"""A rank's clock may be off by about its residual, and so may each start time the split compares. Above a
quarter of the typical call it was measured on, the wait a call shows could be mostly clock error. On the
H200 reference runs the residual is 6-8 us against calls of 70 us and more (under 10%); HTA's 2-rank
pipeline pair, matched kernel by kernel without peers, left 21 ms against calls of 30-60 ms."""


def _end_differences(coll: pd.DataFrame, a: int) -> pd.DataFrame:
    """Offset of every rank b sharing a collective with rank a (b's clock - a's), and how many they share.

    Only the instances rank a took part in are read, so the cost follows a's collectives, not ranks squared.
    Causality bounds each estimate: no rank finishes a collective before every peer has started it, so
    the offset lies in [max(start_b - end_a), min(end_b - start_a)]. GPU kernels end together, so the
    median end difference is the estimate, kept inside those bounds. Host-side ops (gloo, c10d) do not:
    each finishes after its own share of host work, which differs by rank; there the middle of the bounds
    is the estimate, and the end median only when the bounds contradict each other.
    """
    own = coll[coll["rank"] == a].drop_duplicates("instance").set_index("instance")
    if own.empty:
        return pd.DataFrame(columns=["diff", "n"])
    mine = own["end"]  # the first of its calls should it hold an instance twice
    rows = coll.loc[coll["instance"].isin(mine.index), ["instance", "rank", "ts", "end"]].drop_duplicates(
        ["instance", "rank"])  # the columns read: at 10,000 ranks a world group's calls are a million rows
    rows = rows[rows["rank"] != a]
    at = rows["instance"]
    by_rank = rows["rank"].to_numpy()
    frame = pd.DataFrame({
        "diff": rows["end"].to_numpy() - at.map(mine).to_numpy(),
        "lower": rows["ts"].to_numpy() - at.map(own["end"]).to_numpy(),
        "upper": rows["end"].to_numpy() - at.map(own["ts"]).to_numpy()}, index=by_rank).groupby(level=0)
    out = pd.DataFrame({"diff": frame["diff"].median(), "n": frame["diff"].size(),
                        "lower": frame["lower"].max(), "upper": frame["upper"].min()}).sort_index()
    consistent = out["lower"] <= out["upper"]
    kernels = "source" in own and bool((own["source"] == "nccl kernel").all())
    if kernels:
        out.loc[consistent, "diff"] = out.loc[consistent, "diff"].clip(out["lower"], out["upper"])
    else:
        out.loc[consistent, "diff"] = (out["lower"] + out["upper"])[consistent] / 2
    return out[["diff", "n"]]


def estimate_clock_offsets(coll: pd.DataFrame, hosts: dict[int, str | None],
                           policy: str = "auto") -> dict[int, ClockOffset]:
    """Per-rank offsets to the lowest rank's clock, chained through peers when a rank shares no group with it.

    auto applies an offset to ranks on another host than the reference (or of unknown host); always and
    never force it. Ranks sharing no collective with any aligned rank keep offset 0, marked unmatched.
    Breadth first from the reference: each rank is estimated against the first aligned rank it shares
    a collective with, so hundreds of ranks in one world group cost one pass over the reference's calls.
    """
    ranks = sorted(set(coll["rank"]) | set(hosts))
    if not ranks:
        return {}
    ref = ranks[0]
    offsets: dict[int, ClockOffset] = {ref: ClockOffset(0.0, False, 0.0, 0, None)}
    estimate = {ref: 0.0}
    queue = deque([ref])
    while queue and len(estimate) < len(ranks):
        a = queue.popleft()
        for b, row in _end_differences(coll, a).iterrows():
            b = int(b)
            if b in estimate:
                continue
            estimate[b] = estimate[a] + float(row["diff"])
            same_host = hosts.get(b) is not None and hosts.get(b) == hosts.get(ref)
            applied = policy == "always" or (policy == "auto" and not same_host)
            offsets[b] = ClockOffset(estimate[b], applied, None, int(row["n"]), a)
            queue.append(b)
    for r in ranks:
        offsets.setdefault(r, ClockOffset(0.0, False, None, 0, None))
    return offsets


def apply_offsets(coll: pd.DataFrame, offsets: dict[int, ClockOffset]) -> pd.DataFrame:
    """Shift ts/end/host_ts of ranks whose offset is applied, then record each rank's residual and the
    median length of the calls it was measured on (per call, the longer of the two ranks' durations)."""
    coll = coll.copy(deep=False)  # the shifted columns are replaced, not written into
    shift = _by_rank(coll["rank"], {r: (o.offset_us if o.applied else 0.0) for r, o in offsets.items()})
    for col in ("ts", "end", "host_ts"):
        coll[col] = coll[col] - shift
    if coll.empty:
        return coll
    _record_residuals(coll, offsets)
    return coll


def _by_rank(rank: pd.Series, values: dict[int, float]) -> np.ndarray:
    """Each call's value of its rank (0.0 for a rank without one or with NaN: `map(values).fillna(0.0)`), looked
    up in an array indexed by rank (ranks are 0 <= rank < MAX_WORLD) rather than through an index of the ranks."""
    ranks = rank.to_numpy().astype(np.int64, copy=False)
    table = np.zeros(int(ranks.max()) + 1 if len(ranks) else 0)
    for r, v in values.items():
        if 0 <= r < len(table):
            table[r] = v
    return np.nan_to_num(table, nan=0.0, posinf=np.inf, neginf=-np.inf)[ranks]


def _record_residuals(coll: pd.DataFrame, offsets: dict[int, ClockOffset]) -> None:
    residual, calls, present = _residuals(coll, offsets)
    for r, o in offsets.items():
        if o.via is None or r not in present or o.via not in present:
            continue
        o.residual_us = residual.get(r)
        o.call_median_us = calls.get(r)


def refuse_unsupported(coll: pd.DataFrame, offsets: dict[int, ClockOffset]) -> tuple[pd.DataFrame, list[str]]:
    """Take back the offsets these collectives do not measure, and say why: where a shifted rank's ends still
    differ from its peer's by more than the shift itself, and by more than the calls allow (`doubtful_clocks`),
    the shift moved the rank by an amount the ends do not support. Its times stay on its own clock (the
    residuals are measured again without the shift)."""
    refused = {r: o for r, o in doubtful_clocks(coll, offsets).items()
               if o.applied and o.residual_us > abs(o.offset_us)}
    if not refused:
        return coll, []
    worst = max(refused, key=lambda r: refused[r].residual_us)
    o = refused[worst]
    offsets_of = "clock offsets of" if len(refused) > 1 else "clock offset of"
    line = (f"{offsets_of} {ranks_text(refused)} not applied: rank {worst}'s estimate from the ends of "
            f"{o.matched} collectives matched with rank {o.via} is {o.offset_us:+.1f} us, yet after that shift "
            f"their ends still differ by {o.residual_us:.1f} us (median), more than the shift itself: these "
            "collectives do not align the clocks, so the times of each rank stay on its own clock")
    coll = coll.copy(deep=False)
    shift = _by_rank(coll["rank"], {r: refused[r].offset_us for r in refused})
    for col in ("ts", "end", "host_ts"):
        coll[col] = coll[col] + shift
    for r in refused.values():
        r.applied = False
    _record_residuals(coll, offsets)
    return coll, [line]


def _residuals(coll: pd.DataFrame, offsets: dict[int, ClockOffset]) -> tuple[dict, dict, set]:
    """Per rank with a via-rank, over the instances both hold (each rank's first call of an instance), on the
    corrected clocks of both: the median |end difference| and the median of the longer duration; and the
    ranks that hold any call. One lookup over all ranks on an integer (instance, rank) key, not a pass per
    rank nor a merge of two frames of every call (a median does not depend on the order of its values)."""
    rank = coll["rank"].to_numpy().astype(np.int64, copy=False)
    present = set(pd.unique(rank).tolist())
    if not len(rank):
        return {}, {}, present
    width = int(rank.max()) + 1
    pair = coll["instance"].to_numpy().astype(np.int64) * width
    pair += rank
    end, dur = coll["end"].to_numpy(dtype="float64"), coll["dur"].to_numpy(dtype="float64")
    # looked up in the keys sorted, not hashed: hash tables of millions of keys held 0.4 GB at 10,000 ranks
    order = np.argsort(pair, kind="stable")
    ordered = pair[order]
    repeated = order[1:][ordered[1:] == ordered[:-1]]  # a rank's later calls of an instance
    if len(repeated):  # each rank's first call of an instance (matching gives a rank one call per instance)
        first = np.ones(len(pair), dtype=bool)
        first[repeated] = False
        pair, rank, end, dur = pair[first], rank[first], end[first], dur[first]
        order = np.argsort(pair, kind="stable")
        ordered = pair[order]
    via = {r: o.via for r, o in offsets.items() if o.via is not None and 0 <= o.via < width}
    via_of = np.full(width, -1, dtype=np.int64)
    for r, v in via.items():
        if 0 <= r < width:
            via_of[r] = v
    mine = np.flatnonzero(via_of[rank] >= 0)
    wanted = pair[mine] - rank[mine] + via_of[rank[mine]]  # the via rank's key of the same instance
    del pair  # each of these a column of every call (30 MB at 10,000 ranks): let go as soon as used
    at = np.minimum(np.searchsorted(ordered, wanted), max(len(ordered) - 1, 0))
    held = ordered[at] == wanted
    del ordered, wanted
    mine, theirs = mine[held], order[at[held]]
    del order, at, held
    by_rank = rank[mine]
    diff = pd.Series(np.abs(end[mine] - end[theirs]))
    residual = diff.groupby(by_rank).median()[diff.groupby(by_rank).count() > 0]
    calls = pd.Series(np.fmax(dur[mine], dur[theirs])).groupby(by_rank).median()
    return ({int(r): float(v) for r, v in residual.items()}, {int(r): float(v) for r, v in calls.items()},
            present)


def doubtful_clocks(coll: pd.DataFrame, offsets: dict[int, ClockOffset]) -> dict[int, ClockOffset]:
    """Ranks whose residual exceeds RESIDUAL_MAX_SHARE of the calls it was measured on. Only where the calls
    are kernels: a kernel ends when the last byte arrives everywhere, so its ends must line up; host-side
    ops (gloo) end after their own work, and their residual measures that, not the clock."""
    kernels = (coll["source"] == "nccl kernel").to_numpy(dtype=bool, na_value=False)
    kernel_ranks = set(pd.unique(coll["rank"].to_numpy()[kernels]).tolist())  # not a set of millions of rows
    return {r: o for r, o in offsets.items()
            if r in kernel_ranks and o.residual_us is not None and o.call_median_us
            and o.residual_us > RESIDUAL_MAX_SHARE * o.call_median_us}


def alignment_note(offsets: dict[int, ClockOffset]) -> str | None:
    """One line for any number of ranks: how many were shifted, by how much, and the residual left."""
    shifted = {r: o for r, o in offsets.items() if o.applied}
    if not shifted:
        return None
    values = [o.offset_us for o in shifted.values()]
    residuals = [o.residual_us for o in shifted.values() if o.residual_us is not None]
    line = (f"clocks aligned on the ends of matched collectives: {len(shifted)} rank(s) shifted by "
            f"{min(values) / 1e3:+.3f} to {max(values) / 1e3:+.3f} ms")
    if residuals:
        worst = max(shifted, key=lambda r: shifted[r].residual_us or 0.0)
        line += (f"; residual median {float(np.median(residuals)):.1f} us, worst {max(residuals):.1f} us "
                 f"(rank {worst})")
    return line
