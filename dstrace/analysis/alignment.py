"""Cross-rank alignment: the same collective on every rank of its group, clock offsets, wait vs transfer.

A collective's n-th call of a kind in a process group is the same collective on every member rank
(within a dstrace step when all ranks have step ranges, which survives ranks whose windows start at
different calls). Once matched:

* clocks: a collective's kernels finish together on all ranks (the last byte arrives everywhere at
  about the same time), so the median of (end on rank r - end on the reference rank) estimates rank
  r's clock offset. Ranks on the reference's host share its clock and are left alone unless asked;
* wait: the kernel of a rank that arrives early spins until the last peer arrives. Its time splits into
  wait = (last start among the peers - own start) and transfer = the rest.
"""
from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import pandas as pd

from dstrace.analysis.model import ClockOffset

CLOCK_POLICIES = ("auto", "always", "never")


def assign_steps(coll: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """The step (dstrace/step#n) whose host range holds each collective's launch, -1 when none."""
    out = pd.Series(-1, index=coll.index, dtype="int64")
    if steps is None or steps.empty or coll.empty:
        return out
    for rank, st in steps.groupby("rank"):
        mask = coll["rank"] == rank
        st = st.sort_values("ts")
        host = coll.loc[mask, "host_ts"].to_numpy()
        idx = np.searchsorted(st["ts"].to_numpy(), host, side="right") - 1
        ok = (idx >= 0) & (host < st["end"].to_numpy()[np.clip(idx, 0, None)])
        out.loc[mask] = np.where(ok, st["step"].to_numpy()[np.clip(idx, 0, None)], -1)
    return out


def match_collectives(coll: pd.DataFrame, steps: pd.DataFrame | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Give each collective an `instance` id shared by the same call on all ranks of its group."""
    warnings: list[str] = []
    coll = coll.copy()
    ranks_with_steps = set(steps["rank"]) if steps is not None and not steps.empty else set()
    use_steps = bool(ranks_with_steps) and ranks_with_steps >= set(coll["rank"])
    coll["step"] = assign_steps(coll, steps) if use_steps else -1
    coll = coll.sort_values(["rank", "ts"], kind="stable")
    keys = ["group", "kind", "step"]
    coll["ordinal"] = coll.groupby(["rank"] + keys).cumcount()
    counts = coll.groupby(keys + ["rank"]).size().unstack("rank")
    for key, row in counts.iterrows():
        present = row.dropna()
        if present.nunique() > 1:
            group, kind, step = key
            where = f" in step {step}" if step >= 0 else ""
            detail = ", ".join(f"rank {int(r)}: {int(c)}" for r, c in present.items())
            warnings.append(f"{kind} counts differ across ranks of group {group}{where} ({detail}); "
                            "matched in order, the extra calls count as transfer only")
    coll["instance"] = coll.groupby(keys + ["ordinal"]).ngroup()
    return coll, warnings


def _pair_offsets(coll: pd.DataFrame) -> dict[tuple[int, int], tuple[float, int]]:
    """Median end difference (b - a) and the number of shared collectives, for every rank pair."""
    ends = coll.pivot_table(index="instance", columns="rank", values="end", aggfunc="first")
    out = {}
    ranks = list(ends.columns)
    for i, a in enumerate(ranks):
        for b in ranks[i + 1:]:
            d = (ends[b] - ends[a]).dropna()
            if len(d):
                out[(a, b)] = (float(d.median()), len(d))
                out[(b, a)] = (-float(d.median()), len(d))
    return out


def estimate_clock_offsets(coll: pd.DataFrame, hosts: dict[int, str | None],
                           policy: str = "auto") -> dict[int, ClockOffset]:
    """Per-rank offsets to the lowest rank's clock, chained through peers when a rank shares no group with it.

    auto applies an offset to ranks on another host than the reference (or of unknown host); always and
    never force it. Ranks sharing no collective with any aligned rank keep offset 0, marked unmatched.
    """
    ranks = sorted(set(coll["rank"]) | set(hosts))
    if not ranks:
        return {}
    ref = ranks[0]
    pairs = _pair_offsets(coll) if not coll.empty else {}
    offsets: dict[int, ClockOffset] = {ref: ClockOffset(0.0, False, 0.0, 0, None)}
    estimate = {ref: 0.0}
    queue = deque([ref])
    while queue:
        a = queue.popleft()
        for (x, b), (diff, n) in sorted(pairs.items()):
            if x != a or b in estimate:
                continue
            estimate[b] = estimate[a] + diff
            same_host = hosts.get(b) is not None and hosts.get(b) == hosts.get(ref)
            applied = policy == "always" or (policy == "auto" and not same_host)
            offsets[b] = ClockOffset(estimate[b], applied, None, n, a)
            queue.append(b)
    for r in ranks:
        offsets.setdefault(r, ClockOffset(0.0, False, None, 0, None))
    return offsets


def apply_offsets(coll: pd.DataFrame, offsets: dict[int, ClockOffset]) -> pd.DataFrame:
    """Shift ts/end/host_ts of ranks whose offset is applied, then record each rank's residual."""
    coll = coll.copy()
    shift = coll["rank"].map({r: (o.offset_us if o.applied else 0.0) for r, o in offsets.items()}).fillna(0.0)
    for col in ("ts", "end", "host_ts"):
        coll[col] = coll[col] - shift
    if coll.empty:
        return coll
    ends = coll.pivot_table(index="instance", columns="rank", values="end", aggfunc="first")
    for r, o in offsets.items():
        if o.via is None or r not in ends or o.via not in ends:
            continue
        d = (ends[r] - ends[o.via]).dropna()
        # the via-rank may itself be shifted; the residual is measured on corrected clocks of both
        o.residual_us = float(d.abs().median()) if len(d) else None
    return coll


def split_wait(coll: pd.DataFrame) -> pd.DataFrame:
    """wait_us = last start among the instance's ranks - own start (within own duration); transfer = rest.

    `waited_for` is the rank that arrived last (the one this rank waited on), or -1 for the last rank itself
    and for calls no peer was matched to.
    """
    coll = coll.copy()
    if coll.empty:
        for col in ("wait_us", "transfer_us"):
            coll[col] = pd.Series(dtype=float)
        coll["waited_for"] = pd.Series(dtype="int64")
        coll["peers"] = pd.Series(dtype="int64")
        return coll
    grp = coll.groupby("instance")
    last_start = grp["ts"].transform("max")
    coll["peers"] = grp["rank"].transform("size") - 1
    last_idx = coll.loc[grp["ts"].idxmax()].set_index("instance")["rank"]
    coll["wait_us"] = np.clip(last_start - coll["ts"], 0.0, coll["dur"])
    coll.loc[coll["peers"] == 0, "wait_us"] = 0.0
    coll["transfer_us"] = coll["dur"] - coll["wait_us"]
    last_rank = coll["instance"].map(last_idx)
    coll["waited_for"] = np.where((coll["peers"] > 0) & (last_rank != coll["rank"]), last_rank, -1).astype("int64")
    return coll


def wait_summary(coll: pd.DataFrame) -> dict[int, dict]:
    """Per rank: wait, comm time, who it waited for, and how often it was the one the others waited on."""
    out: dict[int, dict] = defaultdict(lambda: {"wait_us": 0.0, "comm_us": 0.0, "waited_for": {},
                                                "late_count": 0, "caused_wait_us": 0.0})
    if coll.empty:
        return {}
    for rank, g in coll.groupby("rank"):
        s = out[int(rank)]
        s["wait_us"] = float(g["wait_us"].sum())
        s["comm_us"] = float(g["dur"].sum())
        waited = g[g["waited_for"] >= 0].groupby("waited_for")["wait_us"].sum()
        s["waited_for"] = {int(p): float(w) for p, w in waited.items() if w > 0}
    caused = coll[coll["waited_for"] >= 0].groupby("waited_for").agg(
        n=("instance", "nunique"), wait=("wait_us", "sum"))
    for rank, row in caused.iterrows():
        out[int(rank)]["late_count"] = int(row["n"])
        out[int(rank)]["caused_wait_us"] = float(row["wait"])
    return dict(out)


def align(coll: pd.DataFrame, steps: pd.DataFrame | None, hosts: dict[int, str | None],
          policy: str = "auto") -> tuple[pd.DataFrame, dict[int, ClockOffset], list[str]]:
    """Match, estimate and apply clock offsets, split waits: the whole cross-rank pass."""
    matched, warnings = match_collectives(coll, steps)
    offsets = estimate_clock_offsets(matched, hosts, policy)
    corrected = apply_offsets(matched, offsets)
    return split_wait(corrected), offsets, warnings
