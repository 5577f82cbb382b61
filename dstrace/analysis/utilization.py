"""Where each rank's time goes: span, idle, and busy time by kind (compute, communication, memory).

GPU runs: unions of GPU kernel intervals per kind, classified like HTA (`hta.utils.get_kernel_type`),
over the span from the first kernel start to the last kernel end (HTA's temporal span). CPU-only
runs: collectives are the gloo/c10d ops, compute is the outermost other CPU ops, over the span of the
step ranges (or of all events). Unions, so overlapping streams or threads are never counted twice.
"""
from __future__ import annotations

import pandas as pd

from dstrace.analysis import intervals
from dstrace.trace_names import CPU_NON_COMPUTE, collective_kernel_kind

BUSY_KINDS = ("compute", "communication", "memory")
HTA_KIND = {"COMPUTATION": "compute", "COMMUNICATION": "communication", "MEMORY": "memory", "OTHER": "compute"}


def gpu_kernels(events: pd.DataFrame) -> pd.DataFrame:
    from hta.utils.utils import get_kernel_type

    k = events.loc[events["is_gpu"], ["name", "ts", "end", "device"]].copy()
    kinds = {n: "communication" if collective_kernel_kind(str(n)) else HTA_KIND[get_kernel_type(str(n))]
             for n in k["name"].unique()}
    k["kind"] = k["name"].map(kinds)
    return k


def cpu_work(events: pd.DataFrame, coll: pd.DataFrame) -> pd.DataFrame:
    """CPU-only traces: collectives as 'communication', outermost other CPU ops as 'compute'."""
    ops = events.loc[(events["cat"] == "cpu_op") & ~events["name"].str.match(CPU_NON_COMPUTE.pattern),
                     ["pid", "tid", "ts", "dur", "end"]]
    compute = intervals.top_level(ops)[["ts", "end"]].assign(kind="compute")
    comm = coll[["ts", "end"]].assign(kind="communication")
    return pd.concat([compute, comm], ignore_index=True)


def idle_rank() -> dict:
    """The utilization of a rank with nothing to count (a rank without GPU kernels in a GPU run)."""
    return {"span_us": 0.0, "idle_us": 0.0, "busy_us": {k: 0.0 for k in BUSY_KINDS}, "exposed_comm_us": 0.0}


def utilization(events: pd.DataFrame, coll: pd.DataFrame, device: str,
                window: tuple[float, float] | None = None) -> dict:
    """One rank's span_us, idle_us, busy_us by kind, exposed_comm_us, and per-GPU busy/idle when several
    GPUs. `coll`: the rank's collectives (CPU runs count them as communication)."""
    work = gpu_kernels(events) if device == "gpu" else cpu_work(events, coll)
    if window is None and len(work):
        window = (float(work["ts"].min()), float(work["end"].max()))
    if window is None or work.empty:
        return idle_rank()
    lo, hi = window
    work = work.assign(ts=work["ts"].clip(lo, hi), end=work["end"].clip(lo, hi))
    unions = {k: intervals.merge(work.loc[work["kind"] == k, "ts"], work.loc[work["kind"] == k, "end"])
              for k in BUSY_KINDS}
    everything = intervals.merge(work["ts"], work["end"])
    span = hi - lo
    comm = unions["communication"]
    exposed = intervals.total(comm) - intervals.intersection_total(unions["compute"], comm)
    out = {"span_us": span, "idle_us": span - intervals.total(everything),
           "busy_us": {k: intervals.total(u) for k, u in unions.items()}, "exposed_comm_us": exposed}
    if device == "gpu" and work["device"].nunique() > 1:
        out["devices"] = {}
        for dev, g in work.groupby("device"):
            busy = intervals.total(intervals.merge(g["ts"], g["end"]))
            out["devices"][str(int(dev))] = {"busy_us": busy, "idle_us": span - busy}
    return out
