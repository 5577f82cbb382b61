"""Steps: how long each takes and how many bytes ZeRO-3 gathers in each.

Steps are the `dstrace/step#<n>` ranges (one forward of generate(); n=0 is the prefill), else torch's
`ProfilerStep#<n>` (one `prof.step()` of whatever the workload is: a training iteration as well as a
decode step). Only the first are called decode steps, and only there is step 0 a prefill to leave
out. A step's time runs from its start to the next step's start, so the host-side wait for the GPU
at the end of each step (token sampling) is counted; the last step uses its range.
"""
from __future__ import annotations

import statistics

import pandas as pd

from dstrace.analysis.model import LoadedRun, StepSummary
from dstrace.analysis.reduction import STEP_SOURCES

DECODE_SOURCES = (STEP_SOURCES[0][0], "manifest step_ms")
"""Step sources that are generate() forwards: dstrace's step ranges and the manifests' per-call step times."""

STEP_FRAME = ["rank", "step", "ts", "end", "ms"]


def step_ranges(run: LoadedRun) -> tuple[pd.DataFrame, str | None]:
    """rank, step, ts, end, ms per step; from dstrace ranges when any rank has them, else ProfilerStep."""
    for source, _ in STEP_SOURCES:
        frames = [t.reduced.steps[t.reduced.steps["source"] == source].assign(rank=rank)
                  for rank, t in sorted(run.traces.items())]
        frames = [f for f in frames if len(f)]
        if frames:
            return pd.concat(frames, ignore_index=True)[STEP_FRAME], source
    return pd.DataFrame(columns=STEP_FRAME), None


def decode_steps(steps: pd.DataFrame, source: str | None) -> pd.DataFrame:
    """dstrace's steps after the prefill (step 0) when there are any, else all of them; ProfilerStep ranges
    have no prefill: all of them."""
    if source not in DECODE_SOURCES:
        return steps
    decode = steps[steps["step"] > 0]
    return decode if not decode.empty else steps


def gathered_per_step(run: LoadedRun, steps: pd.DataFrame, coll: pd.DataFrame) -> tuple[pd.Series, str | None]:
    """Bytes gathered per (rank, step): dstrace zero3.allgather ranges, else AllGather collectives' bytes."""
    rows = [(rank, ts, int(n)) for rank, t in sorted(run.traces.items())
            for ts, n in zip(t.reduced.gathers["ts"], t.reduced.gathers["bytes"])]
    source = "dstrace/zero3.allgather ranges"
    if not rows and not coll.empty:
        ag = coll[coll["kind"] == "AllGather"]
        rows = list(zip(ag["rank"], ag["host_ts"], ag["bytes"]))
        source = "AllGather collectives"
    if not rows or steps.empty:
        return pd.Series(dtype=float), None
    ranges = pd.DataFrame(rows, columns=["rank", "ts", "bytes"])
    sums = {}
    for (rank, step), st in steps.groupby(["rank", "step"]):
        r = ranges[ranges["rank"] == rank]
        st_ts, st_end = float(st["ts"].iloc[0]), float(st["end"].iloc[0])
        sums[(rank, step)] = int(r.loc[(r["ts"] >= st_ts) & (r["ts"] < st_end), "bytes"].sum())
    return pd.Series(sums, dtype=float), source


def model_bytes(run: LoadedRun) -> int | None:
    sizes = [m.inventory.logical_bytes for m in run.manifests.values() if m.inventory and m.inventory.logical_bytes]
    return max(sizes) if sizes else None


def _manifest_decode_ms(run: LoadedRun) -> list[float]:
    """Per-forward step_ms of the manifests (the whole call, not only the profiled window), prefill excluded."""
    out = []
    for m in run.manifests.values():
        for call in m.calls:
            out.extend(call.step_ms[1:] if len(call.step_ms) > 1 else call.step_ms)
    return out


def summarize_steps(run: LoadedRun, steps: pd.DataFrame, source: str | None, coll: pd.DataFrame) -> StepSummary | None:
    manifest_ms = _manifest_decode_ms(run)
    if steps.empty and not manifest_ms:
        return None
    per_rank = {}
    decode = decode_steps(steps, source) if not steps.empty else steps
    gathered, gathered_source = gathered_per_step(run, decode, coll) if not decode.empty else (pd.Series(dtype=float), None)
    for rank, g in decode.groupby("rank"):
        entry = {"count": int(len(g)), "ms_median": float(g["ms"].median())}
        if len(gathered):
            mine = gathered[[k for k in gathered.index if k[0] == rank]]
            if len(mine):
                entry["gathered_bytes_median"] = float(mine.median())
        per_rank[int(rank)] = entry
    if decode.empty:
        count, ms_median, source = len(manifest_ms), float(statistics.median(manifest_ms)), "manifest step_ms"
    else:
        count, ms_median = int(decode["step"].nunique()), float(decode["ms"].median())
    if not len(gathered):
        manifest_gathered = [b for m in run.manifests.values() for c in m.calls
                             for b in (c.gathered_bytes[1:] if len(c.gathered_bytes) > 1 else c.gathered_bytes)]
        if manifest_gathered:
            gathered = pd.Series(manifest_gathered, dtype=float)
            gathered_source = "manifest gathered_bytes"
    return StepSummary(
        count=count, ms_median=ms_median, source=source or "", per_rank=per_rank,
        manifest_ms_median=float(statistics.median(manifest_ms)) if manifest_ms else None,
        gathered_bytes_median=float(gathered.median()) if len(gathered) else None,
        gathered_source=gathered_source, model_bytes=model_bytes(run), decode=source in DECODE_SOURCES)
