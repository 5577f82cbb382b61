"""One rank's trace reduced to what the run's analysis reads from it.

Everything here depends on one rank's events only: its collectives before cross-rank matching, its
step ranges, its ZeRO-3 gather ranges, where its GPU (or CPU) time went, what its host did while its
GPU sat idle, and HTA's breakdowns. It is computed where the rank is parsed (a worker process, with
only that rank's events in memory) and cached beside the trace, so the analysis of a run holds a few
small frames per rank instead of millions of events, and a second analysis never reads the events.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np
import pandas as pd

from dstrace.analysis import host, intervals, rank_collectives, utilization
from dstrace.analysis.results import HtaBreakdown
from dstrace.runfolder.range_names import ALLGATHER_RANGE, DSTRACE_STEP, PREFIX, range_label
from dstrace.trace_names import ACCELERATOR_CATEGORIES, GPU_HOST_CATEGORIES, PROFILER_STEP

STEP_SOURCES = (("dstrace/step ranges", DSTRACE_STEP.pattern), ("ProfilerStep ranges", PROFILER_STEP.pattern))
"""Where step ranges come from, most informative first: the run uses the first source any rank has."""
STEP_COLUMNS = ["source", "step", "ts", "end", "ms"]
GATHER_COLUMNS = ["ts", "bytes"]


@dataclass
class RankReduction:
    has_gpu: bool
    collectives: pd.DataFrame  # `rank_collectives.rank_collectives`: NCCL kernels on a GPU rank, CPU ops otherwise
    steps: pd.DataFrame  # STEP_COLUMNS, one row per step of each source the rank has
    gathers: pd.DataFrame  # GATHER_COLUMNS: the rank's dstrace/zero3.allgather host ranges
    utilization: dict  # `utilization.utilization` over the rank's GPU kernels, or its CPU work when it has none,
    # with `work_items`: how many kernels (CPU ops and collectives) it counted
    host_time: dict = field(default_factory=dict)  # `host.host_during_idle`, GPU ranks only
    hta: HtaBreakdown | None = None  # `hta_breakdown.rank_breakdowns`, GPU ranks only
    step_work: list = field(default_factory=list)  # `step_work`: per step, GPU kernel time and host work by name
    accelerator_events: dict = field(default_factory=dict)  # category -> events, of ACCELERATOR_CATEGORIES
    nccl_host_calls: dict = field(default_factory=dict)  # `rank_collectives.nccl_host_calls`, ranks without GPU activity
    gpu_host_events: dict = field(default_factory=dict)  # `gpu_host_events`, ranks without GPU activity

    def __post_init__(self) -> None:
        if isinstance(self.hta, dict):  # read from a file: `HtaBreakdown.stored`; TypeError when it is not that
            self.hta = HtaBreakdown.from_stored(self.hta)

    def plain(self) -> dict:
        """The fields but the frames, as JSON values: what a reduction's file holds beside the frames."""
        return {k: v.stored() if isinstance(v, HtaBreakdown) else v for k, v in vars(self).items()
                if not isinstance(v, pd.DataFrame)}


def accelerator_events(events: pd.DataFrame) -> dict[str, int]:
    """Events of each category an accelerator dstrace does not read writes (MTIA, HPU, MLU): the sign that
    the trace is not CPU-only even without a kernel."""
    counts = events.loc[events["cat"].isin(ACCELERATOR_CATEGORIES), "cat"].value_counts()
    return {str(c): int(n) for c, n in sorted(counts.items()) if n}  # a categorical counts its absent values too


def gpu_host_events(events: pd.DataFrame) -> dict[str, int]:
    """Events of each host category only a GPU job writes (GPU_HOST_CATEGORIES): on a rank without GPU activity,
    the sign that its device side was not traced."""
    counts = events.loc[events["cat"].isin(GPU_HOST_CATEGORIES), "cat"].value_counts()
    return {str(c): int(n) for c, n in sorted(counts.items()) if n}


def step_ranges(events: pd.DataFrame) -> pd.DataFrame:
    """Each source's steps: a step's time runs to the next step's start, the last one's to its own end."""
    frames = []
    candidates = events["cat"].isin(("user_annotation", "cpu_op"))
    for source, pattern in STEP_SOURCES:
        ev = events.loc[candidates & events["name"].str.match(pattern), ["name", "ts", "end", "dur"]]
        if ev.empty:
            continue
        df = ev[["ts", "end", "dur"]].copy()
        df["step"] = ev["name"].str.extract(pattern)[0].astype(int).to_numpy()
        df = df.sort_values("ts").drop_duplicates("step")
        next_start = df["ts"].shift(-1)
        df["ms"] = np.where(next_start.notna(), next_start - df["ts"], df["dur"]) / 1e3
        frames.append(df.assign(source=source)[STEP_COLUMNS])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=STEP_COLUMNS)


def gather_ranges(events: pd.DataFrame) -> pd.DataFrame:
    """ts and bytes of each ZeRO-3 all-gather range (host ranges only: Kineto repeats a range that encloses
    kernels as a gpu_user_annotation)."""
    ev = events[(events["cat"] == "user_annotation") & events["name"].str.match(ALLGATHER_RANGE)]
    sizes = ev["name"].str.extract(ALLGATHER_RANGE)[0].astype("int64")
    return pd.DataFrame({"ts": ev["ts"].to_numpy(), "bytes": sizes.to_numpy()}, columns=GATHER_COLUMNS)


STEP_WORK_ITEMS = 64
"""Host items and kernel names kept per step: enough to name what grew between steps, small enough to cache."""
COMPILE_TIMER = " (dynamo_timed)"
"""How torch.compile names the ranges its own timers write (`_compile.compile_inner (dynamo_timed)`: Dynamo
tracing a frame and the backend compiling it). They run inside the op that called the compiled code, so the
outermost CPU ops alone show a recompiling step only as a slower `Torch-Compiled Region`."""


def compile_work(events: pd.DataFrame) -> pd.DataFrame:
    """The outermost of torch.compile's timed ranges (COMPILE_TIMER): the compile work of each step."""
    timed = events["cat"].isin(("cpu_op", "user_annotation")) & events["name"].str.endswith(COMPILE_TIMER)
    return intervals.top_level(events.loc[timed, ["name", "pid", "tid", "ts", "dur", "end"]])


def step_work(events: pd.DataFrame, steps: pd.DataFrame, ranges: pd.DataFrame, ops: pd.DataFrame) -> list[dict]:
    """Per step of the rank's first step source: `gpu_us` (kernel time launched in it) and `host_us` (the
    time of each outermost CPU op, each dstrace range kind and torch.compile's outermost compile ranges inside
    it, largest first): what a step-time shift compares before and after the change."""
    if steps.empty or events.empty:
        return []
    first = steps[steps["source"] == steps["source"].iloc[0]].sort_values("ts")
    starts, ends = first["ts"].to_numpy(), (first["ts"] + first["ms"] * 1e3).to_numpy()
    kernels = events.loc[events["is_gpu"], ["name", "ts", "dur"]]
    parts = [pd.DataFrame({"name": ops["name"], "ts": ops["ts"], "dur": ops["dur"]}),
             pd.DataFrame({"name": PREFIX + ranges["name"].astype(str).map(range_label),
                           "ts": ranges["ts"], "dur": ranges["dur"]}),
             compile_work(events)[["name", "ts", "dur"]]]
    # an empty part is left out: pandas 2 ignores its dtypes and pandas 3 would not, so both give the same frame
    host_items = pd.concat([part for part in parts if len(part)] or parts[:1], ignore_index=True)

    def step_of(ts: pd.Series) -> np.ndarray:
        idx = np.searchsorted(starts, ts.to_numpy(), side="right") - 1
        ok = (idx >= 0) & (ts.to_numpy() < ends[np.clip(idx, 0, None)])
        return np.where(ok, idx, -1)

    gpu = pd.Series(kernels["dur"].to_numpy()).groupby(step_of(kernels["ts"])).sum() if len(kernels) else pd.Series(dtype=float)

    def tops_of(items: pd.DataFrame) -> dict[int, dict[str, float]]:
        """Each step's largest items by name (ties in name order), STEP_WORK_ITEMS of them."""
        items = items.assign(i=step_of(items["ts"]) if len(items) else [])
        flat = items[items["i"] >= 0].groupby(["i", "name"], observed=True)["dur"].sum().reset_index()
        flat = flat.iloc[np.lexsort((-flat["dur"].to_numpy(), flat["i"].to_numpy()))]
        flat = flat[flat.groupby("i").cumcount().to_numpy() < STEP_WORK_ITEMS]
        tops: dict[int, dict[str, float]] = {}
        for i, name, dur in zip(flat["i"].tolist(), flat["name"].tolist(), flat["dur"].tolist()):
            tops.setdefault(i, {})[str(name)] = float(dur)
        return tops

    host_tops = tops_of(host_items)
    kernel_tops = tops_of(kernels.assign(name=kernels["name"].astype(str))) if len(kernels) else {}
    return [{"step": int(step), "gpu_us": float(gpu.get(i, 0.0)), "host_us": host_tops.get(i, {}),
             "kernels_us": kernel_tops.get(i, {})}
            for i, step in enumerate(first["step"].astype(int))]


def _own_window(steps: pd.DataFrame) -> tuple[float, float] | None:
    """The span of the rank's steps from the first source it has: the CPU busy-time window."""
    if steps.empty:
        return None
    first = steps[steps["source"] == steps["source"].iloc[0]]
    return float(first["ts"].min()), float(first["end"].max())


def reduce_rank(events: pd.DataFrame, world_size: int, hta: HtaBreakdown | None = None) -> RankReduction:
    """The rank's reduction, with its HTA breakdowns `hta` (`hta_breakdown.rank_breakdowns`) when it has GPU
    work."""
    has_gpu = bool(events["is_gpu"].any()) if len(events) else False
    coll = rank_collectives.rank_collectives(events, has_gpu, world_size)
    steps = step_ranges(events)
    work = host.host_work(events)
    if has_gpu:
        util = utilization.utilization(events, coll, "gpu")
        host_time = host.host_during_idle(events, *work)
        items = int(events["is_gpu"].sum())
    else:
        util = utilization.utilization(events, coll, "cpu", _own_window(steps))
        host_time = {}
        items = len(work[1]) + len(coll)
    util = {**util, "work_items": items}  # how many events the span's shares describe
    reduced = RankReduction(has_gpu=has_gpu, collectives=coll, steps=steps, gathers=gather_ranges(events),
                            utilization=util, host_time=host_time, step_work=step_work(events, steps, *work),
                            accelerator_events=accelerator_events(events),
                            nccl_host_calls={} if has_gpu else rank_collectives.nccl_host_calls(events),
                            gpu_host_events={} if has_gpu else gpu_host_events(events),
                            hta=hta if has_gpu else None)
    return reduced
