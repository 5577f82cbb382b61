"""The standard per-rank GPU breakdowns, computed by HTA (holistictraceanalysis 0.5.0).

HTA gives temporal (idle / compute / non-compute), kernel-type totals, communication-computation
overlap and idle-time causes (host wait, kernel-launch gaps, other). Its critical-path and
frequent-sequence analyses fail on pandas 3 and are not used. HTA is handed our rank -> file map,
so its `"rank": N` text match (which defaults to rank 0) is never used. It logs plenty: silenced.
Each analysis that fails on a rank becomes a warning, never the end of the report.
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings

import pandas as pd

from dstrace.analysis.model import LoadedRun

IDLE_CONSECUTIVE_KERNEL_DELAY_NS = 30
"""HTA's default: gaps under 30 ns between kernels are launch overhead ("kernel wait"), not host wait."""


@contextlib.contextmanager
def _quiet():
    """HTA logs, prints and raises pandas deprecation warnings; keep stdout (maybe JSON) and stderr clean."""
    hta_logger = logging.getLogger("hta")
    level, propagate = hta_logger.level, hta_logger.propagate
    hta_logger.setLevel(logging.CRITICAL + 1)
    hta_logger.propagate = False
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hta_logger.setLevel(level)
        hta_logger.propagate = propagate


def _load(run: LoadedRun):
    from hta.common.trace import Trace

    ranks = [r for r, t in run.traces.items() if t.has_gpu]
    t = Trace(trace_files={r: run.traces[r].path for r in ranks}, trace_dir=run.trace_dir)
    t.load_traces(include_last_profiler_step=True, use_multiprocessing=False, use_memory_profiling=False)
    return t


def hta_breakdowns(run: LoadedRun) -> tuple[dict[int, dict], list[str]]:
    """Per rank: {"temporal": {...}, "kernel_types_us": {...}, "top_kernels": [...], "comm_comp_overlap_pct",
    "idle_causes_us": {...}}. Empty for CPU-only runs (HTA needs GPU kernels)."""
    out: dict[int, dict] = {}
    problems: list[str] = []
    if run.device != "gpu":
        return out, problems
    with _quiet():
        try:
            from hta.analyzers.breakdown_analysis import BreakdownAnalysis
            from hta.analyzers.communication_analysis import CommunicationAnalysis
            t = _load(run)
        except Exception as exc:  # HTA is a third-party parser: any failure is reported, not fatal
            return out, [f"HTA could not load the traces ({type(exc).__name__}: {exc}); HTA breakdowns skipped"]
        ranks = t.get_ranks()
        for r in ranks:
            out[r] = {}

        def attempt(label, fn):
            try:
                return fn()
            except Exception as exc:
                problems.append(f"HTA {label} failed ({type(exc).__name__}: {exc}); left out")
                return None

        temporal = attempt("temporal breakdown", lambda: BreakdownAnalysis.get_temporal_breakdown(t, visualize=False))
        if temporal is not None:
            for _, row in temporal.iterrows():
                out[int(row["rank"])]["temporal"] = {
                    "idle_us": float(row["idle_time(us)"]), "compute_us": float(row["compute_time(us)"]),
                    "non_compute_us": float(row["non_compute_time(us)"]), "span_us": float(row["kernel_time(us)"]),
                    "idle_pct": float(row["idle_time_pctg"]), "compute_pct": float(row["compute_time_pctg"]),
                    "non_compute_pct": float(row["non_compute_time_pctg"]),
                }
        kernels = attempt("kernel breakdown", lambda: BreakdownAnalysis.get_gpu_kernel_breakdown(
            t, visualize=False, num_kernels=5, include_memory_kernels=True))
        if kernels is not None:
            per_kernel: pd.DataFrame = kernels[1]
            for rank, g in per_kernel.groupby("rank"):
                out[int(rank)]["kernel_types_us"] = {k: float(v) for k, v in g.groupby("kernel_type")["sum (us)"].sum().items()}
                top = g.sort_values("sum (us)", ascending=False).head(8)
                out[int(rank)]["top_kernels"] = [
                    {"name": str(n), "kernel_type": str(k), "total_us": float(s)}
                    for n, k, s in zip(top["name"], top["kernel_type"], top["sum (us)"])]
        overlap = attempt("communication-computation overlap",
                          lambda: CommunicationAnalysis.get_comm_comp_overlap(t, visualize=False))
        if overlap is not None:
            for _, row in overlap.iterrows():
                value = float(row["comp_comm_overlap_pctg"])
                out[int(row["rank"])]["comm_comp_overlap_pct"] = value if value == value else None
        for r in ranks:
            idle = attempt(f"idle time breakdown of rank {r}", lambda r=r: BreakdownAnalysis.get_idle_time_breakdown(
                t, IDLE_CONSECUTIVE_KERNEL_DELAY_NS, rank=r, visualize=False)[0])
            if idle is not None:
                out[r]["idle_causes_us"] = {str(k): float(v) for k, v in idle.groupby("idle_category")["idle_time"].sum().items()}
    return out, problems
