"""Collectives per rank: which kind, how many bytes, how long, what bandwidth.

On GPU traces a collective is an NCCL kernel (`ncclDevKernel_AllGather_RING_LL(...)`), whose args
carry the message sizes and the process group. CPU-only traces (gloo) have no kernels; there the
collective is the CPU-side op that does the work: `gloo:all_gather` on the gloo thread, else a
`record_param_comms` op with the same args as a kernel, else the `c10d::allgather_`-style op.
Bandwidths follow nccl-tests: algbw = size / time, busbw = algbw * factor(kind, n).
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from dstrace.analysis.model import CollectiveStats, LoadedRun

NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
GLOO_OP = re.compile(r"^gloo:(\w+)")
C10D_OP = re.compile(r"^c10d::(\w+)")

# Canonical kind for a normalised op name (lower case, letters only), first prefix that matches wins.
KIND_PREFIXES = (
    ("allgather", "AllGather"), ("reducescatter", "ReduceScatter"), ("allreduce", "AllReduce"),
    ("alltoall", "AllToAll"), ("broadcast", "Broadcast"), ("reduce", "Reduce"), ("gather", "Gather"),
    ("scatter", "Scatter"), ("sendrecv", "SendRecv"), ("send", "Send"), ("recv", "Recv"), ("barrier", "Barrier"),
)
# c10d ops that are not a collective themselves (waiting on one, or bookkeeping).
NOT_COLLECTIVES = frozenset({"wait", "waitall", "monitoredbarrier"})

DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4,
    "double": 8, "float64": 8, "long": 8, "longint": 8, "int64": 8, "uint64": 8, "complexfloat": 8,
    "complexdouble": 16,
    "bfloat16": 2, "half": 2, "float16": 2, "short": 2, "shortint": 2, "int16": 2, "uint16": 2,
    "byte": 1, "char": 1, "bool": 1, "uint8": 1, "int8": 1, "unsignedchar": 1, "signedchar": 1,
    "float8e4m3fn": 1, "float8e5m2": 1, "float8e4m3fnuz": 1, "float8e5m2fnuz": 1,
}


def dtype_bytes(dtype) -> int | None:
    """Element size of a dtype as traces spell it: "BFloat16", "c10::BFloat16", "float", "long int"."""
    if not isinstance(dtype, str):
        return None
    key = re.sub(r"[^a-z0-9]", "", dtype.lower().replace("c10::", "").replace("torch.", ""))
    return DTYPE_BYTES.get(key)


def kind_of(name: str) -> str | None:
    """Canonical CamelCase kind (AllGather, AllReduce, ...) of an NCCL kernel or a CPU collective op name."""
    m = NCCL_KERNEL.match(name)
    if m and m.group(1) not in ("Generic",):
        return m.group(1)
    key = re.sub(r"[^a-z]", "", name.lower().split("(")[0].replace("nccl", ""))
    if key in NOT_COLLECTIVES:
        return None
    for prefix, kind in KIND_PREFIXES:
        if key.startswith(prefix):
            return kind
    return None


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests bus bandwidth factor: what each rank's link must carry relative to the message size."""
    if n <= 1:
        return 0.0
    if kind == "AllReduce":
        return 2 * (n - 1) / n
    if kind in ("AllGather", "ReduceScatter", "AllToAll", "Gather", "Scatter"):
        return (n - 1) / n
    return 1.0


def _parse_ranks(value) -> tuple[int, ...] | None:
    """`Process Group Ranks` is a string like "[0, 1]"; Kineto truncates long lists with "...": unusable."""
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    if not isinstance(value, str) or "..." in value:
        return None
    nums = re.findall(r"-?\d+", value)
    return tuple(int(v) for v in nums) if nums else None


def _numel(dims) -> int | None:
    if not isinstance(dims, list) or not dims:
        return None
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    if all(isinstance(d, list) for d in dims):  # a TensorList
        parts = [_numel(d) for d in dims]
        return sum(p for p in parts if p) if parts else None
    return None


def message_size(in_bytes: float, out_bytes: float) -> float:
    """The nccl-tests "size" of a collective: the larger of the send and receive buffers (AllGather: the
    gathered output; ReduceScatter: the full input; AllReduce/Broadcast: the buffer)."""
    return max(in_bytes, out_bytes)


def _launch_ts(events: pd.DataFrame, kernels: pd.DataFrame) -> pd.Series:
    """Host time each kernel was launched (its cuda_runtime/driver call, joined on correlation)."""
    launches = events[events["cat"].isin(("cuda_runtime", "cuda_driver", "Runtime", "Driver"))
                      & events["correlation"].notna()]
    launch = launches.drop_duplicates("correlation").set_index("correlation")["ts"]
    return kernels["correlation"].map(launch).fillna(kernels["ts"])


def gpu_collectives(events: pd.DataFrame) -> pd.DataFrame:
    kernels = events[events["is_gpu"] & events["name"].str.startswith("nccl")].copy()
    if kernels.empty:
        return kernels
    kernels["kind"] = [kind_of(n) or kind_of(str(c or "")) for n, c in zip(kernels["name"], kernels["coll_name"])]
    kernels = kernels[kernels["kind"].notna()]
    size = kernels["dtype"].map(dtype_bytes)
    kernels["in_bytes"] = pd.to_numeric(kernels["in_nelems"], errors="coerce") * size
    kernels["out_bytes"] = pd.to_numeric(kernels["out_nelems"], errors="coerce") * size
    kernels["host_ts"] = _launch_ts(events, kernels)
    kernels["source"] = "nccl kernel"
    return kernels


def cpu_collectives(events: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """The CPU op that does each collective, from the most to the least informative source present."""
    gloo = events[events["name"].str.match(GLOO_OP)].copy()
    if not gloo.empty:
        gloo["kind"] = gloo["name"].str.replace("gloo:", "", regex=False).map(kind_of)
        source = "gloo op"
        chosen = gloo
    else:
        rpc = events[(events["name"] == "record_param_comms") & events["coll_name"].notna()].copy()
        if not rpc.empty:
            rpc["kind"] = rpc["coll_name"].astype(str).map(kind_of)
            source = "record_param_comms op"
            chosen = rpc
        else:
            c10d = events[events["name"].str.match(C10D_OP)].copy()
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
    numel = chosen["input_dims"].map(lambda d: _numel(d[0]) if isinstance(d, list) and d else None)
    numel = pd.to_numeric(numel, errors="coerce")
    in_from_dims = numel * size_from_type
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


def collective_events(run: LoadedRun) -> pd.DataFrame:
    """All ranks' collectives, one row each: rank, kind, ts, dur, end, host_ts, bytes, group, group_ranks."""
    frames = []
    for rank, trace in sorted(run.traces.items()):
        if run.device == "gpu":
            df = gpu_collectives(trace.events)
        else:
            df = cpu_collectives(trace.events, run.world_size)
        if df.empty:
            continue
        df = df.assign(rank=rank)
        frames.append(df)
    columns = ["rank", "kind", "name", "ts", "dur", "end", "host_ts", "in_bytes", "out_bytes", "bytes",
               "group_size", "group", "group_ranks", "source"]
    if not frames:
        return pd.DataFrame(columns=columns)
    df = pd.concat(frames, ignore_index=True)
    df["bytes"] = [message_size(i, o) for i, o in zip(df["in_bytes"].fillna(0), df["out_bytes"].fillna(0))]
    df["bytes"] = df["bytes"].fillna(0).astype("int64")
    ranks = df["pg_ranks"].map(_parse_ranks)
    everyone = tuple(range(run.world_size))
    df["group_ranks"] = [r if r else everyone for r in ranks]
    df["group"] = [str(g) if isinstance(g, str) and g else "world" for g in df["pg_name"]]
    df["group_size"] = pd.to_numeric(df["group_size"], errors="coerce")
    df["group_size"] = df["group_size"].fillna(df["group_ranks"].map(len)).astype("int64")
    return df.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)[columns]


def collective_stats(coll: pd.DataFrame) -> dict[int, dict[str, CollectiveStats]]:
    """Per rank and kind: count, bytes, time, and the nccl-tests bandwidths. Needs wait_us/transfer_us."""
    out: dict[int, dict[str, CollectiveStats]] = {}
    if coll.empty:
        return out
    grouped = coll.groupby(["rank", "kind"]).agg(
        count=("dur", "size"), bytes=("bytes", "sum"), kernel_us=("dur", "sum"),
        wait_us=("wait_us", "sum"), transfer_us=("transfer_us", "sum"), group_size=("group_size", "max"))
    for (rank, kind), row in grouped.iterrows():
        algbw = row["bytes"] / row["kernel_us"] / 1e3 if row["kernel_us"] > 0 else 0.0
        transfer_bw = row["bytes"] / row["transfer_us"] / 1e3 if row["transfer_us"] > 0 else 0.0
        factor = busbw_factor(kind, int(row["group_size"]))
        out.setdefault(int(rank), {})[kind] = CollectiveStats(
            count=int(row["count"]), bytes=int(row["bytes"]), kernel_us=float(row["kernel_us"]),
            wait_us=float(row["wait_us"]), transfer_us=float(row["transfer_us"]),
            algbw_GBps=float(algbw), busbw_GBps=float(algbw * factor),
            busbw_transfer_GBps=float(transfer_bw * factor), group_size=int(row["group_size"]))
    return out
