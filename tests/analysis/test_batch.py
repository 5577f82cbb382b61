"""The cross-rank pass as batch operations over all ranks: each batch step gives what the per-rank pass it
replaced gave, to the bit, on inputs with the awkward cases (ranks without steps, a rank without calls,
ties, gaps, layouts that differ by rank, a rank whose frame is incomplete)."""
import numpy as np
import pandas as pd

from dstrace.analysis import kept, matching, peer_wait, rank_collectives, reduction
from dstrace.analysis.reduction import RankReduction
from dstrace.analysis.steps import _count_before


def _calls(seed=0, ranks=6, per_rank=50):
    rng = np.random.default_rng(seed)
    rows = pd.DataFrame({"rank": rng.integers(0, ranks, ranks * per_rank),
                         "host_ts": rng.choice([*np.arange(0, 400, 7.0), np.nan], ranks * per_rank),
                         "dur": rng.uniform(0, 9, ranks * per_rank)})
    rows["wait_us"] = rows["dur"].where(rng.random(len(rows)) > 0.2)  # gaps: withheld splits
    return rows


def _steps(ranks=(0, 1, 3, 4)):  # ranks 2 and 5 have none; rank 4's steps start at the same time twice
    out = []
    for r in ranks:
        starts = [0.0, 0.0, 150.0] if r == 4 else [10.0 * r, 100.0 + r, 250.0]
        out += [(r, i, ts, ts + 60.0) for i, ts in enumerate(starts)]
    return pd.DataFrame(out, columns=["rank", "step", "ts", "end"])


def test_steps_of_calls_as_one_search_per_rank():
    coll, steps = _calls(), _steps()
    want = pd.Series(-1, index=coll.index, dtype="int64")
    for rank, st in steps.groupby("rank"):  # the per-rank pass it replaced (ties aside: stable order)
        mask = coll["rank"] == rank
        st = st.sort_values("ts", kind="stable")
        host = coll.loc[mask, "host_ts"].to_numpy()
        idx = np.searchsorted(st["ts"].to_numpy(), host, side="right") - 1
        ok = (idx >= 0) & (host < st["end"].to_numpy()[np.clip(idx, 0, None)])
        want.loc[mask] = np.where(ok, st["step"].to_numpy()[np.clip(idx, 0, None)], -1)
    got = matching.assign_steps(coll, steps)
    assert (got >= 0).sum() > 50 and (got == -1).sum() > 50
    pd.testing.assert_series_equal(got, want)


def test_ranges_before_each_step_start_per_rank():
    rng = np.random.default_rng(1)
    ranks = np.sort(rng.integers(0, 5, 200))
    ts = np.concatenate([np.sort(rng.choice(np.arange(0, 100, 5.0), (ranks == r).sum())) for r in range(5)])
    at_rank, at = rng.integers(0, 7, 300), rng.choice(np.arange(0, 100, 5.0), 300)  # ranks 5, 6: no ranges
    want = [np.searchsorted(ranks, r) + np.searchsorted(ts[ranks == r], q, side="left") for r, q in zip(at_rank, at)]
    assert list(_count_before(ranks, ts, at_rank, at)) == want


def test_rank_sums_are_series_sums_to_the_bit():
    coll = _calls(2, ranks=9, per_rank=700)
    got = peer_wait.rank_sums(coll["rank"], coll["wait_us"])
    assert got == {int(r): g["wait_us"].sum() for r, g in coll.groupby("rank")}


def _reduction(n, object_kind=False, seed=0):
    rng = np.random.default_rng(seed)
    kinds = pd.Series(rng.choice(["AllGather", "AllReduce"], n), dtype=object if object_kind else "str")
    ts = rng.uniform(0, 1e6, n)
    collectives = pd.DataFrame({
        "kind": kinds, "name": kinds, "ts": ts, "dur": 5.0, "end": ts + 5.0, "host_ts": ts - 1.0,
        "in_bytes": rng.integers(0, 1 << 20, n), "out_bytes": rng.integers(0, 1 << 20, n), "group_size": 4.0,
        "pg_name": "world", "pg_ranks": "[0, 1, 2, 3]", "source": "nccl kernel",
        "p2p_role": pd.Series([np.nan] * n, dtype=object),  # a text column's gaps read back as NaN
        "p2p_peer": pd.Series([None if i % 3 else i for i in range(n)], dtype=object)},
        columns=rank_collectives.RANK_COLUMNS)
    steps = pd.DataFrame({"source": pd.Series(["dstrace/step ranges"] * 2, dtype="str"), "step": [0, 1],
                          "ts": [0.0, 10.0], "end": [10.0, 20.0], "ms": [0.01, 0.01]}, columns=reduction.STEP_COLUMNS)
    return RankReduction(has_gpu=True, collectives=collectives, steps=steps,
                         gathers=pd.DataFrame({"ts": [1.0] * (n % 4), "bytes": [8] * (n % 4)}),
                         utilization={"span_us": float(n), "idle_us": 0.0, "exposed_comm_us": 0.0, "busy_us": {}})


def test_kept_reductions_read_together_as_each_was_kept(tmp_path, monkeypatch):
    """Files of different column layouts, over several batches, one of them cut short: each rank reads as
    the reduction that was saved, and the damaged one alone as a one-line problem."""
    monkeypatch.setattr(kept, "BATCH_RANKS", 2)
    made = {n: _reduction(n, object_kind=(n == 7), seed=n) for n in (5, 0, 7, 12, 3)}
    paths = []
    for n, r in made.items():
        paths.append(str(tmp_path / f"rank{n}.reduction.arrow"))
        kept.KeptReduction(r, {"n": n}, f"rank{n}.pt.trace.json", {"made": n}).save(paths[-1])
    data = open(paths[3], "rb").read()
    open(paths[3], "wb").write(data[: len(data) // 2])
    got = kept.load_many(paths)
    assert isinstance(got[3], str) and "\n" not in got[3]
    for (n, want), batch in zip(made.items(), got):
        if isinstance(batch, str):
            continue
        assert batch.meta == {"n": n} and batch.trace_file == f"rank{n}.pt.trace.json"
        assert batch.reduced.utilization == want.utilization
        for name in kept.FRAMES:
            a, b = getattr(want, name), getattr(batch.reduced, name)
            pd.testing.assert_frame_equal(b, a)
            assert list(b.index) == list(range(len(a)))
