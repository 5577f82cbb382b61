"""Interval arithmetic on event start/end columns: unions, gaps, and how much of an event a union covers.

Overlapping kernels (several streams) or nested CPU ranges must not be counted twice; every busy and
idle time in the report comes from these unions.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def merge(starts, ends) -> pd.DataFrame:
    """Union of [start, end) intervals as sorted, disjoint rows with columns ts, end."""
    df = pd.DataFrame({"ts": np.asarray(starts, dtype=float), "end": np.asarray(ends, dtype=float)})
    if df.empty:
        return df
    df = df.sort_values("ts", kind="stable")
    group = (df["ts"] > df["end"].cummax().shift()).cumsum()
    return df.groupby(group).agg(ts=("ts", "min"), end=("end", "max")).reset_index(drop=True)


def total(merged: pd.DataFrame) -> float:
    return float((merged["end"] - merged["ts"]).sum()) if len(merged) else 0.0


def gaps(merged: pd.DataFrame, lo: float | None = None, hi: float | None = None) -> pd.DataFrame:
    """The holes between merged intervals, within [lo, hi] (defaults: first start, last end)."""
    if merged.empty:
        return pd.DataFrame({"ts": [], "end": []}, dtype=float)
    lo = merged["ts"].iloc[0] if lo is None else lo
    hi = merged["end"].iloc[-1] if hi is None else hi
    starts = np.concatenate([[lo], merged["end"].to_numpy()])
    ends = np.concatenate([merged["ts"].to_numpy(), [hi]])
    starts, ends = np.clip(starts, lo, hi), np.clip(ends, lo, hi)
    keep = ends > starts
    return pd.DataFrame({"ts": starts[keep], "end": ends[keep]})


def covered(merged: pd.DataFrame, starts, ends) -> np.ndarray:
    """For each [start, end), the time inside the union `merged` (vectorised through its running total)."""
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    if merged.empty:
        return np.zeros(len(starts))
    xp = np.column_stack([merged["ts"].to_numpy(), merged["end"].to_numpy()]).ravel()
    lengths = (merged["end"] - merged["ts"]).to_numpy()
    fp = np.column_stack([np.cumsum(lengths) - lengths, np.cumsum(lengths)]).ravel()
    return np.interp(ends, xp, fp) - np.interp(starts, xp, fp)


def intersection_total(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """Time covered by both unions."""
    return float(covered(a, b["ts"], b["end"]).sum()) if len(b) else 0.0


def top_level(events: pd.DataFrame) -> pd.DataFrame:
    """Events not nested in an earlier event of the same thread (the outermost CPU ops)."""
    if events.empty:
        return events
    ev = events.sort_values(["pid", "tid", "ts", "dur"], ascending=[True, True, True, False], kind="stable")
    prev_end = ev.groupby(["pid", "tid"], sort=False)["end"].transform(lambda s: s.cummax().shift())
    return ev[prev_end.isna() | (ev["ts"] >= prev_end)]
