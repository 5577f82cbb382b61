"""Host-bound detection: is the GPU idle because the host has not launched the next kernel yet?

Each gap in the GPU's own busy time (kernels of all its streams merged) ends when a kernel starts; the part
of the gap before that kernel's launch call started is host wait: the GPU had nothing to run because the
host had not asked yet. (HTA's idle causes answer a different question: they are summed over streams, so
they can exceed the GPU's idle time or fall far below it, and are shown only as HTA's.) Where the host
spent those gaps is read from the ranges active on the host while the GPU was idle: dstrace ranges (e.g.
`dstrace/zero3.fetch <Module>#<id>`, the ZeRO-3 fetch hooks) and the outermost CPU ops.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dstrace.analysis import intervals
from dstrace.runfolder.range_names import PREFIX, WHOLE_CALL_RANGES, range_label
from dstrace.trace_names import LAUNCH_CATEGORIES

TOP_HOST_ITEMS = 6
"""How many ranges / CPU ops to name: enough to see the pattern, few enough to paste into an issue."""
def gpu_idle(events: pd.DataFrame) -> pd.DataFrame:
    k = events.loc[events["is_gpu"], ["ts", "end"]]
    return intervals.gaps(intervals.merge(k["ts"], k["end"]))


def host_wait(events: pd.DataFrame, idle: pd.DataFrame) -> float:
    """GPU idle time before the launch call of the kernel that ends each gap (`gpu_idle`): the time the GPU
    waited for the host. A kernel whose launch call is not in the trace adds nothing: its wait is unknown."""
    if idle.empty:
        return 0.0
    kernels = events.loc[events["is_gpu"], ["ts", "correlation"]]
    launches = events.loc[events["cat"].isin(LAUNCH_CATEGORIES) & events["correlation"].notna(), ["correlation", "ts"]]
    launch_at = launches.drop_duplicates("correlation").set_index("correlation")["ts"]
    launched = pd.Series(kernels["correlation"].map(launch_at).to_numpy(dtype=float), index=kernels["ts"].to_numpy())
    first = launched.groupby(level=0).min()  # several kernels starting at once: the earliest launch ends the wait
    at = first.reindex(idle["end"].to_numpy()).to_numpy()
    start, end = idle["ts"].to_numpy(), idle["end"].to_numpy()
    waited = np.clip(np.nan_to_num(at, nan=-np.inf), start, end) - start
    return float(waited.sum())


def host_work(ev: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the host did: dstrace's ranges (name, ts, dur, end; the whole-call ones left out) and the outermost
    CPU ops. Found once per rank: the idle-time attribution and each step's work read both."""
    ranges = ev.loc[(ev["cat"] == "user_annotation") & ev["name"].str.startswith(PREFIX)
                    & ~ev["name"].str.match(WHOLE_CALL_RANGES), ["name", "ts", "dur", "end"]]
    ops = intervals.top_level(ev.loc[ev["cat"] == "cpu_op", ["name", "pid", "tid", "ts", "dur", "end"]])
    return ranges, ops


def _overlap_by_name(idle: pd.DataFrame, items: pd.DataFrame, names: pd.Series) -> dict[str, float]:
    """GPU idle time each name's events overlap, the TOP_HOST_ITEMS largest."""
    if not len(items):
        return {}
    overlap = pd.Series(intervals.covered(idle, items["ts"], items["end"]), index=items.index)
    by_name = overlap.groupby(names.astype(str).to_numpy()).sum().sort_values(ascending=False)
    return {str(k): float(v) for k, v in by_name.head(TOP_HOST_ITEMS).items() if v > 0}


FIRST_CALL_RATIO = 10.0
"""An op's first call in the window counts as one-time work (initialisation, a plan being built) when it takes
over 10x the median of its later calls: steady calls of one op vary by well under that."""
FIRST_CALL_MIN_US = 1_000.0
"""...and at least 1 ms more than that median: below it, a first call's extra time changes no figure."""


def first_calls(ops: pd.DataFrame, idle: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Outermost CPU ops whose first call in the window is an outlier (FIRST_CALL_RATIO): name -> its first
    call's ts, dur, extra time over the median of its later calls and the GPU idle time (`idle`) it overlaps,
    largest extra first."""
    if len(ops) < 3:
        return {}
    ordered = ops.assign(name=ops["name"].astype(str)).sort_values("ts", kind="stable")
    out = {}
    for name, g in ordered.groupby("name", sort=False):
        if len(g) < 3:
            continue
        first, rest = float(g["dur"].iloc[0]), float(g["dur"].iloc[1:].median())
        if first >= FIRST_CALL_RATIO * rest and first - rest >= FIRST_CALL_MIN_US:
            ts = float(g["ts"].iloc[0])
            out[str(name)] = {"ts": ts, "dur_us": first, "extra_us": first - rest,
                              "idle_us": float(intervals.covered(idle, [ts], [ts + first])[0])}
    top = sorted(out.items(), key=lambda kv: -kv[1]["extra_us"])[:TOP_HOST_ITEMS]
    return dict(top)


CAPTURE_BEGIN = re.compile(r"^(?:cuda|hip)StreamBeginCapture")
CAPTURE_END = re.compile(r"^(?:cuda|hip)StreamEndCapture")


def graph_capture(ev: pd.DataFrame, idle: pd.DataFrame) -> dict[str, float]:
    """GPU idle time inside CUDA/HIP graph capture (each BeginCapture call to the next EndCapture call on its
    thread): kernels launched while a stream captures are recorded into the graph, not run, so the GPU idles
    however fast the host is. {"cudaStreamBeginCapture to cudaStreamEndCapture": us}, {} without capture."""
    calls = ev.loc[ev["cat"].isin(LAUNCH_CATEGORIES), ["name", "pid", "tid", "ts", "end"]]
    names = calls["name"].astype(str)
    begin, end = names.str.match(CAPTURE_BEGIN), names.str.match(CAPTURE_END)
    if idle.empty or not begin.any() or not end.any():
        return {}
    starts, ends, label = [], [], None
    for _, g in calls[begin | end].assign(is_begin=begin[begin | end]).sort_values("ts").groupby(["pid", "tid"]):
        opened = None
        for ts, stop, is_begin, name in zip(g["ts"], g["end"], g["is_begin"], g["name"].astype(str)):
            if is_begin:
                opened = ts if opened is None else opened
                label = label or f"{name} to {name.replace('BeginCapture', 'EndCapture')}"
            elif opened is not None:
                starts.append(opened)
                ends.append(stop)
                opened = None
    us = intervals.intersection_total(idle, intervals.merge(starts, ends)) if starts else 0.0
    return {label: us} if us > 0 else {}


def host_during_idle(ev: pd.DataFrame, ranges: pd.DataFrame, ops: pd.DataFrame) -> dict:
    """GPU idle time per host range kind, per outermost CPU op, per runtime call (launches, copies,
    synchronisation, module loads) and per other user range (`enumerate(DataLoader)...`) overlapping it,
    largest first; the ops whose first call is one-time work (`first_calls`); and, where the trace captures a
    CUDA graph, the idle time inside the capture (`graph_capture`)."""
    idle = gpu_idle(ev)
    out = {"gpu_idle_us": intervals.total(idle), "host_wait_us": host_wait(ev, idle), "in_dstrace_ranges": {},
           "top_cpu_ops": {}, "runtime_calls": {}, "user_ranges": {}, "first_calls": first_calls(ops, idle)}
    if idle.empty:
        return out
    if len(ranges):
        out["in_dstrace_ranges"] = _overlap_by_name(idle, ranges, ranges["name"].astype(str).map(range_label))
        zero3 = ranges[ranges["name"].str.startswith("dstrace/zero3.")]
        hooks = intervals.merge(zero3["ts"], zero3["end"])
        out["zero3_hooks_us"] = intervals.intersection_total(idle, hooks)  # nested fetch/allgather counted once
    out["top_cpu_ops"] = _overlap_by_name(idle, ops, ops["name"])
    calls = ev.loc[ev["cat"].isin(LAUNCH_CATEGORIES), ["name", "ts", "end"]]
    out["runtime_calls"] = _overlap_by_name(idle, calls, calls["name"])
    user = ev.loc[(ev["cat"] == "user_annotation") & ~ev["name"].str.startswith(PREFIX)
                  & ~ev["name"].str.startswith("ProfilerStep#"), ["name", "ts", "end"]]
    out["user_ranges"] = _overlap_by_name(idle, user, user["name"])
    if capture := graph_capture(ev, idle):
        out["graph_capture"] = capture
    return out
