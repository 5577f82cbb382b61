"""One rank's collectives, from its events: which kind, how many bytes, when launched (part of its reduction).

On GPU traces a collective is an NCCL kernel (`ncclDevKernel_AllGather_RING_LL(...)`), whose args
carry the message sizes and the process group. CPU-only traces (gloo) have no kernels; there the
collective is the CPU-side op that does the work: `gloo:all_gather` on the gloo thread, else a
`record_param_comms` op with the same args as a kernel, else the `c10d::allgather_`-style op.
The run's pass over every rank's calls is `collectives`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dstrace.trace_names import (
    C10D_OP, GLOO_OP, LAUNCH_CATEGORIES, NCCL_HOST_RANGE, P2P_KINDS, UNNAMED_NCCL,
    collective_kernel_kind, dtype_bytes, is_nccl_kernel, kernel_kind, kind_of, numel, p2p_side,
)


def launch_ts(events: pd.DataFrame, kernels: pd.DataFrame) -> pd.Series:
    """Host time each of `kernels` (rows of `events`) was launched: its cuda_runtime/driver call, joined on
    correlation; its own ts where it has none."""
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
    kernels["host_ts"] = launch_ts(events, kernels)
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
