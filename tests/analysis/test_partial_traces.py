"""Traces dstrace did not record (issue 17): claims only where the evidence holds.

Each fixture has the shape of one of HolisticTraceAnalysis' public test traces (tests/data): a 2-of-128-rank
pipeline pair whose SendRecv kernels name no peer, an NCCL trace whose peer rank is absent, a pair whose
clocks the collectives cannot line up, a training trace with ProfilerStep ranges, an MTIA trace.
"""
import json
import shutil

import pytest

from dstrace.analysis.loading import load_run
from dstrace.analysis.pipeline import analyze
from dstrace.analysis.render import render
from dstrace.analysis.kept import write_run_reductions
from tests.fixtures.reports import analyze_dir, finding_ids, quiet
from tests.fixtures.traces import TraceBuilder

SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


def pipeline_pair(folder, world=128):
    """Ranks 0 and 1 of a 128-rank job, 10 SendRecv kernels each with no args (HTA's trace_filter pair):
    rank 1's kernels start 300 us after rank 0's, and some end later. Matched i-th to i-th, rank 0 would
    wait 300 us of each 800 us kernel for rank 1."""
    for r in (0, 1):
        b = TraceBuilder(r, world_size=world, run_id=None, dstrace_meta=None, host=None)
        b.host_range("ProfilerStep#551", 0.0, 10_000.0)
        b.host_range("ProfilerStep#552", 10_000.0, 10_000.0)
        for i in range(10):
            t = i * 2_000.0
            b.compute(t, 400.0)
            start = t + 500.0 + (300.0 if r == 1 else 0.0)
            b.kernel(SENDRECV, start, 800.0 - (300.0 if r == 1 else 0.0) + (200.0 if r == 1 and i % 3 == 0 else 0.0),
                     stream=84)
        b.write(str(folder), f"sampled_rank-{r}.json.gz")


def test_p2p_kernels_without_named_peers_are_not_matched(tmp_path):
    pipeline_pair(tmp_path)
    a = analyze_dir(tmp_path)
    assert "peer-wait" not in finding_ids(a)
    for r in (0, 1):
        sr = a.ranks[r].collectives["SendRecv"]
        assert sr.count == 10 and sr.unsplit_us == pytest.approx(sr.kernel_us)
        assert sr.wait_us == 0.0 and sr.busbw_transfer_GBps is None
        assert a.ranks[r].waited_for == {} and a.ranks[r].late_count == 0
    assert a.clock[1].matched == 0  # the i-th kernel of each rank is not taken for one call
    warning = next(w for w in a.warnings if "SendRecv" in w)
    assert "split withheld" in warning and "point-to-point" in warning and "do not name" in warning
    assert "\n" not in warning
    assert a.waits_over_time.empty
    text = render(a, "text")
    assert "withheld" in text and "[peer-wait]" not in text


def pipeline_with_peers(folder, late2=400.0, late1=100.0, n=4):
    """Ranks 0 -> 1 -> 2, each microbatch sent on: rank 1 receives from 0, then sends to 2. Rank 1 posts its
    receive `late1` after rank 0's send, rank 2 its receive `late2` after rank 1's send."""
    builders = [TraceBuilder(r, world_size=3) for r in range(3)]
    for i in range(n):
        t = i * 5_000.0
        builders[0].p2p("send", 1, t, 300.0 + late1)
        builders[1].p2p("recv", 0, t + late1, 300.0)
        builders[1].p2p("send", 2, t + 1_000.0, 300.0 + late2)
        builders[2].p2p("recv", 1, t + 1_000.0 + late2, 300.0)
        for b in builders:
            b.compute(t + 2_000.0, 100.0)
    for b in builders:
        b.write(str(folder))


def test_p2p_with_named_peers_is_matched_by_sender_and_receiver(tmp_path):
    pipeline_with_peers(tmp_path)
    a = analyze_dir(tmp_path)
    r0, r1, r2 = (a.ranks[r] for r in range(3))
    assert r0.wait_us == pytest.approx(4 * 100.0) and r0.waited_for == {1: pytest.approx(4 * 100.0)}
    assert r1.wait_us == pytest.approx(4 * 400.0) and r1.waited_for == {2: pytest.approx(4 * 400.0)}
    assert r2.wait_us == 0.0 and r2.late_count == 4
    assert all(s.unsplit_us == 0.0 for s in a.ranks.values())
    assert not any("withheld" in w for w in a.warnings)


def test_p2p_whose_peer_has_no_trace_is_withheld(tmp_path):
    pipeline_with_peers(tmp_path)
    next(tmp_path.glob("*rank2*")).unlink()
    a = analyze_dir(tmp_path)
    r1 = a.ranks[1]
    assert r1.wait_us == 0.0 and r1.unsplit_us == pytest.approx(4 * 700.0)  # its sends to rank 2
    assert a.ranks[0].wait_us == pytest.approx(4 * 100.0)  # 0 -> 1 is still a known pair
    assert any("point-to-point calls with rank 2, which have no trace here" in w for w in a.warnings)


def test_group_with_members_without_a_trace_gets_no_split(tmp_path):
    """Ranks 0 and 1 of 4 (HTA's NCCL trace whose peer is absent): an AllReduce over all four, where rank 1
    arrives 300 us late, and an AllGather of a group of ranks 0 and 1 only, where it arrives 100 us late."""
    for r in (0, 1):
        b = TraceBuilder(r, world_size=4)
        for i in range(8):
            t = i * 1_000.0
            late = 100.0 if r == 1 else 0.0
            b.nccl("AllReduce", t + 3 * late, 500.0 - 3 * late, 1000, 1000, pg="0", ranks=(0, 1, 2, 3))
            b.nccl("AllGather", t + 600.0 + late, 400.0 - late, 500, 1000, pg="5", ranks=(0, 1))
        b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    assert "peer-wait" not in finding_ids(a)  # 25% of the calls that can be split
    ar, ag = a.ranks[0].collectives["AllReduce"], a.ranks[0].collectives["AllGather"]
    assert ar.wait_us == 0.0 and ar.unsplit_us == pytest.approx(ar.kernel_us)
    assert ag.wait_us == pytest.approx(8 * 100.0) and ag.unsplit_us == 0.0  # its group is all here
    warning = next(w for w in a.warnings if "AllReduce" in w and "withheld" in w)
    assert "ranks 2, 3 (2 of 4)" in warning


def test_large_clock_residual_withholds_the_split(tmp_path):
    """Two hosts whose AllReduce kernels end 40 us apart either way: the clock cannot be told to better than
    40 us, against calls of 100 us, so rank 1's 50 us lateness is not a measurement."""
    for r, host in ((0, "hostA"), (1, "hostB")):
        b = TraceBuilder(r, host=host)
        for i in range(8):
            t = i * 1_000.0
            if r == 0:
                b.nccl("AllReduce", t, 100.0, 1000, 1000)
            else:
                b.nccl("AllReduce", t + 50.0, 50.0 + (40.0 if i % 2 else -40.0), 1000, 1000)
        b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    assert "peer-wait" not in finding_ids(a)
    assert a.ranks[0].wait_us == 0.0
    clock = a.clock[1]
    assert clock.residual_us == pytest.approx(40.0) and clock.call_median_us == pytest.approx(100.0)
    assert a.ranks[0].unsplit_us == pytest.approx(800.0)
    warning = next(w for w in a.warnings if "withheld" in w)
    assert "rank 1" in warning and "0.040 ms" in warning and "40%" in warning


def test_aligned_clocks_keep_the_split(zero3_dir):
    a = analyze_dir(zero3_dir)
    assert a.clock[1].residual_us == pytest.approx(0.0, abs=1e-3)
    assert a.ranks[0].unsplit_us == 0.0 and "peer-wait" in finding_ids(a)


def test_profiler_steps_are_steps_not_decode_steps(tmp_path):
    """A training trace (ProfilerStep#0-3, no generate()): all four are steps, none a prefill."""
    b = TraceBuilder(0, world_size=1, dstrace_meta=None)
    for s in range(4):
        b.host_range(f"ProfilerStep#{s}", s * 1_000.0, 900.0)
        b.compute(s * 1_000.0 + 100.0, 500.0)
    b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    assert a.steps.count == 4 and not a.steps.decode
    text = render(a, "text")
    assert "4 steps per call and rank, median" in text and "decode" not in text
    assert json.loads(render(a, "json"))["steps"]["decode"] is False


def test_dstrace_steps_are_decode_steps(zero3_dir):
    a = analyze_dir(zero3_dir)
    assert a.steps.decode and "3 decode steps" in render(a, "text")


def test_missing_ranks_are_written_as_ranges(tmp_path):
    pipeline_pair(tmp_path)
    a = analyze_dir(tmp_path)
    assert a.missing_ranks == list(range(2, 128))
    for fmt in ("text", "markdown", "html"):
        out = render(a, fmt)
        assert "ranks found 0, 1, missing ranks 2-127 (126 of 128 ranks)" in out
        assert "3, 4, 5" not in out


def mtia_run(folder):
    """Two ranks of an MTIA job (HTA's mtia traces): host ops, MTIA runtime calls and device events, c10d
    collectives on the host that rank 1 enters 300 us after rank 0."""
    for r in range(2):
        b = TraceBuilder(r, run_id=None, dstrace_meta=None)
        for i in range(6):
            t = i * 1_000.0
            b.host_range("aten::mul", t, 50.0, cat="cpu_op")
            b.host_range("runFunction - job_prep_and_submit_for_execution", t + 60.0, 20.0, cat="mtia_runtime",
                         args={"correlation": 1000 + i})
            b.device_event("mtia_ccp_events", "add-dtype_Float", t + 100.0, 200.0)
            b.device_event("mtia_ccp_events", "dma_request", t + 300.0, 20.0, args={"size": 4096})
            late = 300.0 if r == 1 else 0.0
            b.host_range("c10d::allreduce_", t + 400.0 + late, 500.0 - late, cat="cpu_op")
        b.write(str(folder))


def test_mtia_device_activity_is_not_read_as_a_cpu_only_trace(tmp_path):
    mtia_run(tmp_path)
    a = analyze_dir(tmp_path)
    assert a.device == "host-only"
    assert a.accelerators == {"MTIA": {"ranks": [0, 1], "events": {"mtia_ccp_events": 24, "mtia_runtime": 12}}}
    text = render(a, "text")
    assert "CPU-only" not in text and "MTIA traces, device timeline not analyzed" in text
    warning = next(w for w in a.warnings if w.startswith("MTIA device timeline not analyzed"))
    assert "host (CPU) time" in warning
    assert finding_ids(a).isdisjoint({"peer-wait", "communication-bound"})  # host ops of a device run are launches
    assert a.ranks[0].unsplit_us == pytest.approx(a.ranks[0].comm_us)
    doc = json.loads(render(a, "json"))
    assert doc["device"] == "host-only" and doc["accelerators"]["MTIA"]["ranks"] == [0, 1]


def test_xpu_kernels_are_device_activity_launched_by_xpu_runtime(tmp_path):
    """Intel XPU traces write kernels as `kernel`, launched by `xpu_runtime` calls: a GPU trace, and each
    collective's host time is its launch."""
    for r in range(2):
        b = TraceBuilder(r)
        b.compute(0.0, 100.0, launch_cat="xpu_runtime")
        b.nccl("AllReduce", 1_000.0, 100.0, 1000, 1000, launch_ts=400.0, launch_cat="xpu_runtime")
        b.write(str(tmp_path))
    run = load_run(str(tmp_path), progress=quiet)
    coll = run.traces[0].reduced.collectives
    assert float(coll["ts"].iloc[0] - coll["host_ts"].iloc[0]) == pytest.approx(600.0)
    assert run.device == "gpu" and not run.accelerators


def kept_alone(folder):
    """Each trace's kept reduction, as `dstrace record` writes it after the job, in a folder without the traces."""
    traces = {int(p.name.split("_rank")[1].split(".")[0]): p.name for p in sorted(folder.glob("*.pt.trace.json.gz"))}
    assert write_run_reductions(str(folder), traces, 3) == []
    alone = folder.parent / f"{folder.name}-kept"
    shutil.copytree(folder, alone, ignore=shutil.ignore_patterns("*.pt.trace.json.gz"))
    return str(alone)


def test_kept_reductions_match_p2p_and_see_the_accelerator_as_the_traces_do(tmp_path):
    peers, mtia = tmp_path / "peers", tmp_path / "mtia"
    peers.mkdir()
    mtia.mkdir()
    pipeline_with_peers(peers)
    mtia_run(mtia)
    traced, summed = analyze_dir(peers), analyze(load_run(kept_alone(peers), progress=quiet))
    for r in range(3):
        assert summed.ranks[r].wait_us == pytest.approx(traced.ranks[r].wait_us)
        assert summed.ranks[r].waited_for == pytest.approx(traced.ranks[r].waited_for)
        assert summed.ranks[r].unsplit_us == 0.0
    summed = analyze(load_run(kept_alone(mtia), progress=quiet))
    assert summed.device == "host-only" and set(summed.accelerators) == {"MTIA"}
