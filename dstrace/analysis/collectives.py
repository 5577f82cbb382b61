"""The run's collectives: every rank's calls in one table, and per rank and kind how many, how many bytes,
how long, what bandwidth. Which events of a rank are collectives is `rank_collectives` (per rank, in the
reduction); this module reads the reductions only.

Bandwidths follow nccl-tests: algbw = size / time, busbw = algbw * factor(kind, n).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from dstrace.analysis import intervals
from dstrace.analysis.loaded import LoadedRun
from dstrace.analysis.results import ClockOffset, CollectiveStats
from dstrace.rankset import ranks_text
from dstrace.trace_names import parse_ranks


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests bus bandwidth factor: what each rank's link must carry relative to the message size."""
    if n <= 1:
        return 0.0
    if kind == "AllReduce":
        return 2 * (n - 1) / n
    if kind in ("AllGather", "ReduceScatter", "AllToAll", "Gather", "Scatter"):
        return (n - 1) / n
    return 1.0


def message_size(in_bytes: float, out_bytes: float) -> float:
    """The nccl-tests "size" of a collective: the larger of the send and receive buffers (AllGather: the
    gathered output; ReduceScatter: the full input; AllReduce/Broadcast: the buffer)."""
    return max(in_bytes, out_bytes)


COLUMNS = ["rank", "kind", "name", "ts", "dur", "end", "host_ts", "in_bytes", "out_bytes", "bytes",
           "group_size", "group", "group_ranks", "source", "p2p_role", "p2p_peer"]


@lru_cache(maxsize=4096)
def _ranks_text(value: str) -> tuple[int, ...] | None:
    return parse_ranks(value)


def _group_ranks(value) -> tuple[int, ...] | None:
    """`parse_ranks`, once per distinct text: a run has a few groups and ~10^5 collectives naming them, each
    as the same long "[0, 1, ...]"."""
    return _ranks_text(value) if isinstance(value, str) else parse_ranks(value)


def _per_value(column: pd.Series, fn) -> np.ndarray:
    """fn of each value, called once per distinct object: a run has a few groups and millions of calls
    naming them, each rank's calls sharing its decoded texts (`kept`), so objects are told apart by
    identity rather than by hashing a long "[0, 1, ...]" per call. fn must be pure."""
    values = column.to_numpy(dtype=object)
    codes, ids = pd.factorize(np.fromiter(map(id, values), dtype=np.int64, count=len(values)))
    first = np.empty(len(ids), dtype=np.int64)
    first[codes[::-1]] = np.arange(len(values) - 1, -1, -1)
    lookup = np.empty(len(ids), dtype=object)
    lookup[:] = [fn(values[i]) for i in first]
    return lookup[codes]


def collective_events(run: LoadedRun) -> pd.DataFrame:
    """All ranks' collectives, one row each: rank, kind, ts, dur, end, host_ts, bytes, group, group_ranks."""
    if run.calls.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = run.calls.copy(deep=False)  # columns are added and replaced, none written into
    # message_size; missing sizes are 0 (read as numbers, not filled in an object column: pandas 2 and 3 alike)
    sizes = np.maximum(df["in_bytes"].to_numpy(dtype="float64", na_value=0),
                       df["out_bytes"].to_numpy(dtype="float64", na_value=0))
    df["bytes"] = pd.Series(sizes, index=df.index).astype("int64")
    everyone = tuple(range(run.world_size))
    df["group_ranks"] = _per_value(df["pg_ranks"], lambda v: _group_ranks(v) or everyone)
    df["group"] = _per_value(df["pg_name"], lambda g: str(g) if isinstance(g, str) and g else "world")
    df["group_size"] = pd.to_numeric(df["group_size"], errors="coerce")
    if df["group_size"].isna().any():
        df["group_size"] = df["group_size"].fillna(df["group_ranks"].map(len))
    df["group_size"] = df["group_size"].astype("int64")
    df["p2p_peer"] = pd.to_numeric(df["p2p_peer"], errors="coerce")
    roles = df["p2p_role"]
    if roles.dtype != object or not set(pd.unique(roles.to_numpy())) <= {None, "send", "recv"}:
        df["p2p_role"] = roles.where(roles.isin(("send", "recv")), None)  # else as it is, not a copy of it
    if not in_rank_ts_order(df):  # ranks come in order, each its calls by start: no sorted copy of them all
        df = df.sort_values(["rank", "ts"], kind="stable")
    return df.reset_index(drop=True)[COLUMNS]


def in_rank_ts_order(df: pd.DataFrame) -> bool:
    """Whether the rows are in (rank, ts) order already, so a stable sort would leave them as they are."""
    rank, ts = df["rank"].to_numpy(), df["ts"].to_numpy(dtype="float64")
    if len(rank) < 2:
        return True
    if np.isnan(ts).any():
        return False
    return bool(np.all((rank[1:] > rank[:-1]) | ((rank[1:] == rank[:-1]) & (ts[1:] >= ts[:-1]))))


def rank_windows(run: LoadedRun, offsets: dict[int, ClockOffset]) -> dict[int, tuple[float, float]]:
    """Each rank's analysed window (`utilization`: the kernel span on GPU, the step ranges on CPU) on the
    aligned clock of `alignment.align`."""
    out = {}
    gpu = run.device == "gpu"
    for r, t in run.traces.items():
        window = t.reduced.utilization.get("window_us") if t.has_gpu == gpu else None
        if not window:
            continue
        o = offsets.get(r)
        shift = o.offset_us if o is not None and o.applied else 0.0
        out[r] = (float(window[0]) - shift, float(window[1]) - shift)
    return out


def in_windows(coll: pd.DataFrame, windows: dict[int, tuple[float, float]] | None) -> pd.DataFrame:
    """The calls each rank's analysed window holds: those that start inside it, their time cut at its end
    (wait first, then transfer). A rank without a window keeps every call. Windows are on the clock of
    `coll` (after alignment)."""
    if not windows or coll.empty:
        return coll
    bounds = pd.DataFrame([(r, lo, hi) for r, (lo, hi) in windows.items()], columns=["rank", "lo", "hi"])
    lo = coll["rank"].map(bounds.set_index("rank")["lo"]).fillna(-np.inf)
    hi = coll["rank"].map(bounds.set_index("rank")["hi"]).fillna(np.inf)
    inside = (coll["ts"] >= lo) & (coll["ts"] <= hi)
    # the columns cut are replaced, none written into: the other columns stay the caller's (every call's
    # columns copied was 0.8 GB at 10,000 ranks, twice: taken, then copied again)
    coll = (coll if inside.all() else coll[inside]).copy(deep=False)
    hi = hi[inside]
    cut = coll["end"] > hi
    coll["dur"] = coll["dur"].where(~cut, hi - coll["ts"])  # the others' unchanged, to the bit
    coll["end"] = coll["end"].where(~cut, hi)
    if "wait_us" in coll and cut.any():
        coll["wait_us"] = coll["wait_us"].where(~cut, np.minimum(coll["wait_us"], coll["dur"]))
        coll["transfer_us"] = coll["transfer_us"].where(~cut, coll["dur"] - coll["wait_us"])
    return coll


def _overlap_union_us(rows: pd.DataFrame) -> float | None:
    """The union of the calls' intervals where some of them overlap, else None (their durations add up)."""
    ordered = rows.sort_values("ts", kind="stable")
    reach = ordered["end"].cummax().shift()
    if not (ordered["ts"] < reach).any():
        return None
    return intervals.total(intervals.merge(rows["ts"], rows["end"]))


def _overlapping(coll: pd.DataFrame) -> list[tuple]:
    """The (rank, kind) pairs some of whose calls overlap in time: a call starting before an earlier one of
    the pair has ended. One sort over all ranks, keyed by integer codes (a grouping by the kind's text hashed
    every call's, seconds at millions of calls); only these pairs need `_overlap_union_us`."""
    if not coll.empty and in_rank_ts_order(coll):
        coll = coll[np.isin(coll["rank"].to_numpy(), _ranks_overlapping(coll))]
    if coll.empty:
        return []
    ranks, rank_values = pd.factorize(coll["rank"])
    kinds, kind_values = pd.factorize(coll["kind"])
    pair = np.where((kinds >= 0) & (ranks >= 0), ranks.astype(np.int64) * max(len(kind_values), 1) + kinds, -1)
    ts, end = coll["ts"].to_numpy(dtype="float64"), coll["end"].to_numpy(dtype="float64")
    order = np.lexsort((ts, pair))  # stable: a pair's calls by start, ties as they come
    pair, ts, end = pair[order], ts[order], end[order]
    reach = pd.Series(end).groupby(pair).cummax().to_numpy()  # gaps skipped, as a grouped cummax does
    same = (pair[1:] == pair[:-1]) & (pair[1:] >= 0)
    hit = np.flatnonzero(same & (ts[1:] < reach[:-1])) + 1
    width, rank_of, kind_of_code = max(len(kind_values), 1), rank_values.tolist(), kind_values.tolist()
    return sorted((rank_of[c // width], kind_of_code[c % width]) for c in np.unique(pair[hit]).tolist())


def _ranks_overlapping(coll: pd.DataFrame) -> list:
    """The ranks some of whose calls (of any kind) start before an earlier one has ended, for calls in (rank, ts)
    order: the only ranks where calls of one kind can overlap. A pass per rank over its own rows: sorting
    millions of calls by (rank, kind, ts) held 0.2 GB of keys at 10,000 ranks, for the few ranks that overlap."""
    rank = coll["rank"].to_numpy()
    ts, end = coll["ts"].to_numpy(dtype="float64"), coll["end"].to_numpy(dtype="float64")
    starts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    stops = np.r_[starts[1:], len(rank)]
    return [rank[a] for a, b in zip(starts.tolist(), stops.tolist())
            if b - a > 1 and (ts[a + 1:b] < np.fmax.accumulate(end[a:b - 1])).any()]


def collective_stats(coll: pd.DataFrame, windows: dict[int, tuple[float, float]] | None = None
                     ) -> dict[int, dict[str, CollectiveStats]]:
    """Per rank and kind, over the calls in the rank's analysed window (`in_windows`): count, bytes, time,
    and the nccl-tests bandwidths. Time (`kernel_us`, and `unsplit_us` of the calls whose split is
    withheld) is the union of the calls' intervals: calls that overlap (on several threads or streams)
    count once, so it never exceeds the window; wait and transfer are summed per call. Needs the
    `peer_wait.split_wait` columns: withheld calls are left out of the bandwidth over transfer."""
    out: dict[int, dict[str, CollectiveStats]] = {}
    coll = in_windows(coll, windows)
    if coll.empty:
        return out
    split = coll["split"].astype(bool)
    coll = coll.assign(split_bytes=coll["bytes"].where(split, 0), unsplit_us=coll["dur"].where(~split, 0.0))
    grouped = coll.groupby(["rank", "kind"]).agg(
        count=("dur", "size"), bytes=("bytes", "sum"), kernel_us=("dur", "sum"),
        wait_us=("wait_us", "sum"), transfer_us=("transfer_us", "sum"), unsplit_us=("unsplit_us", "sum"),
        split_count=("split", "sum"), split_bytes=("split_bytes", "sum"), group_size=("group_size", "max"))
    for rank, kind in _overlapping(coll):
        rows = coll[(coll["rank"] == rank) & (coll["kind"] == kind)]
        grouped.loc[(rank, kind), "kernel_us"] = _overlap_union_us(rows)
        unsplit = _overlap_union_us(rows[~rows["split"].astype(bool)])
        if unsplit is not None:
            grouped.loc[(rank, kind), "unsplit_us"] = unsplit
    # iterrows' rows are float64 (all columns numeric): the sizes below are divided as floats, as they were
    for (rank, kind), row in zip(grouped.index, grouped.astype("float64").to_dict("records")):
        kernel_us = float(row["kernel_us"])
        algbw = row["bytes"] / kernel_us / 1e3 if kernel_us > 0 else 0.0
        factor = busbw_factor(kind, int(row["group_size"]))
        transfer_busbw = None
        if row["split_count"]:
            transfer_bw = row["split_bytes"] / row["transfer_us"] / 1e3 if row["transfer_us"] > 0 else 0.0
            transfer_busbw = float(transfer_bw * factor)
        out.setdefault(int(rank), {})[kind] = CollectiveStats(
            count=int(row["count"]), bytes=int(row["bytes"]), kernel_us=kernel_us,
            wait_us=float(row["wait_us"]), transfer_us=float(row["transfer_us"]),
            algbw_GBps=float(algbw), busbw_GBps=float(algbw * factor),
            busbw_transfer_GBps=transfer_busbw, group_size=int(row["group_size"]),
            unsplit_us=float(row["unsplit_us"]))
    return out


def window_notes(coll: pd.DataFrame, windows: dict[int, tuple[float, float]] | None) -> list[str]:
    """What the Collectives table leaves out or counts once: calls outside the ranks' analysed windows,
    and calls of one kind that overlap in time (several threads or streams), with their summed time."""
    if coll.empty:
        return []
    notes = []
    kept = in_windows(coll, windows)
    outside = coll["rank"].iloc[:0] if kept is coll else coll.loc[~coll.index.isin(kept.index), "rank"]
    if len(outside):
        notes.append(f"{len(outside)} collective call(s) on {ranks_text(set(outside))} start outside the analysed "
                     "span and are left out of the Collectives table")
    overlapping = []
    for rank, kind in _overlapping(kept):
        rows = kept[(kept["rank"] == rank) & (kept["kind"] == kind)]
        union = _overlap_union_us(rows)
        summed = float(rows["dur"].sum())
        if summed > union * 1.01:
            overlapping.append(f"{kind} on rank {int(rank)}: {union / 1e3:.1f} ms, {summed / 1e3:.1f} ms summed")
    if overlapping:
        notes.append("collective calls that overlap in time (on several threads or streams) count once in the "
                     "Collectives table's time: " + "; ".join(overlapping[:4])
                     + (f"; and {len(overlapping) - 4} more" if len(overlapping) > 4 else ""))
    return notes
