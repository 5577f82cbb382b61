"""Which calls on different ranks are the same collective, and why a call's wait/transfer split cannot be
told.

A collective's n-th call of a kind in a process group is the same collective on every member rank
(within a dstrace step when all ranks have step ranges, which survives ranks whose windows start at
different calls). Point-to-point calls (send/recv) are no group collective: the k-th send from rank a
to rank b is the k-th receive on b from a, so they are matched by (sender, receiver) and order, and only
where the trace names the peer. Calls that cannot be matched are marked with the reason (`withheld`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dstrace.analysis.collectives import in_rank_ts_order
from dstrace.trace_names import P2P_KINDS, UNNAMED_NCCL

PEER_UNNAMED = "p2p-peer-unnamed"
PEER_ABSENT = "p2p-peer-absent"
KIND_UNNAMED = "kind-unnamed"
GROUP_ABSENT = "group-member-absent"
UNMATCHED = "unmatched"
CLOCK = "clock-residual"
GIVEN = "given"
"""Why a call's wait/transfer split is withheld (the `withheld` column)."""


def assign_steps(coll: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """The step (dstrace/step#n) whose host range holds each collective's launch, -1 when none: the last step
    of the same rank starting at or before it, kept when the launch is before that step's end (one
    `merge_asof` over all ranks)."""
    out = pd.Series(-1, index=coll.index, dtype="int64")
    if steps is None or steps.empty or coll.empty:
        return out
    launches = coll.loc[coll["host_ts"].notna(), ["rank", "host_ts"]]
    launches = launches.assign(rank=launches["rank"].astype("int64"), row=launches.index).sort_values(
        "host_ts", kind="stable")
    ranges = steps[["rank", "ts", "end", "step"]].astype({"rank": "int64", "ts": "float64"}).sort_values(
        ["ts"], kind="stable")
    found = pd.merge_asof(launches, ranges, left_on="host_ts", right_on="ts", by="rank", direction="backward")
    inside = found["host_ts"] < found["end"]
    out.loc[found.loc[inside, "row"].to_numpy()] = found.loc[inside, "step"].to_numpy().astype("int64")
    return out


def _codes(column: pd.Series) -> tuple[np.ndarray, list]:
    """`pd.factorize` of a column without gaps whose rows share a few value objects (each rank's decoded
    texts): by identity first, then by value over the distinct objects. pandas hashes each row's text anew,
    seconds at millions of calls."""
    values = column.to_numpy(dtype=object)
    by_id, ids = pd.factorize(np.fromiter(map(id, values), dtype=np.int64, count=len(values)))
    first = np.empty(len(ids), dtype=np.int64)
    first[by_id[::-1]] = np.arange(len(values) - 1, -1, -1)
    index: dict = {}
    remap = np.array([index.setdefault(values[i], len(index)) for i in first], dtype=np.int64)
    return remap[by_id], list(index)


def _group_lacks(group: pd.Series, lacking: dict) -> pd.Series:
    """`group.map(lacking).astype(bool)` (a group not in `lacking` reads True, as NaN does), looked up once per
    distinct group rather than once per call."""
    if group.isna().any():
        return group.map(lacking).astype(bool)
    codes, values = _codes(group)
    per_value = np.array([bool(lacking.get(v, True)) for v in values], dtype=bool)
    return pd.Series(per_value[codes], index=group.index)


def _group_kind_keys(coll: pd.DataFrame) -> pd.Series:
    """"<group>\x1f<kind>" per call as text, one object per distinct pair."""
    if coll["group"].isna().any() or coll["kind"].isna().any():
        group, kind = coll["group"].astype(str), coll["kind"].astype(str)
        return group + "\x1f" + kind
    # as text (`astype(str)`) once per distinct value, not per call
    g, groups = _codes(coll["group"])
    k, kinds = _codes(coll["kind"])
    groups, kinds = [str(v) for v in groups], [str(v) for v in kinds]
    pairs, inverse = np.unique(g * max(len(kinds), 1) + k, return_inverse=True)
    lookup = np.array([f"{groups[p // max(len(kinds), 1)]}\x1f{kinds[p % max(len(kinds), 1)]}" for p in pairs],
                      dtype=object)
    return pd.Series(pd.array(lookup[inverse.reshape(-1)], dtype="str"), index=coll.index)


def _match_keys(coll: pd.DataFrame, present: set[int]) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(key, members expected, withheld) per call. Group collectives are keyed by group and kind; a
    point-to-point call by its direction (sender -> receiver) when the trace names the peer and the peer
    has a trace, else by itself alone (it matches nothing), as is an NCCL kernel that names no kind."""
    key = _group_kind_keys(coll)
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
    unnamed = coll["kind"] == UNNAMED_NCCL
    if unnamed.any():
        key[unnamed] = [f"unnamed alone #{i}" for i in coll.index[unnamed]]
        withheld[unnamed] = KIND_UNNAMED
    return key, coll["group_size"].where(~p2p, 2), withheld


def absent_members(coll: pd.DataFrame, present: set[int]) -> dict[str, list[int] | None]:
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
    coll = coll.copy(deep=False)  # columns are added, none written into: the caller's frame's are shared
    present = set(coll["rank"]) if ranks is None else set(ranks)
    ranks_with_steps = set(steps["rank"]) if steps is not None and not steps.empty else set()
    use_steps = bool(ranks_with_steps) and ranks_with_steps >= set(coll["rank"])
    coll["step"] = assign_steps(coll, steps) if use_steps else -1
    if not in_rank_ts_order(coll):  # `collective_events` hands them over sorted: no copy of every column
        coll = coll.sort_values(["rank", "ts"], kind="stable")
    keyed, expected, coll["withheld"] = _match_keys(coll, present)
    codes, texts = pd.factorize(keyed, sort=True)
    # grouped by three times below: as integers in the texts' order (the same groups, numbered the same), not
    # millions of texts hashed each time; a key without text (none is made) keeps the text
    coll["match"] = codes if (codes >= 0).all() else keyed
    text_of = (lambda m: texts[m]) if (codes >= 0).all() else (lambda m: m)
    del keyed, codes  # in `coll` now: not held twice while it is grouped
    keys = ["match", "step"]
    coll["ordinal"] = coll.groupby(["rank"] + keys).cumcount()
    # calls per (key, step, rank), long: a (key, step) x rank table is 0.3 GB at 10,000 ranks of 1,250 groups
    counts = coll.groupby(keys + ["rank"]).size()
    by_key = counts.groupby(level=[0, 1])
    differ = by_key.min() != by_key.max()
    for key, step in differ.index[differ.to_numpy()]:  # counts that differ by rank
        row, match = counts.loc[(key, step)], text_of(key)
        where = f" in step {step}" if step >= 0 else ""
        detail = ", ".join(f"rank {int(r)}: {int(c)}" for r, c in row.items())
        what = (f"send/recv counts differ on {match[4:]}" if match.startswith("p2p ")
                else "{1} counts differ across ranks of group {0}".format(*match.split("\x1f")))
        warnings.append(f"{what}{where} ({detail}); matched in order, the extra calls' wait/transfer split "
                        "is withheld")
    coll["instance"] = coll.groupby(keys + ["ordinal"]).ngroup()
    # how many ranks took part in each instance: its calls, one per rank (a rank's calls of one key and step
    # have distinct ordinals), counted without `nunique`'s sorted copies of every call
    instance = coll["instance"].to_numpy()
    members = pd.Series(np.bincount(instance)[instance], index=coll.index)
    short = coll["withheld"].isna() & (members < expected)
    lacking = {g: ranks is None or bool(ranks) for g, ranks in absent_members(coll, present).items()}
    absent = _group_lacks(coll["group"], lacking) & ~coll["kind"].isin(P2P_KINDS)
    coll.loc[short & absent, "withheld"] = GROUP_ABSENT
    coll.loc[short & coll["withheld"].isna(), "withheld"] = UNMATCHED
    return coll.drop(columns=["match", "ordinal"]), warnings  # 30 MB each at 10,000 ranks, read by nothing after
