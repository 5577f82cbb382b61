"""`dstrace view --perfetto`: one trace of all ranks, read back as Perfetto's own proto says it is."""
from __future__ import annotations

import os
import shutil
from collections import Counter, defaultdict

import pytest

from tests.fixtures.processes import dstrace
from tests.fixtures.runs import manifests
from tests.viewing.conftest import CLOCK_AHEAD_US, LATE_US
from tests.viewing.helpers import read_merged


def merged(run_dir: str, out: str, *options: str):
    result = dstrace("view", run_dir, "--perfetto", "-o", out, *options)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == out
    return read_merged(out)


def assert_well_formed(m):
    assert not m.nesting_errors
    assert m.out_of_order == 0
    assert all(parent in m.processes for parent, _ in m.tracks.values())
    starts, ends = Counter(), Counter()
    rank_of = {}
    for s in m.slices:
        for f in s.flow_out:
            starts[f] += 1
            rank_of.setdefault(f, {})["out"] = (m.rank_of_track(s.track), s.begin)
        for f in s.flow_in:
            ends[f] += 1
            rank_of.setdefault(f, {})["in"] = (m.rank_of_track(s.track), s.begin)
    assert set(starts) == set(ends), "every flow has both ends"
    assert set(starts.values()) <= {1} and set(ends.values()) <= {1}
    for ends_of in rank_of.values():
        assert ends_of["out"][0] != ends_of["in"][0], "a flow links two ranks"
        assert ends_of["out"][1] <= ends_of["in"][1], "a flow runs forward in time"
    return len(starts)


def test_recorded_run_one_process_per_rank_with_ranges_and_links(recorded, tmp_path):
    m = merged(recorded, str(tmp_path / "all.pftrace"))
    hosts = {r: man["host"] for r, man in manifests(recorded).items()}
    assert sorted(name for _, name in m.processes.values()) == [f"rank {r} ({hosts[r]})" for r in sorted(hosts)]
    assert len({pid for pid, _ in m.processes.values()}) == len(hosts)
    flows = assert_well_formed(m)
    assert flows > 0
    for rank_name, slices in m.by_process().items():
        names = {s.name for s in slices}
        assert any(n.startswith("dstrace/step#") for n in names), rank_name
        assert any(n.startswith("dstrace/zero3.fetch") for n in names), rank_name
        linked = [s for s in slices if s.flow_out or s.flow_in]
        assert all(s.name.startswith("gloo:") and s.args["collective"] for s in linked)
        assert "AllGather" in {s.args["collective"] for s in linked}


def test_gpu_streams_under_their_rank_and_clocks_aligned(gpu_run, tmp_path):
    m = merged(gpu_run, str(tmp_path / "gpu.pftrace"))
    assert_well_formed(m)
    assert sorted(name for _, name in m.processes.values()) == ["rank 0 (node0)", "rank 1 (node1)"]
    tracks = defaultdict(set)
    for parent, name in m.tracks.values():
        tracks[m.processes[parent][1]].add(name)
    for rank_name in ("rank 0 (node0)", "rank 1 (node1)"):
        assert {"GPU 0 stream 7", "GPU 0 stream 20"} <= tracks[rank_name]
    by_instance = defaultdict(dict)
    for s in m.slices:
        if s.name.startswith("ncclDevKernel_AllGather"):
            by_instance[s.args["instance"]][m.rank_of_track(s.track)] = s
    assert len(by_instance) == 16
    for pair in by_instance.values():
        early, late = pair["rank 0 (node0)"], pair["rank 1 (node1)"]
        # rank 1's clock ran CLOCK_AHEAD_US ahead; aligned, both kernels end together as they did in truth
        assert abs(early.end - late.end) <= 1_000
        assert (late.begin - early.begin) == pytest.approx(LATE_US * 1e3, abs=1_000)
        assert early.args["waited_for_rank"] == 1 and early.args["wait_us"] == pytest.approx(LATE_US, abs=1)
        assert early.flow_out and early.flow_out == late.flow_in
    assert CLOCK_AHEAD_US > LATE_US  # unaligned, the ends would be far apart


def test_step_window_without_cpu_ops_is_smaller_and_still_linked(recorded, tmp_path):
    full = tmp_path / "full.pftrace"
    merged(recorded, str(full))
    window = tmp_path / "window.pftrace"
    m = merged(recorded, str(window), "--steps", "3:3", "--no-cpu-ops")
    assert assert_well_formed(m) > 0
    assert os.path.getsize(window) < os.path.getsize(full) / 4
    steps = {s.name for s in m.slices if s.name.startswith("dstrace/step#")}
    assert steps == {"dstrace/step#3"}
    assert {s.category for s in m.slices} <= {"user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy",
                                              "gpu_memset", "cpu_op"}
    assert all(s.args for s in m.slices if s.category == "cpu_op"), "only collectives keep CPU-op detail"


def trace_processor_binary() -> str | None:
    return os.environ.get("DSTRACE_TRACE_PROCESSOR") or shutil.which("trace_processor_shell") \
        or shutil.which("trace_processor")


def test_trace_processor_opens_the_merged_trace(gpu_run, tmp_path):
    binary = trace_processor_binary()
    if not binary:
        pytest.skip("no Perfetto trace_processor binary here (it cannot be downloaded); "
                    "set DSTRACE_TRACE_PROCESSOR to one to run this check")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    out = str(tmp_path / "gpu.pftrace")
    merged(gpu_run, out)
    tp = TraceProcessor(trace=out, config=TraceProcessorConfig(bin_path=binary))
    try:
        names = sorted(r.name for r in tp.query("select name from process where name like 'rank %'"))
        assert names == ["rank 0 (node0)", "rank 1 (node1)"]
        assert next(iter(tp.query("select count(*) as n from flow"))).n == 16
        assert next(iter(tp.query("select count(*) as n from slice where name like 'dstrace/step#%'"))).n == 8
    finally:
        tp.close()
