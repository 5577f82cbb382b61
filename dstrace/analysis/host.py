"""Host-bound detection: is the GPU idle because the host has not launched the next kernel yet?

HTA classifies each gap before a kernel: host wait when the kernel's launch call started after the
previous kernel had finished. Where the host spent those gaps is read from the ranges active on the
host while the GPU was idle: dstrace ranges (e.g. `dstrace/zero3.fetch <Module>#<id>`, the ZeRO-3
fetch hooks) and the outermost CPU ops.
"""
from __future__ import annotations

import re

import pandas as pd

from dstrace.analysis import intervals

TOP_HOST_ITEMS = 6
"""How many ranges / CPU ops to name: enough to see the pattern, few enough to paste into an issue."""
WHOLE_CALL_RANGES = re.compile(r"^dstrace/(?:step#\d+|generate|chat)$")


def range_label(name: str) -> str:
    """`dstrace/zero3.fetch LlamaDecoderLayer#12` -> `zero3.fetch LlamaDecoderLayer`; sizes and ids dropped
    (also `#?`, the id of a parameter DeepSpeed had not numbered)."""
    label = re.sub(r"#[^#\s]*$", "", name.removeprefix("dstrace/"))
    return re.sub(r"\s*bytes=\d+", "", label)


def gpu_idle(events: pd.DataFrame) -> pd.DataFrame:
    k = events.loc[events["is_gpu"], ["ts", "end"]]
    return intervals.gaps(intervals.merge(k["ts"], k["end"]))


def host_work(ev: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the host did: dstrace's ranges (name, ts, dur, end; the whole-call ones left out) and the outermost
    CPU ops. Found once per rank: the idle-time attribution and each step's work read both."""
    ranges = ev.loc[(ev["cat"] == "user_annotation") & ev["name"].str.startswith("dstrace/")
                    & ~ev["name"].str.match(WHOLE_CALL_RANGES), ["name", "ts", "dur", "end"]]
    ops = intervals.top_level(ev.loc[ev["cat"] == "cpu_op", ["name", "pid", "tid", "ts", "dur", "end"]])
    return ranges, ops


def host_during_idle(ev: pd.DataFrame, ranges: pd.DataFrame, ops: pd.DataFrame) -> dict:
    """GPU idle time per host range kind and per outermost CPU op overlapping it (`host_work`), largest first."""
    idle = gpu_idle(ev)
    out = {"gpu_idle_us": intervals.total(idle), "in_dstrace_ranges": {}, "top_cpu_ops": {}}
    if idle.empty:
        return out
    if len(ranges):
        overlap = pd.Series(intervals.covered(idle, ranges["ts"], ranges["end"]), index=ranges.index)
        by_label = overlap.groupby(ranges["name"].map(range_label).astype(str)).sum().sort_values(ascending=False)
        out["in_dstrace_ranges"] = {k: float(v) for k, v in by_label.head(TOP_HOST_ITEMS).items() if v > 0}
    if len(ops):
        overlap = pd.Series(intervals.covered(idle, ops["ts"], ops["end"]), index=ops.index)
        by_name = overlap.groupby(ops["name"]).sum().sort_values(ascending=False)
        out["top_cpu_ops"] = {k: float(v) for k, v in by_name.head(TOP_HOST_ITEMS).items() if v > 0}
    return out


def host_wait_share(hta_rank: dict) -> float | None:
    """Share of the GPU's idle time (all streams) that HTA attributes to waiting for the host."""
    causes = hta_rank.get("idle_causes_us")
    if not causes:
        return None
    total = sum(causes.values())
    return causes.get("host_wait", 0.0) / total if total > 0 else None
