"""The analysis of one loaded run: pure functions over its traces, in dependency order."""
from __future__ import annotations

import os
import statistics

import pandas as pd

from dstrace.analysis import alignment, collectives, findings, host, hta_breakdown, steps as steps_mod, utilization
from dstrace.analysis.model import Analysis, LoadedRun, RankSummary, StepSummary


def _step_window(step_df: pd.DataFrame, rank: int) -> tuple[float, float] | None:
    mine = step_df[step_df["rank"] == rank]
    return (float(mine["ts"].min()), float(mine["end"].max())) if len(mine) else None


def analyze(run: LoadedRun, clock_policy: str = "auto") -> Analysis:
    warnings = list(run.warnings)
    notes: list[str] = []
    device = run.device
    if device == "none":
        notes.append("no traces were recorded: findings come from the dstrace manifests only")
    elif device == "cpu":
        notes.append("no GPU kernels in any trace: analyzed the CPU-side collective ops (gloo / c10d) instead; "
                     "all times are host times and HTA's GPU breakdowns do not apply")
    else:
        for r, t in sorted(run.traces.items()):
            if not t.has_gpu:
                warnings.append(f"rank {r} has no GPU kernels in its trace; its GPU breakdown is empty")

    step_df, step_source = steps_mod.step_ranges(run)
    coll = collectives.collective_events(run)
    notes.extend(_unknown_sizes_note(coll))
    hosts = {r: t.host for r, t in run.traces.items()}
    coll, clock, align_warnings = alignment.align(coll, step_df, hosts, clock_policy)
    warnings.extend(align_warnings)
    shifted = {r: o for r, o in clock.items() if o.applied}
    if shifted:
        notes.append("clocks aligned on the ends of matched collectives: " + ", ".join(
            f"rank {r} {o.offset_us / 1e3:+.3f} ms (residual {o.residual_us or 0:.1f} us)" for r, o in sorted(shifted.items())))

    hta, hta_warnings = hta_breakdown.hta_breakdowns(run)
    warnings.extend(hta_warnings)
    stats = collectives.collective_stats(coll)
    waits = alignment.wait_summary(coll)

    summaries: dict[int, RankSummary] = {}
    for r, trace in sorted(run.traces.items()):
        mine = coll[coll["rank"] == r]
        window = _step_window(step_df, r) if device == "cpu" else None
        util = utilization.utilization(trace, mine, device, window)
        w = waits.get(r, {})
        summaries[r] = RankSummary(
            rank=r, file=trace.path, host=trace.host, span_us=util["span_us"], idle_us=util["idle_us"],
            busy_us=util["busy_us"], exposed_comm_us=util["exposed_comm_us"], collectives=stats.get(r, {}),
            comm_us=w.get("comm_us", 0.0), wait_us=w.get("wait_us", 0.0), waited_for=w.get("waited_for", {}),
            late_count=w.get("late_count", 0), caused_wait_us=w.get("caused_wait_us", 0.0),
            devices=util.get("devices", {}), hta=hta.get(r, {}),
            host_time=host.host_during_idle(trace) if device == "gpu" and trace.has_gpu else {},
        )
    step_summary = steps_mod.summarize_steps(run, step_df, step_source, coll)
    waits_over_time = _waits_over_time(coll)
    return Analysis(
        trace_dir=run.trace_dir, run_id=run.run_id, device=device, world_size=run.world_size,
        ranks_found=run.ranks, missing_ranks=run.missing_ranks, ranks=summaries, steps=step_summary,
        findings=findings.all_findings(run, summaries, step_summary), clock=clock,
        waits_over_time=waits_over_time, warnings=warnings, notes=notes, skipped=run.skipped)


def _unknown_sizes_note(coll: pd.DataFrame) -> list[str]:
    if len(coll) and (coll["bytes"] == 0).all():
        return ["collective sizes are unknown in these traces (profile with record_shapes=True on CPU)"]
    return []


def _waits_over_time(coll: pd.DataFrame) -> pd.DataFrame:
    """Each collective's wait against its start, in ms from the first one: the report's scatter plot."""
    if not len(coll):
        return pd.DataFrame(columns=["rank", "kind", "ts_ms", "wait_us"])
    t0 = float(coll["ts"].min())
    return pd.DataFrame({"rank": coll["rank"], "kind": coll["kind"], "ts_ms": (coll["ts"] - t0) / 1e3,
                         "wait_us": coll["wait_us"]})


TRACE_POINTERS_PER_FINDING = 8
"""Name the full traces of up to this many ranks per finding: enough to open, few enough to read."""


def analyze_summaries(run, clock_policy: str = "auto") -> Analysis:
    """The analysis of a run read from its rank summaries (`summaries.SummaryRun`): the same matching,
    clock alignment, wait split, statistics and findings, without HTA's per-trace breakdowns."""
    from dstrace.analysis import summaries

    warnings = list(run.warnings)
    notes = [f"read from the {len(run.summaries)} rank summaries (*.summary.json.gz), not the traces: "
             "HTA breakdowns and host time during GPU idle need the traces (dstrace analyze --source traces)"]
    if run.device == "cpu":
        notes.append("no GPU kernels in any trace: analyzed the CPU-side collective ops (gloo / c10d) instead; "
                     "all times are host times")
    raw = summaries.collective_frame(run)
    step_df = summaries.step_frame(run)
    notes.extend(_unknown_sizes_note(raw))
    coll, clock, align_warnings = alignment.align(raw, step_df, run.hosts, clock_policy)
    warnings.extend(align_warnings)
    note = alignment.alignment_note(clock)
    if note:
        notes.append(note)
    stats = collectives.collective_stats(coll)
    waits = alignment.wait_summary(coll)
    ranks: dict[int, RankSummary] = {}
    for r, s in sorted(run.summaries.items()):
        util, w = s.get("utilization") or {}, waits.get(r, {})
        ranks[r] = RankSummary(
            rank=r, file=run.trace_path(r), host=s.get("host"), span_us=util.get("span_us", 0.0),
            idle_us=util.get("idle_us", 0.0), busy_us=util.get("busy_us", {}),
            exposed_comm_us=util.get("exposed_comm_us", 0.0), collectives=stats.get(r, {}),
            comm_us=w.get("comm_us", 0.0), wait_us=w.get("wait_us", 0.0), waited_for=w.get("waited_for", {}),
            late_count=w.get("late_count", 0), caused_wait_us=w.get("caused_wait_us", 0.0))
    step_summary = _summary_steps(run, step_df, raw)
    found = findings.all_findings(run, ranks, step_summary)
    for f in found:
        named = [f"rank {r}: {os.path.basename(run.trace_path(r))}" for r in f.ranks[:TRACE_POINTERS_PER_FINDING]
                 if r in run.summaries]
        if named:
            more = f" and {len(f.ranks) - len(named)} more" if len(f.ranks) > len(named) else ""
            notes.append(f"{f.id}: full traces in {run.trace_dir}: " + "; ".join(named) + more)
    waits_over_time = _waits_over_time(coll)
    return Analysis(
        trace_dir=run.trace_dir, run_id=run.run_id, device=run.device, world_size=run.world_size,
        ranks_found=run.ranks, missing_ranks=run.missing_ranks, ranks=ranks, steps=step_summary,
        findings=found, clock=clock, waits_over_time=waits_over_time, warnings=warnings, notes=notes,
        skipped=run.skipped)


def _summary_steps(run, step_df: pd.DataFrame, raw_coll: pd.DataFrame) -> StepSummary | None:
    """Decode steps from the summaries' step ranges; step times from the manifests when there are none."""
    from dstrace.analysis import summaries

    manifest_ms = steps_mod._manifest_decode_ms(run)
    if step_df.empty and not manifest_ms:
        return None
    decode = steps_mod.decode_steps(step_df) if not step_df.empty else step_df
    gathered, gathered_source = summaries.gathered_per_step(run, raw_coll)
    gathered = {k: v for k, v in gathered.items() if not decode.empty and k[1] in set(decode["step"])}
    per_rank = {}
    for rank, g in decode.groupby("rank"):
        entry = {"count": int(len(g)), "ms_median": float(g["ms"].median())}
        mine = [v for (r, _), v in gathered.items() if r == rank]
        if mine:
            entry["gathered_bytes_median"] = float(statistics.median(mine))
        per_rank[int(rank)] = entry
    if decode.empty:
        count, ms_median, source = len(manifest_ms), float(statistics.median(manifest_ms)), "manifest step_ms"
    else:
        count, ms_median, source = int(decode["step"].nunique()), float(decode["ms"].median()), "dstrace/step ranges"
    return StepSummary(
        count=count, ms_median=ms_median, source=source, per_rank=per_rank,
        manifest_ms_median=float(statistics.median(manifest_ms)) if manifest_ms else None,
        gathered_bytes_median=float(statistics.median(gathered.values())) if gathered else None,
        gathered_source=gathered_source if gathered else None, model_bytes=steps_mod.model_bytes(run))
