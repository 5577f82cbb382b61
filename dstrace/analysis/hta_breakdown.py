"""The standard per-rank GPU breakdowns, computed by HTA (through `hta_adapter`), typed: `HtaBreakdown`.

HTA gives temporal (idle / compute / non-compute), kernel-type totals, communication-computation
overlap and idle-time causes (host wait, kernel-launch gaps, other). Its critical-path and
frequent-sequence analyses fail on pandas 3 and are not used. Every HTA breakdown dstrace uses is per
rank, so one rank at a time gives what a whole-run `Trace` gives, in the process that parsed the rank
and with only that rank in memory. Each analysis that fails becomes a problem line, never the end of the
report.
"""
from __future__ import annotations

import os
import traceback

import pandas as pd

from dstrace.analysis import hta_adapter, intervals, parallel
from dstrace.analysis.loaded import LoadedRun
from dstrace.analysis.results import HtaBreakdown, HtaKernel, HtaTemporal
from dstrace.analysis.tracefile import Columns
from dstrace.trace_names import comm_library

IDLE_CONSECUTIVE_KERNEL_DELAY_NS = 30
"""HTA's default: gaps under 30 ns between kernels are launch overhead ("kernel wait"), not host wait."""


def _temporal(t, analyzers) -> dict:
    temporal = analyzers[0].get_temporal_breakdown(t, visualize=False)
    if not len(temporal):
        return {}
    row = temporal.iloc[0]
    return {"temporal": HtaTemporal(
        idle_us=float(row["idle_time(us)"]), compute_us=float(row["compute_time(us)"]),
        non_compute_us=float(row["non_compute_time(us)"]), span_us=float(row["kernel_time(us)"]),
        idle_pct=float(row["idle_time_pctg"]), compute_pct=float(row["compute_time_pctg"]),
        non_compute_pct=float(row["non_compute_time_pctg"]), communication_in_compute_us=communication_in_compute(t))}


def communication_in_compute(t) -> dict[str, float]:
    """Per library, the time of the communication kernels (`trace_names.comm_library`: DeepEP, custom
    all-reduce, MSCCL++, NVSHMEM) that HTA types COMPUTATION, on HTA's own frame and clock: the part of HTA's
    compute time that dstrace counts as communication. HTA knows only `nccl*Kernel` names as communication."""
    from hta.utils.utils import get_kernel_type

    df = t.traces[0]
    kernels = df[df["stream"].ne(-1)]
    if kernels.empty:
        return {}
    names = t.symbol_table.get_sym_table()
    libraries = {}
    for code in pd.unique(kernels["name"]):
        name = names[int(code)]
        library = comm_library(name)
        if library is not None and get_kernel_type(name) == "COMPUTATION":
            libraries[code] = library
    if not libraries:
        return {}
    of = kernels["name"].map(libraries)
    return {str(lib): intervals.total(intervals.merge(g["ts"], g["ts"] + g["dur"]))  # HTA shifts ts, not end
            for lib, g in kernels[of.notna()].groupby(of)}


def _kernels(t, analyzers) -> dict:
    per_kernel: pd.DataFrame = analyzers[0].get_gpu_kernel_breakdown(
        t, visualize=False, num_kernels=5, include_memory_kernels=True)[1]
    if not len(per_kernel):
        return {}
    top = per_kernel.sort_values("sum (us)", ascending=False).head(8)
    return {"kernel_types_us": {k: float(v) for k, v in per_kernel.groupby("kernel_type")["sum (us)"].sum().items()},
            "top_kernels": [_top_kernel(str(n), str(k), float(s))
                            for n, k, s in zip(top["name"], top["kernel_type"], top["sum (us)"])]}


def _top_kernel(name: str, kernel_type: str, total_us: float) -> HtaKernel:
    library = comm_library(name)
    return HtaKernel(name, kernel_type, total_us, library if library is not None and kernel_type != "COMMUNICATION"
                     else None)


def _overlap(t, analyzers) -> dict:
    overlap = analyzers[1].get_comm_comp_overlap(t, visualize=False)
    if not len(overlap):
        return {}
    return {"comm_comp_overlap_pct": float(overlap.iloc[0]["comp_comm_overlap_pctg"])}


def _idle(t, analyzers) -> dict:
    idle = analyzers[0].get_idle_time_breakdown(t, IDLE_CONSECUTIVE_KERNEL_DELAY_NS, rank=0, visualize=False)[0]
    return {"idle_causes_us": {str(k): float(v) for k, v in idle.groupby("idle_category")["idle_time"].sum().items()}}


BREAKDOWNS = {"temporal breakdown": _temporal, "kernel breakdown": _kernels,
              "communication-computation overlap": _overlap, "idle time breakdown": _idle}
"""HTA's breakdowns dstrace reports, in report order: label -> function of (Trace, analyzers) giving
`HtaBreakdown` fields."""
HELPER_SHARE = ("kernel breakdown", "communication-computation overlap")
"""The breakdowns a helper process computes, when there is one, while this one computes the others and the
reduction: the two slowest (0.27 s and 0.14 s of HTA's 0.55 s on a 300 MB trace), about as long as the rest."""


def _ready() -> None:
    with hta_adapter.quiet():
        hta_adapter.import_analyzers()


def run_breakdowns(t, labels) -> dict[str, tuple[dict, str | None]]:
    """label -> (its fields, None) or ({}, the problem met): each failure is left out, never the end."""
    done = {}
    with hta_adapter.quiet(), hta_adapter.apply_once_per_value():
        analyzers = hta_adapter.import_analyzers()
        for label in labels:
            try:
                done[label] = BREAKDOWNS[label](t, analyzers), None
            except Exception as exc:  # HTA is a third-party library: any failure is reported, not fatal
                done[label] = {}, _failed(label, exc)
    return done


def _failed(label: str, exc: BaseException) -> str:
    """The problem line; a bare `assert` of HTA's says nothing, so its file, line and condition stand in."""
    what = f": {exc}" if str(exc) else ""
    if not what and exc.__traceback__ is not None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        what = f" at {os.path.basename(frame.filename)}:{frame.lineno}" + (f" `{frame.line}`" if frame.line else "")
    return f"HTA {label} failed ({type(exc).__name__}{what}); left out"


def rank_breakdowns(path: str, meta: dict, columns: Columns, helper: parallel.Helper | None = None) -> Breakdowns:
    """One rank's HTA breakdowns from its parsed columns. With a helper, the helper computes HELPER_SHARE
    meanwhile: the caller reduces the rank in between, and asks `Breakdowns.result()` for them after."""
    if helper is not None:
        helper.submit(_ready)  # it imports HTA while this process builds the frame; its answer is not needed
    try:
        with hta_adapter.quiet():
            hta_adapter.import_analyzers()
            t = hta_adapter.trace(path, meta, columns)
    except Exception as exc:  # HTA is a third-party library: any failure is reported, not fatal
        return Breakdowns(None, (), None, "HTA could not read this trace, so its breakdown is left out; the rest of "
                          "the report (time per rank, steps, collectives, findings) is dstrace's own and still covers "
                          f"it (HTA's error: {type(exc).__name__}: {exc})")
    theirs = helper.submit(run_breakdowns, t, HELPER_SHARE) if helper is not None else None
    share = HELPER_SHARE if theirs is not None else ()
    done = run_breakdowns(t, [label for label in BREAKDOWNS if label not in share])
    return Breakdowns(done, share, theirs)


class Breakdowns:
    """A rank's HTA breakdowns, part of them maybe still being computed by a helper (`rank_breakdowns`)."""

    def __init__(self, done: dict | None, share: tuple[str, ...], theirs: parallel.Job | None,
                 skipped: str = "") -> None:
        self._done, self._share, self._theirs, self._skipped = done, share, theirs, skipped
        self._result: HtaBreakdown | None = None

    def result(self) -> HtaBreakdown:
        """The breakdowns, once the helper's share is in; asked again, the same."""
        if self._result is None:
            self._result = self._gather()
        return self._result

    def _gather(self) -> HtaBreakdown:
        if self._done is None:
            return HtaBreakdown(problems=[self._skipped])
        done = dict(self._done)
        if self._theirs is not None:
            try:
                done.update(self._theirs.result())
            except parallel.HelperGone as exc:
                done.update({label: ({}, f"HTA {label} left out: its helper process ended ({exc})")
                             for label in self._share})
            except Exception as exc:  # noqa: BLE001 - the job's own failure, reported as any breakdown's
                done.update({label: ({}, _failed(label, exc)) for label in self._share})
        fields, problems = {}, []
        for label in BREAKDOWNS:
            entries, problem = done[label]
            fields.update(entries)
            problems.extend([problem] if problem else [])
        return HtaBreakdown(**fields, problems=problems)


def hta_breakdowns(run: LoadedRun) -> tuple[dict[int, HtaBreakdown], list[str]]:
    """Per rank with GPU kernels, the breakdowns `rank_breakdowns` gave when the rank was loaded, and the
    problems met, one line each. Empty for CPU-only runs (HTA needs GPU kernels)."""
    out: dict[int, HtaBreakdown] = {}
    problems: list[str] = []
    if run.device != "gpu":
        return out, problems
    for rank, trace in sorted(run.traces.items()):
        if not trace.has_gpu:
            continue
        result = trace.reduced.hta
        if result is None:  # a reduction made without HTA's breakdowns (`dstrace.testing.scale_run`)
            continue
        out[rank] = result
        problems.extend(f"rank {rank}: {p}" for p in result.problems)
    return out, problems
