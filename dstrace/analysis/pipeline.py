"""The analysis of one loaded run: pure functions over its traces, in dependency order."""
from __future__ import annotations

import pandas as pd

from dstrace.analysis import alignment, collectives, findings, host, hta_breakdown, steps as steps_mod, utilization
from dstrace.analysis.model import Analysis, LoadedRun, RankSummary


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
    if len(coll) and (coll["bytes"] == 0).all():
        notes.append("collective sizes are unknown in these traces (profile with record_shapes=True on CPU)")
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
    t0 = float(coll["ts"].min()) if len(coll) else 0.0
    waits_over_time = pd.DataFrame({"rank": coll["rank"], "kind": coll["kind"],
                                    "ts_ms": (coll["ts"] - t0) / 1e3, "wait_us": coll["wait_us"]}) \
        if len(coll) else pd.DataFrame(columns=["rank", "kind", "ts_ms", "wait_us"])
    return Analysis(
        trace_dir=run.trace_dir, run_id=run.run_id, device=device, world_size=run.world_size,
        ranks_found=run.ranks, missing_ranks=run.missing_ranks, ranks=summaries, steps=step_summary,
        findings=findings.all_findings(run, summaries, step_summary), clock=clock,
        waits_over_time=waits_over_time, warnings=warnings, notes=notes, skipped=run.skipped)
