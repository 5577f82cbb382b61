"""Steps: how long each takes and how many bytes ZeRO-3 gathers in each.

Steps are the `dstrace/step#<n>` ranges (one forward of generate(); n=0 is the prefill), else torch's
`ProfilerStep#<n>` (one `prof.step()` of whatever the workload is: a training iteration as well as a
decode step). Only the first are called decode steps, and only there is step 0 a prefill to leave
out. A step's time runs from its start to the next step's start, so the host-side wait for the GPU
at the end of each step (token sampling) is counted; the last step uses its range.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dstrace.analysis.loaded import LoadedRun

from dstrace.analysis.results import StepSummary
from dstrace.analysis.reduction import STEP_SOURCES
from dstrace.analysis.shift import ProfilerCost, profiler_cost
from dstrace.analysis.step_kinds import BOUNDARY_KINDS, UNPROFILED, step_kinds
from dstrace.runfolder.records import Manifest

DECODE_SOURCES = (STEP_SOURCES[0][0], "manifest step_ms")
"""Step sources that are generate() forwards: dstrace's step ranges and the manifests' per-call step times."""

STEP_FRAME = ["rank", "step", "ts", "end", "ms"]

MANIFEST_COVERS = ("unprofiled decode steps of every call (manifests' step_ms), prefill, the profiled window's "
                   "steps and the profiler's start and stop steps left out")
"""What `ms per step` covers when manifests are there: the one definition analyze, compare and the demo print."""


@dataclass
class StepTime:
    """ms per decode step: the median of `samples` step times, `per_rank` steps on each of `ranks` ranks (a step
    every rank ran is one step, seen `ranks` times), and in words what those steps are."""
    ms: float
    samples: int
    covers: str
    per_rank: int = 0
    ranks: int = 0


def decode_step_ms(manifest: Manifest) -> list[float]:
    """Steady-state decode steps of every call: step 0 (the prefill) is left out, and so is every step the
    profiler touched (`step_kinds`): the window's steps carry its overhead, its start and stop steps their cost."""
    samples = []
    for call in manifest.calls:
        if call.error:
            continue
        kinds = step_kinds(manifest, call)
        samples.extend(ms for i, (ms, kind) in enumerate(zip(call.step_ms, kinds)) if i > 0 and kind == UNPROFILED)
    return samples


def step_time(manifests: dict[int, Manifest], steps: pd.DataFrame | None = None,
              source: str | None = None) -> StepTime | None:
    """The one ms per decode step of a run: from the manifests when there are any, else from the traces'
    step ranges (then it covers only the profiled steps, profiler overhead included)."""
    by_rank = {r: decode_step_ms(manifests[r]) for r in sorted(manifests)}
    samples = [ms for values in by_rank.values() for ms in values]
    if samples:
        return StepTime(float(statistics.median(samples)), len(samples), MANIFEST_COVERS,
                        max(len(v) for v in by_rank.values()), sum(1 for v in by_rank.values() if v))
    if steps is None or steps.empty:
        return None
    decode = decode_steps(steps, source)
    noun = "decode steps" if source in DECODE_SOURCES else "steps"
    return StepTime(float(decode["ms"].median()), len(decode),
                    f"profiled {noun} in the traces ({source or 'step ranges'}), profiler overhead included: "
                    + ("the manifests hold no generate() step times" if manifests else "no manifests")
                    + ", so the run's other steps are not seen",
                    int(decode.groupby("rank")["step"].nunique().max()), int(decode["rank"].nunique()))


def clean_trace_steps(run: LoadedRun, steps: pd.DataFrame) -> pd.DataFrame:
    """The traced steps less those the rank's manifest marks as the profiler's start or stop (a recording made
    before the start and stop were kept out of the window has them in its trace); all of a rank's steps when
    that would leave none."""
    if steps.empty:
        return steps
    windowed = {}  # rank -> (manifest, its profiled call): only these ranks can lose steps
    for rank in pd.unique(steps["rank"]).tolist():
        m = run.manifests.get(int(rank))
        call = next((c for c in m.calls if m.window and c.index == m.window.call), None) if m else None
        if call is not None:
            windowed[rank] = (m, call)
    if not windowed:  # no rank's manifest names its window: every step stays (no 10,000 per-rank frames)
        return steps
    keep = [steps[~steps["rank"].isin(list(windowed))]]
    for rank, g in steps[steps["rank"].isin(list(windowed))].groupby("rank", sort=False):
        m, call = windowed[rank]
        kinds = step_kinds(m, call)
        clean = g[[not (0 <= s < len(kinds)) or kinds[s] not in BOUNDARY_KINDS for s in g["step"].astype(int)]]
        keep.append(clean if len(clean) else g)
    return pd.concat(keep).sort_index()


def step_ranges(run: LoadedRun) -> tuple[pd.DataFrame, str | None]:
    """rank, step, ts, end, ms per step; from dstrace ranges when any rank has them, else ProfilerStep."""
    ranks = sorted(run.traces)
    frames = [run.traces[r].reduced.steps for r in ranks]
    if not any(len(f) for f in frames):
        return pd.DataFrame(columns=STEP_FRAME), None
    every = pd.concat([f for f in frames if len(f)], ignore_index=True)
    every.insert(0, "rank", np.repeat([r for r, f in zip(ranks, frames) if len(f)], [len(f) for f in frames if len(f)]))
    for source, _ in STEP_SOURCES:
        mine = every["source"] == source
        if mine.any():
            return every.loc[mine, STEP_FRAME].reset_index(drop=True), source
    return pd.DataFrame(columns=STEP_FRAME), None


def decode_steps(steps: pd.DataFrame, source: str | None) -> pd.DataFrame:
    """dstrace's steps after the prefill (step 0) when there are any, else all of them; ProfilerStep ranges
    have no prefill: all of them."""
    if source not in DECODE_SOURCES:
        return steps
    decode = steps[steps["step"] > 0]
    return decode if not decode.empty else steps


def gathered_per_step(run: LoadedRun, steps: pd.DataFrame, coll: pd.DataFrame) -> tuple[pd.Series, str | None]:
    """Bytes gathered per (rank, step): dstrace zero3.allgather ranges, else AllGather collectives' bytes
    (only when every one has its size)."""
    ranks = sorted(run.traces)
    gathers = [run.traces[r].reduced.gathers for r in ranks]
    rank_col = np.repeat(ranks, [len(g) for g in gathers]).astype("int64")
    ts = np.concatenate([g["ts"].to_numpy(dtype=float) for g in gathers] + [np.empty(0)])
    nbytes = np.concatenate([g["bytes"].to_numpy(dtype=float) for g in gathers] + [np.empty(0)])
    source = "dstrace/zero3.allgather ranges"
    if not len(ts) and not coll.empty:
        # not every column of what may be a third of the calls
        ag = coll.loc[coll["kind"] == "AllGather", ["rank", "host_ts", "bytes"]]
        if (pd.to_numeric(ag["bytes"], errors="coerce").fillna(0) > 0).all():
            # a per-step sum with sizes missing (older NCCL writes none) would be a made-up figure: none then
            rank_col, ts = ag["rank"].to_numpy(dtype="int64"), ag["host_ts"].to_numpy(dtype=float)
            nbytes, source = ag["bytes"].to_numpy(dtype=float), "AllGather collectives"
    if not len(ts) or steps.empty:
        return pd.Series(dtype=float), None
    firsts = steps.drop_duplicates(["rank", "step"]).sort_values(["rank", "step"], kind="stable")
    # the ranges of each rank in time order, and their running byte total (a size not known counts 0)
    order = np.lexsort((ts, rank_col))
    rank_col, ts = rank_col[order], ts[order]
    total = np.concatenate([[0], np.cumsum(np.nan_to_num(nbytes[order]).astype(np.int64))])
    step_rank = firsts["rank"].to_numpy(dtype="int64")
    lo = _count_before(rank_col, ts, step_rank, firsts["ts"].to_numpy(dtype=float))
    hi = np.maximum(_count_before(rank_col, ts, step_rank, firsts["end"].to_numpy(dtype=float)), lo)
    keys = list(zip(step_rank.tolist(), firsts["step"].tolist()))
    return pd.Series((total[hi] - total[lo]).tolist(), index=pd.MultiIndex.from_tuples(keys), dtype=float), source


def _count_before(ranks: np.ndarray, ts: np.ndarray, at_rank: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each query (at_rank, at): the position in (ranks, ts), sorted by rank then time, of the first range
    of that rank at or after `at`: searchsorted(side="left") within the rank's own ranges, for all ranks in
    one sort."""
    n = len(ranks)
    keys_rank = np.concatenate([ranks, at_rank])
    keys_ts = np.concatenate([ts, at])
    is_query = np.concatenate([np.zeros(n, dtype=np.int8), -np.ones(len(at), dtype=np.int8)])  # queries first
    order = np.lexsort((is_query, keys_ts, keys_rank))
    ranges_before = np.cumsum(order < n) - (order < n)  # ranges strictly before each sorted position
    out = np.empty(len(at), dtype=np.int64)
    queries = order >= n
    out[order[queries] - n] = ranges_before[queries]
    return out


def model_bytes(run: LoadedRun) -> int | None:
    sizes = [m.inventory.logical_bytes for m in run.manifests.values() if m.inventory and m.inventory.logical_bytes]
    return max(sizes) if sizes else None


def _manifest_decode_ms(run: LoadedRun) -> dict[int, list[list[float]]]:
    """Per rank, per call: the step_ms of the manifests (the whole call, profiled steps included), prefill
    excluded: for `steps.manifest_ms_median` of dstrace.analysis/1 and the per-rank counts of a run without
    traces; reports print `step_time` instead."""
    return {r: [call.step_ms[1:] if len(call.step_ms) > 1 else call.step_ms for call in m.calls]
            for r, m in run.manifests.items()}


def summarize_steps(run: LoadedRun, steps: pd.DataFrame, source: str | None, coll: pd.DataFrame) -> StepSummary | None:
    by_rank = _manifest_decode_ms(run)
    manifest_ms = [ms for calls in by_rank.values() for call in calls for ms in call]
    timing = step_time(run.manifests, clean_trace_steps(run, steps), source)
    if timing is None and not manifest_ms:
        return None
    per_rank = {}
    decode = decode_steps(steps, source) if not steps.empty else steps
    # counts are of every traced step (the traces' totals are divided by them); times leave the profiler's out
    clean = clean_trace_steps(run, decode)
    gathered, gathered_source = gathered_per_step(run, decode, coll) if not decode.empty else (pd.Series(dtype=float), None)
    counts = decode.groupby("rank")["ms"].size()
    clean_medians = clean.groupby("rank")["ms"].median()
    gathered_medians = gathered.groupby(level=0).median() if len(gathered) else pd.Series(dtype=float)
    for rank, count in counts.items():
        entry = {"count": int(count), "ms_median": float(clean_medians.get(rank, float("nan")))}
        if rank in gathered_medians.index:
            entry["gathered_bytes_median"] = float(gathered_medians[rank])
        per_rank[int(rank)] = entry
    if decode.empty:
        # as from traces: steps per call on one rank, not summed over calls and ranks
        count = max((len(call) for calls in by_rank.values() for call in calls), default=0)
        ms_median = float(statistics.median(manifest_ms)) if manifest_ms else timing.ms
        source = "manifest step_ms"
        per_rank = {r: {"count": max(map(len, calls)),
                        "ms_median": float(statistics.median([x for c in calls for x in c]))}
                    for r, calls in sorted(by_rank.items()) if any(calls)}
    else:
        count, ms_median = int(decode["step"].nunique()), float(clean["ms"].median())
    if not len(gathered):
        by_rank_gathered = {r: [b for c in m.calls
                                for b in (c.gathered_bytes[1:] if len(c.gathered_bytes) > 1 else c.gathered_bytes)]
                            for r, m in run.manifests.items()}
        manifest_gathered = [b for values in by_rank_gathered.values() for b in values]
        if manifest_gathered:
            gathered = pd.Series(manifest_gathered, dtype=float)
            gathered_source = "manifest gathered_bytes"
            for r, values in by_rank_gathered.items():
                if values and r in per_rank:
                    per_rank[r]["gathered_bytes_median"] = float(statistics.median(values))
    return StepSummary(
        count=count, ms_median=ms_median, source=source or "", per_rank=per_rank,
        manifest_ms_median=float(statistics.median(manifest_ms)) if manifest_ms else None,
        gathered_bytes_median=float(gathered.median()) if len(gathered) else None,
        gathered_source=gathered_source, model_bytes=model_bytes(run), decode=source in DECODE_SOURCES,
        ms_per_step=timing.ms if timing else None, ms_per_step_covers=timing.covers if timing else None,
        ms_per_step_samples=timing.samples if timing else 0, ms_per_step_per_rank=timing.per_rank if timing else 0,
        ms_per_step_ranks=timing.ranks if timing else 0, profiler_cost=cost_json(profiler_cost(run.manifests)))


def cost_json(cost: ProfilerCost | None) -> dict | None:
    """`StepSummary.profiler_cost` and the findings' evidence: the profiler's cost per recorded step."""
    if cost is None:
        return None
    return {"call": cost.call, "profiled_ms": cost.profiled_ms, "unprofiled_ms": cost.unprofiled_ms,
            "added_ms": cost.added_ms, "ratio": cost.ratio, "profiled_steps": cost.profiled_steps,
            "unprofiled_steps": cost.unprofiled_steps, "level": cost.level, "line": cost.line()}
