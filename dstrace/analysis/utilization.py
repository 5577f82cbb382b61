"""Where each rank's time goes: span, idle, and busy time by kind (compute, communication, memory).

GPU runs: unions of GPU kernel intervals per kind, classified like HTA (`hta.utils.get_kernel_type`),
except that every kernel of a communication library (`trace_names.comm_library`: NCCL, DeepEP, custom
all-reduce, MSCCL++, NVSHMEM) is communication where HTA calls it compute; each library's communication
time is kept as well (`comm_libraries_us`). The span runs from the first kernel start to the last kernel
end (HTA's temporal span). CPU-only runs: collectives are the gloo/c10d ops, compute is the outermost other
CPU ops, over the span of the step ranges (or of all events). Unions, so overlapping streams or threads are never counted twice.
"""
from __future__ import annotations

import pandas as pd

from dstrace.analysis import intervals
from dstrace.rankset import ranks_text
from dstrace.trace_names import CPU_NON_COMPUTE, UNMATCHED_COMM_LIBRARIES, comm_library

BUSY_KINDS = ("compute", "communication", "memory")
HTA_KIND = {"COMPUTATION": "compute", "COMMUNICATION": "communication", "MEMORY": "memory", "OTHER": "compute"}


def gpu_kernels(events: pd.DataFrame) -> pd.DataFrame:
    from hta.utils.utils import get_kernel_type

    k = events.loc[events["is_gpu"], ["name", "ts", "end", "device"]].copy()
    libraries = {n: comm_library(str(n)) for n in k["name"].unique()}
    kinds = {n: "communication" if library else HTA_KIND[get_kernel_type(str(n))] for n, library in libraries.items()}
    k["kind"] = k["name"].map(kinds)
    k["library"] = k["name"].map(libraries).astype(object)
    return k


def cpu_work(events: pd.DataFrame, coll: pd.DataFrame) -> pd.DataFrame:
    """CPU-only traces: collectives as 'communication', outermost other CPU ops as 'compute'."""
    ops = events.loc[(events["cat"] == "cpu_op") & ~events["name"].str.match(CPU_NON_COMPUTE.pattern),
                     ["pid", "tid", "ts", "dur", "end"]]
    compute = intervals.top_level(ops)[["ts", "end"]].assign(kind="compute")
    comm = coll[["ts", "end"]].assign(kind="communication")
    # an empty part is left out: pandas 2 ignores its dtypes and pandas 3 would not, so both give the same frame
    return pd.concat([part for part in (compute, comm) if len(part)] or [compute], ignore_index=True)


def idle_rank() -> dict:
    """The utilization of a rank with nothing to count (a rank without GPU kernels in a GPU run)."""
    return {"span_us": 0.0, "idle_us": 0.0, "busy_us": {k: 0.0 for k in BUSY_KINDS}, "exposed_comm_us": 0.0}


def utilization(events: pd.DataFrame, coll: pd.DataFrame, device: str,
                window: tuple[float, float] | None = None) -> dict:
    """One rank's span_us, idle_us, busy_us by kind, exposed_comm_us, the window they are measured over
    (`window_us`, the rank's own clock), and per-GPU busy/idle when several GPUs. `coll`: the rank's
    collectives (CPU runs count them as communication)."""
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
           "busy_us": {k: intervals.total(u) for k, u in unions.items()}, "exposed_comm_us": exposed,
           "window_us": [float(lo), float(hi)]}
    if "library" in work:
        out["comm_libraries_us"] = {str(lib): intervals.total(intervals.merge(g["ts"], g["end"]))
                                    for lib, g in work.groupby("library")}
    if device == "gpu" and work["device"].nunique() > 1:
        out["devices"] = {}
        for dev, g in work.groupby("device"):
            busy = intervals.total(intervals.merge(g["ts"], g["end"]))
            out["devices"][str(int(dev))] = {"busy_us": busy, "idle_us": span - busy}
    return out


def library_note(per_rank: dict[int, dict[str, float]]) -> str | None:
    """One line on the communication kernels dstrace counts as communication but does not match as
    collectives (`UNMATCHED_COMM_LIBRARIES`): which library, on which ranks, how much time."""
    parts = []
    for library in UNMATCHED_COMM_LIBRARIES:
        times = {r: us for r, libs in per_rank.items() for lib, us in libs.items() if lib == library and us > 0}
        if not times:
            continue
        low, high = f"{min(times.values()) / 1e3:.1f}", f"{max(times.values()) / 1e3:.1f}"
        amount = (f"{high} ms" if len(times) == 1 else f"{high} ms each" if low == high
                  else f"{low} to {high} ms per rank")
        parts.append(f"{library} kernels on {ranks_text(set(times))}: {amount}")
    if not parts:
        return None
    return ("communication kernels of other libraries than NCCL, counted as communication time but not matched "
            "across ranks as collectives (no wait/transfer split, sizes or bandwidth): " + "; ".join(parts))
