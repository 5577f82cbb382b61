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
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dstrace.analysis.model import ClockOffset



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


def _ends_by_rank(coll: pd.DataFrame) -> dict[int, pd.Series]:
    """Each rank's collective ends indexed by instance (the first, should a rank hold an instance twice)."""
    ends = coll.drop_duplicates(["instance", "rank"])
    return {int(r): g.set_index("instance")["end"] for r, g in ends.groupby("rank")}


def _end_differences(coll: pd.DataFrame, ends: dict[int, pd.Series], a: int) -> pd.DataFrame:
    """Offset of every rank b sharing a collective with rank a (b's clock - a's), and how many they share.

    Only the instances rank a took part in are read, so the cost follows a's collectives, not ranks squared.
    Causality bounds each estimate: no rank finishes a collective before every peer has started it, so
    the offset lies in [max(start_b - end_a), min(end_b - start_a)]. GPU kernels end together, so the
    median end difference is the estimate, kept inside those bounds. Host-side ops (gloo, c10d) do not:
    each finishes after its own share of host work, which differs by rank; there the middle of the bounds
    is the estimate, and the end median only when the bounds contradict each other.
    """
    mine = ends.get(a)
    if mine is None or mine.empty:
        return pd.DataFrame(columns=["diff", "n"])
    own = coll[coll["rank"] == a].drop_duplicates("instance").set_index("instance")
    rows = coll[coll["instance"].isin(mine.index)].drop_duplicates(["instance", "rank"])
    rows = rows[rows["rank"] != a]
    at = rows["instance"]
    by_rank = rows["rank"].to_numpy()
    frame = pd.DataFrame({
        "diff": rows["end"].to_numpy() - at.map(mine).to_numpy(),
        "lower": rows["ts"].to_numpy() - at.map(own["end"]).to_numpy(),
        "upper": rows["end"].to_numpy() - at.map(own["ts"]).to_numpy()}, index=by_rank).groupby(level=0)
    out = pd.DataFrame({"diff": frame["diff"].median(), "n": frame["diff"].size(),
                        "lower": frame["lower"].max(), "upper": frame["upper"].min()}).sort_index()
    consistent = out["lower"] <= out["upper"]
    kernels = "source" in own and bool((own["source"] == "nccl kernel").all())
    if kernels:
        out.loc[consistent, "diff"] = out.loc[consistent, "diff"].clip(out["lower"], out["upper"])
    else:
        out.loc[consistent, "diff"] = (out["lower"] + out["upper"])[consistent] / 2
    return out[["diff", "n"]]


def estimate_clock_offsets(coll: pd.DataFrame, hosts: dict[int, str | None],
                           policy: str = "auto") -> dict[int, ClockOffset]:
    """Per-rank offsets to the lowest rank's clock, chained through peers when a rank shares no group with it.

    auto applies an offset to ranks on another host than the reference (or of unknown host); always and
    never force it. Ranks sharing no collective with any aligned rank keep offset 0, marked unmatched.
    Breadth first from the reference: each rank is estimated against the first aligned rank it shares
    a collective with, so hundreds of ranks in one world group cost one pass over the reference's calls.
    """
    ranks = sorted(set(coll["rank"]) | set(hosts))
    if not ranks:
        return {}
    ref = ranks[0]
    ends = _ends_by_rank(coll) if not coll.empty else {}
    offsets: dict[int, ClockOffset] = {ref: ClockOffset(0.0, False, 0.0, 0, None)}
    estimate = {ref: 0.0}
    queue = deque([ref])
    while queue and len(estimate) < len(ranks):
        a = queue.popleft()
        for b, row in _end_differences(coll, ends, a).iterrows():
            b = int(b)
            if b in estimate:
                continue
            estimate[b] = estimate[a] + float(row["diff"])
            same_host = hosts.get(b) is not None and hosts.get(b) == hosts.get(ref)
            applied = policy == "always" or (policy == "auto" and not same_host)
            offsets[b] = ClockOffset(estimate[b], applied, None, int(row["n"]), a)
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
    ends = _ends_by_rank(coll)
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


@dataclass
class ClockAlignment:
    """Every rank of a run put on the reference rank's clock: what analyze, compare and view share."""
    offsets: dict[int, ClockOffset]
    collectives: pd.DataFrame  # matched across ranks, on the reference clock, split into wait and transfer
    warnings: list[str]

    def shift_us(self, rank: int) -> float:
        """What to subtract from `rank`'s trace timestamps (0 for ranks left on their own clock)."""
        o = self.offsets.get(rank)
        return o.offset_us if o is not None and o.applied else 0.0

    def to_reference(self, rank: int, ts_us):
        """A timestamp, or an array of them, of `rank`'s trace on the reference clock."""
        return ts_us - self.shift_us(rank)

    @property
    def worst_residual(self) -> tuple[int, float] | None:
        """(rank, us) of the largest residual among shifted ranks: how far apart aligned traces may still be."""
        shifted = [(r, o.residual_us) for r, o in self.offsets.items() if o.applied and o.residual_us is not None]
        return max(shifted, key=lambda ro: ro[1]) if shifted else None


def run_frames(run) -> tuple[pd.DataFrame, pd.DataFrame, dict[int, str | None]]:
    """Collectives, step ranges and hosts of a loaded run (from its traces or its rank summaries)."""
    from dstrace.analysis import collectives, steps

    step_df, _ = steps.step_ranges(run)
    return collectives.collective_events(run), step_df, {r: t.host for r, t in run.traces.items()}


def align_run(run, policy: str = "auto") -> ClockAlignment:
    """The clock alignment of a loaded run; compare and view call this rather than re-deriving offsets."""
    coll, step_df, hosts = run_frames(run)
    aligned, offsets, warnings = align(coll, step_df, hosts, policy)
    return ClockAlignment(offsets, aligned, warnings)


def alignment_note(offsets: dict[int, ClockOffset]) -> str | None:
    """One line for any number of ranks: how many were shifted, by how much, and the residual left."""
    shifted = {r: o for r, o in offsets.items() if o.applied}
    if not shifted:
        return None
    values = [o.offset_us for o in shifted.values()]
    residuals = [o.residual_us for o in shifted.values() if o.residual_us is not None]
    line = (f"clocks aligned on the ends of matched collectives: {len(shifted)} rank(s) shifted by "
            f"{min(values) / 1e3:+.3f} to {max(values) / 1e3:+.3f} ms")
    if residuals:
        worst = max(shifted, key=lambda r: shifted[r].residual_us or 0.0)
        line += (f"; residual median {float(np.median(residuals)):.1f} us, worst {max(residuals):.1f} us "
                 f"(rank {worst})")
    return line
