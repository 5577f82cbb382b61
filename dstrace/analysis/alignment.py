"""Cross-rank alignment: the same collective on every rank of its group, clock offsets, wait vs transfer.

A collective's n-th call of a kind in a process group is the same collective on every member rank
(within a dstrace step when all ranks have step ranges, which survives ranks whose windows start at
different calls). Once matched:

* clocks: a collective's kernels finish together on all ranks (the last byte arrives everywhere at
  about the same time), so the median of (end on rank r - end on the reference rank) estimates rank
  r's clock offset. Ranks on the reference's host share its clock and are left alone unless asked;
* wait: the kernel of a rank that arrives early spins until the last peer arrives. Its time splits into
  wait = (last start among the peers - own start) and transfer = the rest.

Point-to-point calls (send/recv) are no group collective: the k-th send from rank a to rank b is the
k-th receive on b from a, so they are matched by (sender, receiver) and order, and only where the
trace names the peer. The split is withheld (`withheld` says why, `split` is False, wait and transfer
NaN) where it would be a guess: a point-to-point call whose peer is unnamed or has no trace, a call
whose group has members without a trace (the last to arrive may be one of them), a call no rank
matched, and every call of a rank whose clock residual is large against the calls it was measured on.
"""
from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import pandas as pd

from dstrace.analysis.model import ClockOffset
from dstrace.rankset import ranks_text
from dstrace.trace_names import P2P_KINDS

PEER_UNNAMED = "p2p-peer-unnamed"
PEER_ABSENT = "p2p-peer-absent"
GROUP_ABSENT = "group-member-absent"
UNMATCHED = "unmatched"
CLOCK = "clock-residual"
GIVEN = "given"
"""Why a call's wait/transfer split is withheld (the `withheld` column)."""

RESIDUAL_MAX_SHARE = 0.25
"""A rank's clock may be off by about its residual, and so may each start time the split compares. Above a
quarter of the typical call it was measured on, the wait a call shows could be mostly clock error. On the
H200 reference runs the residual is 6-8 us against calls of 70 us and more (under 10%); HTA's 2-rank
pipeline pair, matched kernel by kernel without peers, left 21 ms against calls of 30-60 ms."""


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


def _match_keys(coll: pd.DataFrame, present: set[int]) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(key, members expected, withheld) per call. Group collectives are keyed by group and kind; a
    point-to-point call by its direction (sender -> receiver) when the trace names the peer and the peer
    has a trace, else by itself alone (it matches nothing)."""
    key = coll["group"].astype(str) + "\x1f" + coll["kind"].astype(str)
    withheld = pd.Series(None, index=coll.index, dtype=object)
    p2p = coll["kind"].isin(P2P_KINDS)
    if p2p.any():
        calls = coll[p2p]
        role, peer, rank = calls["p2p_role"], calls["p2p_peer"], calls["rank"]
        named = role.notna() & peer.notna() & (peer != rank)
        paired = named & peer.isin(present)
        sender = np.where(role == "send", rank, peer)
        receiver = np.where(role == "send", peer, rank)
        key[p2p] = [f"p2p {int(a)}->{int(b)}" if ok else f"p2p alone #{i}"
                    for a, b, ok, i in zip(sender, receiver, paired, calls.index)]
        withheld[calls.index[~named]] = PEER_UNNAMED
        withheld[calls.index[named & ~paired]] = PEER_ABSENT
    return key, coll["group_size"].where(~p2p, 2), withheld


def _lacking(coll: pd.DataFrame, present: set[int]) -> dict[str, list[int] | None]:
    """Per group, its members without a trace; None when the traces do not list the group's ranks (only
    its size)."""
    out = {}
    groups = coll.drop_duplicates("group")[["group", "group_ranks", "group_size"]]
    for group, ranks, size in groups.itertuples(index=False):
        out[group] = sorted(set(ranks) - present) if len(ranks) == size else None
    return out


def match_collectives(coll: pd.DataFrame, steps: pd.DataFrame | None = None,
                      ranks=None) -> tuple[pd.DataFrame, list[str]]:
    """Give each call an `instance` id shared by the same call on all ranks that took part in it, and say in
    `withheld` which calls cannot have a wait/transfer split from what matched. `ranks`: the ranks with a
    trace (default: those with collectives)."""
    warnings: list[str] = []
    coll = coll.copy()
    present = set(coll["rank"]) if ranks is None else set(ranks)
    ranks_with_steps = set(steps["rank"]) if steps is not None and not steps.empty else set()
    use_steps = bool(ranks_with_steps) and ranks_with_steps >= set(coll["rank"])
    coll["step"] = assign_steps(coll, steps) if use_steps else -1
    coll = coll.sort_values(["rank", "ts"], kind="stable")
    coll["match"], expected, coll["withheld"] = _match_keys(coll, present)
    keys = ["match", "step"]
    coll["ordinal"] = coll.groupby(["rank"] + keys).cumcount()
    counts = coll.groupby(keys + ["rank"]).size().unstack("rank")
    for (match, step), row in counts.iterrows():
        present_counts = row.dropna()
        if present_counts.nunique() > 1:
            where = f" in step {step}" if step >= 0 else ""
            detail = ", ".join(f"rank {int(r)}: {int(c)}" for r, c in present_counts.items())
            what = (f"send/recv counts differ on {match[4:]}" if match.startswith("p2p ")
                    else "{1} counts differ across ranks of group {0}".format(*match.split("\x1f")))
            warnings.append(f"{what}{where} ({detail}); matched in order, the extra calls' wait/transfer split "
                            "is withheld")
    coll["instance"] = coll.groupby(keys + ["ordinal"]).ngroup()
    members = coll.groupby("instance")["rank"].transform("nunique")
    short = coll["withheld"].isna() & (members < expected)
    lacking = {g: ranks is None or bool(ranks) for g, ranks in _lacking(coll, present).items()}
    absent = coll["group"].map(lacking).astype(bool) & ~coll["kind"].isin(P2P_KINDS)
    coll.loc[short & absent, "withheld"] = GROUP_ABSENT
    coll.loc[short & coll["withheld"].isna(), "withheld"] = UNMATCHED
    return coll.drop(columns=["match"]), warnings


def _by_rank(coll: pd.DataFrame, column: str = "end") -> dict[int, pd.Series]:
    """Each rank's `column` (collective ends by default) indexed by instance (the first, should a rank hold
    an instance twice)."""
    rows = coll.drop_duplicates(["instance", "rank"])
    return {int(r): g.set_index("instance")[column] for r, g in rows.groupby("rank")}


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
    ends = _by_rank(coll) if not coll.empty else {}
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
    """Shift ts/end/host_ts of ranks whose offset is applied, then record each rank's residual and the
    median length of the calls it was measured on (per call, the longer of the two ranks' durations)."""
    coll = coll.copy()
    shift = coll["rank"].map({r: (o.offset_us if o.applied else 0.0) for r, o in offsets.items()}).fillna(0.0)
    for col in ("ts", "end", "host_ts"):
        coll[col] = coll[col] - shift
    if coll.empty:
        return coll
    ends, durs = _by_rank(coll), _by_rank(coll, "dur")
    for r, o in offsets.items():
        if o.via is None or r not in ends or o.via not in ends:
            continue
        d = (ends[r] - ends[o.via]).dropna()
        # the via-rank may itself be shifted; the residual is measured on corrected clocks of both
        o.residual_us = float(d.abs().median()) if len(d) else None
        calls = pd.concat([durs[r], durs[o.via]], axis=1, join="inner").max(axis=1)
        o.call_median_us = float(calls.median()) if len(calls) else None
    return coll


def doubtful_clocks(coll: pd.DataFrame, offsets: dict[int, ClockOffset]) -> dict[int, ClockOffset]:
    """Ranks whose residual exceeds RESIDUAL_MAX_SHARE of the calls it was measured on. Only where the calls
    are kernels: a kernel ends when the last byte arrives everywhere, so its ends must line up; host-side
    ops (gloo) end after their own work, and their residual measures that, not the clock."""
    kernel_ranks = set(coll.loc[coll["source"] == "nccl kernel", "rank"])
    return {r: o for r, o in offsets.items()
            if r in kernel_ranks and o.residual_us is not None and o.call_median_us
            and o.residual_us > RESIDUAL_MAX_SHARE * o.call_median_us}


def withhold(coll: pd.DataFrame, offsets: dict[int, ClockOffset], given: str | None = None) -> pd.DataFrame:
    """Withhold the split of every call of a rank whose clock is doubtful (and of its matched calls on other
    ranks, whose split compares against its starts), or of every call when `given` says why."""
    coll = coll.copy()
    if given is not None:
        coll["withheld"] = GIVEN
        return coll
    doubtful = doubtful_clocks(coll, offsets)
    if doubtful:
        touched = coll["instance"].isin(set(coll.loc[coll["rank"].isin(doubtful), "instance"]))
        coll.loc[touched & coll["withheld"].isna(), "withheld"] = CLOCK
    return coll


def split_wait(coll: pd.DataFrame) -> pd.DataFrame:
    """wait_us = last start among the instance's ranks - own start (within own duration); transfer = rest.

    `split` is False, and wait_us and transfer_us NaN, for calls whose split is withheld. `waited_for` is
    the rank that arrived last (the one this rank waited on), or -1 for the last rank itself, for calls
    no peer was matched to and for calls whose split is withheld.
    """
    coll = coll.copy()
    if coll.empty:
        for col in ("wait_us", "transfer_us"):
            coll[col] = pd.Series(dtype=float)
        coll["waited_for"] = pd.Series(dtype="int64")
        coll["peers"] = pd.Series(dtype="int64")
        coll["split"] = pd.Series(dtype=bool)
        return coll
    if "withheld" not in coll:
        coll["withheld"] = None
    ok = coll["withheld"].isna()
    grp = coll.groupby("instance")
    last_start = grp["ts"].transform("max")
    coll["peers"] = grp["rank"].transform("size") - 1
    last_idx = coll.loc[grp["ts"].idxmax()].set_index("instance")["rank"]
    wait = np.clip(last_start - coll["ts"], 0.0, coll["dur"]).where(coll["peers"] > 0, 0.0)
    coll["wait_us"] = wait.where(ok)
    coll["transfer_us"] = coll["dur"] - coll["wait_us"]
    last_rank = coll["instance"].map(last_idx)
    waited = ok & (coll["peers"] > 0) & (last_rank != coll["rank"])
    coll["waited_for"] = np.where(waited, last_rank, -1).astype("int64")
    coll["split"] = ok
    return coll


def wait_summary(coll: pd.DataFrame) -> dict[int, dict]:
    """Per rank: wait, comm time (and the part of it whose split is withheld), who it waited for, and how
    often it was the one the others waited on."""
    out: dict[int, dict] = defaultdict(lambda: {"wait_us": 0.0, "comm_us": 0.0, "unsplit_us": 0.0, "waited_for": {},
                                                "late_count": 0, "caused_wait_us": 0.0})
    if coll.empty:
        return {}
    for rank, g in coll.groupby("rank"):
        s = out[int(rank)]
        s["wait_us"] = float(g["wait_us"].sum())
        s["comm_us"] = float(g["dur"].sum())
        s["unsplit_us"] = float(g.loc[~g["split"].astype(bool), "dur"].sum())
        waited = g[g["waited_for"] >= 0].groupby("waited_for")["wait_us"].sum()
        s["waited_for"] = {int(p): float(w) for p, w in waited.items() if w > 0}
    caused = coll[coll["waited_for"] >= 0].groupby("waited_for").agg(
        n=("instance", "nunique"), wait=("wait_us", "sum"))
    for rank, row in caused.iterrows():
        out[int(rank)]["late_count"] = int(row["n"])
        out[int(rank)]["caused_wait_us"] = float(row["wait"])
    return dict(out)


def withheld_warnings(coll: pd.DataFrame, offsets: dict[int, ClockOffset], present,
                      given: str | None = None) -> list[str]:
    """One line per reason the split is withheld: how many calls of which kinds on which ranks, and why.
    Unmatched calls are left to the count warning of `match_collectives`."""
    out = []
    if coll.empty or "withheld" not in coll:
        return out
    present = set(present)
    tail = "; peer-wait and communication-bound leave them out"
    for reason, rows in coll[coll["withheld"].notna()].groupby("withheld"):
        if reason == UNMATCHED:
            continue
        kinds = ", ".join(sorted(set(rows["kind"])))
        head = f"wait/transfer split withheld for {len(rows)} {kinds} call(s) on {ranks_text(set(rows['rank']))}: "
        if reason == PEER_UNNAMED:
            why = ("point-to-point calls whose peer the traces do not name (no Src Rank / Dst Rank): which call "
                   "on which rank is the other side cannot be told, and ranks without a trace may be it")
        elif reason == PEER_ABSENT:
            peers = ranks_text(set(rows["p2p_peer"].astype(int)))
            why = f"point-to-point calls with {peers}, which have no trace here"
        elif reason == GROUP_ABSENT:
            why = _absent_members(rows, present)
        elif reason == CLOCK:
            r, o = max(doubtful_clocks(coll, offsets).items(),
                       key=lambda ro: ro[1].residual_us / ro[1].call_median_us)
            why = (f"after clock alignment rank {r}'s collective ends still differ from rank {o.via}'s by "
                   f"{o.residual_us / 1e3:.3f} ms (median), {o.residual_us / o.call_median_us:.0%} of the median "
                   f"call they were measured on ({o.call_median_us / 1e3:.3f} ms): start times are not comparable "
                   "to that precision, or the calls were matched wrongly")
        else:
            why = given or "withheld"
        out.append(head + why + tail)
    return out


def _absent_members(rows: pd.DataFrame, present: set[int]) -> str:
    """Which members of the calls' groups have no trace, by name when the traces list the groups' ranks."""
    lacking = _lacking(rows, present)
    size = int(rows["group_size"].max())
    if any(ranks is None for ranks in lacking.values()):
        return (f"their process group has {size} members and some have no trace here: the last member to arrive "
                "may be one of them")
    absent = set().union(*lacking.values())
    return (f"their process group includes {ranks_text(absent)} ({len(absent)} of {size}), without a trace here: "
            "the last member to arrive may be one of them")


def align(coll: pd.DataFrame, steps: pd.DataFrame | None, hosts: dict[int, str | None],
          policy: str = "auto",
          withhold_all: str | None = None) -> tuple[pd.DataFrame, dict[int, ClockOffset], list[str]]:
    """Match, estimate and apply clock offsets, split waits: the whole cross-rank pass. `hosts` names every
    rank with a trace; `withhold_all`, when given, is why no call gets a split."""
    matched, warnings = match_collectives(coll, steps, hosts)
    offsets = estimate_clock_offsets(matched, hosts, policy)
    corrected = withhold(apply_offsets(matched, offsets), offsets, withhold_all)
    warnings += withheld_warnings(corrected, offsets, hosts, withhold_all)
    return split_wait(corrected), offsets, warnings


def host_only_reason(run) -> str | None:
    """Why no call of a run gets a split when only its host side is read (`LoadedRun.device` "host-only")."""
    if run.device != "host-only":
        return None
    return f"host-side ops of {' and '.join(run.accelerators)} traces, which launch the transfer rather than do it"


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
