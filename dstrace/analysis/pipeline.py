"""The analysis of one loaded run: pure functions over its traces, in dependency order."""
from __future__ import annotations

import os

import pandas as pd

from dstrace.analysis import (alignment, clocks, collectives, findings, hta_breakdown, parallel, peer_wait,
                              steps as steps_mod, utilization)
from dstrace.analysis.loaded import LoadedRun
from dstrace.analysis.results import Analysis, HtaBreakdown, RankReport, StepSeries
from dstrace.rankset import ranks_text
from dstrace.runfolder.names import REDUCTION_SUFFIX
from dstrace.trace_names import GPU_HOST_CATEGORIES


def analyze(run: LoadedRun, clock_policy: str = "auto") -> Analysis:
    warnings = list(run.warnings)
    notes: list[str] = []
    device = run.device
    untraced = [r for r, t in sorted(run.traces.items()) if t.trace_absent]
    if untraced:
        notes.append(_untraced_note(untraced, run.trace_dir))
    if device == "none":
        notes.append("no traces were recorded: findings come from the dstrace manifests only")
    elif device == "host-only" and run.gpu_job_untraced:
        notes.append(_gpu_job_untraced_note(run))
    elif device == "cpu":
        read = ("analyzed the CPU-side collective ops (gloo / c10d) instead; "
                if any(len(t.reduced.collectives) for t in run.traces.values()) else "")
        notes.append(f"no GPU kernels in any trace: {read}all times are host times and HTA's GPU breakdowns do "
                     "not apply")
    elif device == "gpu":
        for r, t in sorted(run.traces.items()):
            if not t.has_gpu:
                warnings.append(f"rank {r} has no GPU kernels in its trace; its GPU breakdown is empty")
    accelerators = run.accelerators
    if accelerators:
        warnings.append(_accelerator_warning(accelerators, device))

    step_df, step_source = steps_mod.step_ranges(run)
    coll = collectives.collective_events(run)
    unknown = _unknown_world_warning(run, coll)
    if unknown:
        warnings.append(unknown)
    notes.extend(_unknown_sizes_note(coll, device))
    hosts = {r: t.host for r, t in run.traces.items()}
    withhold_all = alignment.host_only_reason(run)
    coll, clock, align_warnings = alignment.align(coll, step_df, hosts, clock_policy, withhold_all)
    windows = collectives.rank_windows(run, clock)
    warnings.extend(align_warnings)
    warnings.extend(peer_wait.withheld_warnings(coll, clock, hosts, withhold_all, windows))
    note = clocks.alignment_note(clock)
    if note:
        notes.append(note)

    hta, hta_warnings = hta_breakdown.hta_breakdowns(run)
    warnings.extend(hta_warnings)
    parallel.release_freed_memory()
    stats = collectives.collective_stats(coll, windows)
    notes.extend(collectives.window_notes(coll, windows))
    waits = peer_wait.waits_by_rank(coll, windows)

    summaries: dict[int, RankReport] = {}
    for r, trace in sorted(run.traces.items()):
        # a rank without GPU kernels in a GPU run has nothing to count; its reduction holds its CPU work
        util = trace.reduced.utilization if trace.has_gpu == (device == "gpu") else utilization.idle_rank()
        w = waits.get(r, {})
        summaries[r] = RankReport(
            rank=r, file=trace.path, host=trace.host, span_us=util["span_us"], idle_us=util["idle_us"],
            busy_us=util["busy_us"], exposed_comm_us=util["exposed_comm_us"], collectives=stats.get(r, {}),
            comm_us=w.get("comm_us", 0.0), wait_us=w.get("wait_us", 0.0), waited_for=w.get("waited_for", {}),
            late_count=w.get("late_count", 0), caused_wait_us=w.get("caused_wait_us", 0.0),
            unsplit_us=w.get("unsplit_us", 0.0), devices=util.get("devices", {}), hta=hta.get(r, HtaBreakdown()),
            host_time=trace.reduced.host_time, comm_libraries_us=util.get("comm_libraries_us", {}),
            sparse=sparse_span(util, device), read_from="kept reduction" if trace.trace_absent else "trace",
        )
        if summaries[r].sparse:
            notes.append(f"rank {r}: {summaries[r].sparse}: too little to split into shares; its times are given "
                         "without percentages and no finding reads them")
    libraries = utilization.library_note({r: s.comm_libraries_us for r, s in summaries.items()})
    if libraries:
        notes.append(libraries)
    step_summary = steps_mod.summarize_steps(run, step_df, step_source, coll)
    inputs = findings.FindingInputs.of(run, summaries, step_summary)
    notes.extend(findings.blocking_call_notes(inputs))
    found = findings.all_findings(inputs)
    if untraced:
        notes.extend(_trace_pointers(run, found))
    return Analysis(
        trace_dir=run.trace_dir, run_id=run.run_id, device=device, world_size=run.world_size,
        ranks_found=run.ranks, missing_ranks=run.missing_ranks, ranks=summaries, steps=step_summary,
        findings=found, clock=clock, waits_over_time=_waits_over_time(coll), warnings=warnings, notes=notes,
        skipped=run.skipped, accelerators=accelerators, step_series=step_series(run))


def step_series(run: LoadedRun) -> list[StepSeries]:
    """Every completed call's step times per rank from the manifests, with the steps its window profiled."""
    out = []
    for rank, m in sorted(run.manifests.items()):
        w = m.window
        for call in m.calls:
            if call.error or len(call.step_ms) < 2:
                continue
            profiled = list(w.recorded_steps) if w and w.mode == "full" and w.call == call.index else []
            kinds = [str(k) for k in getattr(call, "step_kinds", None) or []]
            out.append(StepSeries(rank, call.index, list(call.step_ms), profiled, kinds))
    return out


SPARSE_MIN_ITEMS = 10
"""Shares of a span that holds fewer than 10 kernels (or CPU ops and collectives) describe a handful of events,
not a workload: a one-kernel trace is "compute 100%" of its 10 us."""
SPARSE_MIN_SPAN_US = 100.0
"""A span under 100 us is a few launches' worth of time, whatever it holds."""


def sparse_span(util: dict, device: str) -> str | None:
    """Why a rank's span has almost nothing on it, or None when its shares mean something."""
    span, items = util.get("span_us", 0.0), util.get("work_items")
    if not span > 0:
        return None
    if isinstance(items, int) and items < SPARSE_MIN_ITEMS:
        what = ("kernel" if items == 1 else "kernels") if device == "gpu" else "CPU ops and collectives"
        return f"its span of {span:.0f} us holds {items} {what}"
    if span < SPARSE_MIN_SPAN_US:
        return f"its span is {span:.0f} us"
    return None


TRACE_POINTERS_PER_FINDING = 8
"""Name the full traces of up to this many ranks per finding: enough to open, few enough to read."""


def _trace_pointers(run: LoadedRun, found: list) -> list[str]:
    """Per finding, the traces of the ranks it names that were read from their kept reductions alone: where
    to look once the reductions have spoken."""
    out = []
    for f in found:
        absent = [r for r in f.ranks if r in run.traces and run.traces[r].trace_absent]
        named = [f"rank {r}: {os.path.basename(run.traces[r].path)}" for r in absent[:TRACE_POINTERS_PER_FINDING]]
        if named:
            more = f" and {len(absent) - len(named)} more" if len(absent) > len(named) else ""
            whose = "its rank's trace" if len(absent) == 1 else "its ranks' traces"
            out.append(f"{f.id}: {whose}, not in {run.trace_dir}: " + "; ".join(named) + more)
    return out


def _untraced_note(untraced: list[int], trace_dir: str) -> str:
    """The ranks that are their kept reductions, their traces elsewhere; who wrote the reductions no file of
    theirs says (a reduction names its trace and the code that made it, not the verb)."""
    if len(untraced) == 1:
        return (f"{ranks_text(untraced)} read from its kept reduction (*{REDUCTION_SUFFIX}): its trace is not in "
                f"{trace_dir}")
    return (f"{ranks_text(untraced)} read from their kept reductions (*{REDUCTION_SUFFIX}): their traces are not in "
            f"{trace_dir}")


def _unknown_world_warning(run: LoadedRun, coll: pd.DataFrame) -> str | None:
    """Where no file records the world size, it is read as the ranks found: say so when the traces show the
    job communicating, since its other ranks then exist without a trace (a single process needs no word)."""
    recorded = (any(t.world_size for t in run.traces.values()) or run.manifests
                or (run.run_record is not None and run.run_record.world_size))
    ranks = {r for r, t in run.traces.items() if t.reduced.nccl_host_calls} | set(coll["rank"].astype(int))
    if recorded or not ranks:
        return None
    return (f"no trace or manifest records the world size, yet {ranks_text(ranks)} took part in collectives: "
            f"'world size {run.world_size}' is only the ranks found: the job may have had other ranks, without a "
            "trace here")


def _gpu_job_untraced_note(run: LoadedRun) -> str:
    """A trace without GPU activity whose host shows a GPU job (CUDA runtime calls, CUPTI profiler ranges,
    enqueued NCCL calls) is a GPU job profiled without its GPU: say so, what shows it, and that its device
    work, communication included, ran outside the trace."""
    calls: dict[str, list[int]] = {}
    events: dict[str, int] = {}
    for t in run.traces.values():
        for kind, c in t.reduced.nccl_host_calls.items():
            counted = calls.setdefault(kind, [0, 0])
            counted[0] += int(c["count"])
            counted[1] += int(c["bytes"])
        for cat, n in t.reduced.gpu_host_events.items():
            events[cat] = events.get(cat, 0) + int(n)
    ranks = {r for r, t in run.traces.items() if t.reduced.nccl_host_calls or t.reduced.gpu_host_events}
    written = ", ".join(f"{events[cat]} {what}" for cat, what in GPU_HOST_CATEGORIES.items() if events.get(cat))
    shown = [f"wrote {written}"] if written else []
    if calls:
        listed = ", ".join(f"{n} {kind} ({b / 1e6:.1f} MB)" if b else f"{n} {kind}"
                           for kind, (n, b) in sorted(calls.items()))
        shown.append(f"enqueued NCCL calls (c10d's nccl:* ranges: {listed})")
    comm = ("Its transfers ran on the GPU, outside these traces: no collective time, peer wait or bandwidth is "
            "read from them, and all" if calls else "All")
    return (f"no GPU activity in any trace (no kernel, copy or memset), yet the host of {ranks_text(ranks)} "
            f"{' and '.join(shown)}: a GPU job profiled without its GPU activity. {comm} times here are host times")


def _accelerator_warning(accelerators: dict[str, dict], device: str) -> str:
    """Say plainly that a device timeline is in the traces and not in the report."""
    held = "; ".join(f"{name} on {ranks_text(a['ranks'])} ("
                     + ", ".join(f"{cat} {n}" for cat, n in sorted(a["events"].items())) + " events)"
                     for name, a in sorted(accelerators.items()))
    names = " and ".join(sorted(accelerators))
    scope = ("every time in this report is a host (CPU) time, not the whole story" if device == "host-only"
             else "those ranks' device time is missing from this report")
    return (f"{names} device timeline not analyzed: the traces hold {held}; dstrace reads the device activity of "
            f"CUDA, ROCm and XPU traces only, so {scope}; open the traces in HTA or Perfetto for the device")


def _unknown_sizes_note(coll: pd.DataFrame, device: str) -> list[str]:
    """Why no size is known, in the words of the trace kind: GPU sizes come from the kernels' args, host ones
    from the ops' recorded shapes."""
    if not (len(coll) and (coll["bytes"] == 0).all()):
        return []
    if device == "gpu":
        return ["collective sizes are unknown in these traces: their NCCL kernels carry no size args (an older "
                "NCCL or torch writes none)"]
    return ["collective sizes are unknown in these traces: the collective ops carry no shapes (profile with "
            "record_shapes=True)"]


def _waits_over_time(coll: pd.DataFrame) -> pd.DataFrame:
    """Each collective's wait against its start, in ms from the first one: the report's scatter plot (calls
    whose split is withheld are left out)."""
    if not len(coll):
        return pd.DataFrame(columns=["rank", "kind", "ts_ms", "wait_us"])
    t0 = float(coll["ts"].min())
    split = coll.loc[coll["split"].astype(bool), ["rank", "kind", "ts", "wait_us"]]
    return pd.DataFrame({"rank": split["rank"], "kind": split["kind"], "ts_ms": (split["ts"] - t0) / 1e3,
                         "wait_us": split["wait_us"]})
