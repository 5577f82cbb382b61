"""256 ranks on 32 hosts, as kept reductions without their traces: what the analysis finds from them. How long it takes is
measured by bench/summaries_scale.py, not here."""
from __future__ import annotations

import json

from dstrace.testing.scale_run import RANKS_PER_HOST, write_run
from tests.fixtures.processes import dstrace

WORLD = 256
LATE_RANK = 77


def test_256_ranks_from_kept_reductions(tmp_path):
    true_offsets = write_run(str(tmp_path), world=WORLD, late_rank=LATE_RANK)
    report_path = tmp_path / "report.json"
    result = dstrace("analyze", str(tmp_path), "--format", "json", "-o", str(report_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["world_size"] == WORLD and report["missing_ranks"] == [] and len(report["ranks"]) == WORLD
    assert any(n.startswith(f"ranks 0-{WORLD - 1} read from their kept reductions") for n in report["notes"])
    clock = report["clock_alignment"]
    for rank, truth in true_offsets.items():
        assert abs(clock[str(rank)]["offset_us"] - truth) < 5.0, (rank, clock[str(rank)], truth)
    assert sum(c["applied"] for c in clock.values()) == WORLD - RANKS_PER_HOST
    (wait,) = [f for f in report["findings"] if f["id"] == "peer-wait"]
    late = wait["evidence"]["late_ranks"]
    assert max(late, key=lambda r: late[r]["caused_wait_us"]) == str(LATE_RANK)
    assert any(n.startswith("peer-wait: its ranks' traces, not in") and "node000_rank0." in n for n in report["notes"])


def test_the_run_holds_its_calls_once(tmp_path):
    """Each rank's collectives are a view of the run's one frame of calls (in rank order), and the run's frame of
    collectives adds its columns to that frame without copying the others: one copy of the calls in memory, not
    the loaded table beside a concatenation of it (0.4 GB each at 10,000 ranks)."""
    import numpy as np

    from dstrace.analysis.collectives import collective_events
    from dstrace.analysis.loading import load_run

    write_run(str(tmp_path), world=16, late_rank=5)
    run = load_run(str(tmp_path), progress=lambda message: None)
    calls = run.calls
    assert list(calls["rank"].unique()) == sorted(run.traces) and len(calls) == sum(
        len(t.reduced.collectives) for t in run.traces.values())
    for t in run.traces.values():
        assert np.shares_memory(t.reduced.collectives["ts"].to_numpy(), calls["ts"].to_numpy())
    coll = collective_events(run)
    for col in ("rank", "ts", "dur", "in_bytes"):
        assert np.shares_memory(coll[col].to_numpy(), calls[col].to_numpy()), col
