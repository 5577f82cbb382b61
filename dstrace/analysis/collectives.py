"""Collectives per rank: which kind, how many bytes, how long, what bandwidth.

On GPU traces a collective is an NCCL kernel (`ncclDevKernel_AllGather_RING_LL(...)`), whose args
carry the message sizes and the process group. CPU-only traces (gloo) have no kernels; there the
collective is the CPU-side op that does the work: `gloo:all_gather` on the gloo thread, else a
`record_param_comms` op with the same args as a kernel, else the `c10d::allgather_`-style op.
Bandwidths follow nccl-tests: algbw = size / time, busbw = algbw * factor(kind, n).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from dstrace.analysis import intervals
from dstrace.analysis.model import ClockOffset, CollectiveStats, LoadedRun
from dstrace.rankset import ranks_text
from dstrace.trace_names import (
    C10D_OP, GLOO_OP, LAUNCH_CATEGORIES, NCCL_HOST_RANGE, P2P_KINDS, UNNAMED_NCCL,
    collective_kernel_kind, dtype_bytes, is_nccl_kernel, kernel_kind, kind_of, numel, p2p_side, parse_ranks,
)


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


def _launch_ts(events: pd.DataFrame, kernels: pd.DataFrame) -> pd.Series:
    """Host time each kernel was launched (its cuda_runtime/driver call, joined on correlation)."""
    return kernels["correlation"].map(_launches(events)["ts"]).fillna(kernels["ts"])


def _text_names(rows: pd.DataFrame) -> pd.DataFrame:
    """A copy of a few events with their names as text, not the events frame's categorical codes."""
    rows = rows.copy()
    rows["name"] = rows["name"].astype(str)
    return rows


def _launches(events: pd.DataFrame) -> pd.DataFrame:
    """Each correlation's launch call (its host thread and time), the first where a trace repeats one."""
    launches = events.loc[events["cat"].isin(LAUNCH_CATEGORIES) & events["correlation"].notna(),
                          ["correlation", "pid", "tid", "ts"]]
    return launches.drop_duplicates("correlation").set_index("correlation")


def _range_kind(name: str) -> str | None:
    """The group collective a c10d range names (`nccl:all_to_all` -> AllToAll, `nccl:_all_gather_base` ->
    AllGather); None for point-to-point ranges (`nccl:send`) and anything else."""
    if not NCCL_HOST_RANGE.match(name):
        return None
    kind = kind_of(name.split(":", 1)[1])
    return kind if kind not in P2P_KINDS else None


def _launching_collective(events: pd.DataFrame, kernels: pd.DataFrame) -> np.ndarray:
    """The group collective (or None) of the range each kernel was launched inside on its launching thread:
    c10d's `nccl:<op>`, or a `record_param_comms` whose `Collective name` names one. Older traces write no
    args on the kernel itself; this range is then the only evidence that SendRecv kernels are one call of a
    group collective (c10d's `alltoall_base` launches them as `nccl:all_to_all`) rather than point-to-point
    calls."""
    kind = np.full(len(kernels), None, dtype=object)
    on_host = ~events["is_gpu"].to_numpy()
    by_name = {n: _range_kind(str(n)) for n in events["name"].unique()}
    range_kind = np.array(events["name"].map(by_name).astype(object), dtype=object)
    rpc = on_host & (events["name"] == "record_param_comms").to_numpy()
    if rpc.any():
        says = events.loc[rpc, "coll_name"].map(lambda c: kind_of(c.strip('"')) if isinstance(c, str) else None)
        range_kind[rpc] = [k if k not in P2P_KINDS else None for k in says]
    held = on_host & pd.notna(range_kind)
    ranges = events.loc[held, ["pid", "tid", "ts", "end"]].assign(kind=range_kind[held])
    if ranges.empty or kernels.empty:
        return kind
    launch = _launches(events).reindex(kernels["correlation"].to_numpy())
    for (pid, tid), r in ranges.groupby(["pid", "tid"], dropna=False, sort=False):
        here = ((launch["pid"] == pid) & (launch["tid"] == tid)).to_numpy()
        if not here.any():
            continue
        r = r.sort_values("ts")
        ts = launch["ts"].to_numpy()[here]
        # ranges nest but never overlap on one thread: the latest start before the launch holds it if any does
        idx = np.searchsorted(r["ts"].to_numpy(), ts, side="right") - 1
        reach = np.maximum.accumulate(r["end"].to_numpy())
        inside = (idx >= 0) & (ts <= reach[np.clip(idx, 0, None)])
        kind[np.flatnonzero(here)[inside]] = r["kind"].to_numpy()[idx[inside]]
    return kind


def gpu_collectives(events: pd.DataFrame) -> pd.DataFrame:
    """NCCL kernels (and serving engines' custom all-reduce kernels) with their kind, sizes and launch time.

    Every NCCL kernel is read, also `ncclDevKernel_Generic`, whose kind only its args give (`UNNAMED_NCCL`
    where they give none); SendRecv kernels are AllToAll when their args say so (`trace_names.kernel_kind`),
    and the collective of the c10d range they were launched in when there is one (`_launching_collective`)."""
    is_gpu = events["is_gpu"].to_numpy()
    names = [str(n) for n in events.loc[is_gpu, "name"].unique()]
    wanted = [n for n in names if is_nccl_kernel(n) or collective_kernel_kind(n) is not None]
    kernels = _text_names(events[is_gpu & events["name"].isin(wanted).to_numpy()])
    if kernels.empty:
        return kernels
    kernels["kind"] = [kernel_kind(n, c) or (UNNAMED_NCCL if is_nccl_kernel(n) else None)
                       for n, c in zip(kernels["name"], kernels["coll_name"])]
    p2p = kernels["kind"].isin(P2P_KINDS).to_numpy()
    if p2p.any():
        in_range = _launching_collective(events, kernels)
        named = p2p & pd.notna(in_range)
        kernels.loc[named, "kind"] = in_range[named]
    kernels = kernels[kernels["kind"].notna()]
    size = kernels["dtype"].map(dtype_bytes)
    kernels["in_bytes"] = pd.to_numeric(kernels["in_nelems"], errors="coerce") * size
    kernels["out_bytes"] = pd.to_numeric(kernels["out_nelems"], errors="coerce") * size
    kernels["host_ts"] = _launch_ts(events, kernels)
    kernels["source"] = kernels["name"].map(lambda n: "nccl kernel" if n.startswith("nccl") else "custom kernel")
    return kernels


def cpu_collectives(events: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """The CPU op that does each collective, from the most to the least informative source present."""
    gloo = _text_names(events[events["name"].str.match(GLOO_OP)])
    if not gloo.empty:
        gloo["kind"] = gloo["name"].str.replace("gloo:", "", regex=False).map(kind_of)
        source = "gloo op"
        chosen = gloo
    else:
        rpc = _text_names(events[(events["name"] == "record_param_comms") & events["coll_name"].notna()])
        if not rpc.empty:
            rpc["kind"] = rpc["coll_name"].astype(str).map(kind_of)
            source = "record_param_comms op"
            chosen = rpc
        else:
            c10d = _text_names(events[events["name"].str.match(C10D_OP)])
            c10d["kind"] = c10d["name"].str.replace("c10d::", "", regex=False).map(kind_of)
            source = "c10d op"
            chosen = c10d
    chosen = chosen[chosen["kind"].notna()].copy()
    if chosen.empty:
        return chosen
    has_nelems = pd.to_numeric(chosen["in_nelems"], errors="coerce").notna()
    size_from_dtype = chosen["dtype"].map(dtype_bytes)
    first_type = chosen["input_type"].map(lambda t: t[0] if isinstance(t, list) and t else None)
    size_from_type = first_type.map(dtype_bytes)
    elements = chosen["input_dims"].map(lambda d: numel(d[0]) if isinstance(d, list) and d else None)
    in_from_dims = pd.to_numeric(elements, errors="coerce") * size_from_type
    n = pd.to_numeric(chosen["group_size"], errors="coerce").fillna(world_size)
    out_from_dims = np.where(chosen["kind"] == "AllGather", in_from_dims * n,
                             np.where(chosen["kind"] == "ReduceScatter", in_from_dims / n, in_from_dims))
    chosen["in_bytes"] = np.where(has_nelems, pd.to_numeric(chosen["in_nelems"], errors="coerce") * size_from_dtype,
                                  in_from_dims)
    chosen["out_bytes"] = np.where(has_nelems, pd.to_numeric(chosen["out_nelems"], errors="coerce") * size_from_dtype,
                                   out_from_dims)
    chosen["host_ts"] = chosen["ts"]
    chosen["source"] = source
    return chosen


def nccl_host_calls(events: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per kind, the NCCL calls a rank's host enqueued (c10d's `nccl:*` ranges): count and bytes (from the
    range's `Input Dims` and `Input type`; 0 where it has none). On a trace without GPU activity these are all
    there is of the job's NCCL communication: the transfers ran on the GPU, outside the trace."""
    ranges = _text_names(events[~events["is_gpu"] & events["name"].str.match(NCCL_HOST_RANGE.pattern)])
    if ranges.empty:
        return {}
    ranges["kind"] = ranges["name"].str.replace("nccl:", "", regex=False).map(kind_of)
    ranges = ranges[ranges["kind"].notna()]
    elements = ranges["input_dims"].map(lambda d: numel(d[0]) if isinstance(d, list) and d else None)
    size = ranges["input_type"].map(lambda t: dtype_bytes(t[0]) if isinstance(t, list) and t else None)
    ranges["bytes"] = (pd.to_numeric(elements, errors="coerce") * pd.to_numeric(size, errors="coerce")).fillna(0)
    return {str(kind): {"count": int(len(g)), "bytes": int(g["bytes"].sum())} for kind, g in ranges.groupby("kind")}


RANK_COLUMNS = ["kind", "name", "ts", "dur", "end", "host_ts", "in_bytes", "out_bytes", "group_size", "pg_name",
                "pg_ranks", "source", "p2p_role", "p2p_peer"]
COLUMNS = ["rank", "kind", "name", "ts", "dur", "end", "host_ts", "in_bytes", "out_bytes", "bytes",
           "group_size", "group", "group_ranks", "source", "p2p_role", "p2p_peer"]


def rank_collectives(events: pd.DataFrame, has_gpu: bool, world_size: int) -> pd.DataFrame:
    """One rank's collectives with what `collective_events` needs: NCCL kernels on a rank with GPU kernels,
    the CPU ops otherwise (a run with any GPU rank reads the kernels only)."""
    df = gpu_collectives(events) if has_gpu else cpu_collectives(events, world_size)
    if df.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    nothing = [None] * len(df)
    sides = [p2p_side(*call) for call in zip(df["kind"], df.get("coll_name", nothing), df.get("p2p_src", nothing),
                                             df.get("p2p_dst", nothing))]
    df["p2p_role"] = [role for role, _ in sides]
    df["p2p_peer"] = pd.Series([peer for _, peer in sides], index=df.index, dtype=float)
    return df[RANK_COLUMNS].reset_index(drop=True)


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
    kept = [(rank, t.reduced.collectives) for rank, t in sorted(run.traces.items())
            if len(t.reduced.collectives) and t.has_gpu == (run.device == "gpu")]
    if not kept:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.concat([f for _, f in kept], ignore_index=True)
    df["rank"] = np.repeat([r for r, _ in kept], [len(f) for _, f in kept])
    sizes = np.maximum(df["in_bytes"].fillna(0).to_numpy(), df["out_bytes"].fillna(0).to_numpy())  # message_size
    df["bytes"] = pd.Series(sizes, index=df.index).fillna(0).astype("int64")
    everyone = tuple(range(run.world_size))
    df["group_ranks"] = _per_value(df["pg_ranks"], lambda v: _group_ranks(v) or everyone)
    df["group"] = _per_value(df["pg_name"], lambda g: str(g) if isinstance(g, str) and g else "world")
    df["group_size"] = pd.to_numeric(df["group_size"], errors="coerce")
    if df["group_size"].isna().any():
        df["group_size"] = df["group_size"].fillna(df["group_ranks"].map(len))
    df["group_size"] = df["group_size"].astype("int64")
    df["p2p_peer"] = pd.to_numeric(df["p2p_peer"], errors="coerce")
    df["p2p_role"] = df["p2p_role"].where(df["p2p_role"].isin(("send", "recv")), None)
    return df.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)[COLUMNS]


def rank_windows(run: LoadedRun, offsets: dict[int, ClockOffset]) -> dict[int, tuple[float, float]]:
    """Each rank's analysed window (`utilization`: the kernel span on GPU, the step ranges on CPU) on the
    aligned clock of `alignment.align`."""
    out = {}
    for r, t in run.traces.items():
        window = t.reduced.utilization.get("window_us") if t.has_gpu == (run.device == "gpu") else None
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
    coll = coll[inside].copy()
    hi = hi[inside]
    cut = coll["end"] > hi
    coll["dur"] = coll["dur"].where(~cut, hi - coll["ts"])  # the others' unchanged, to the bit
    coll["end"] = coll["end"].where(~cut, hi)
    if "wait_us" in coll and cut.any():
        coll.loc[cut, "wait_us"] = np.minimum(coll.loc[cut, "wait_us"], coll.loc[cut, "dur"])
        coll.loc[cut, "transfer_us"] = coll.loc[cut, "dur"] - coll.loc[cut, "wait_us"]
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
    the pair has ended. One sort over all ranks; only these pairs need `_overlap_union_us`."""
    if coll.empty:
        return []
    ordered = coll[["rank", "kind", "ts", "end"]].sort_values(["rank", "kind", "ts"], kind="stable")
    reach = ordered.groupby(["rank", "kind"], sort=False)["end"].cummax()
    earlier = reach.groupby([ordered["rank"], ordered["kind"]], sort=False).shift()
    hit = ordered.loc[ordered["ts"] < earlier, ["rank", "kind"]].drop_duplicates()
    return sorted(hit.itertuples(index=False, name=None))


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
    outside = coll.loc[~coll.index.isin(kept.index), "rank"]
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
