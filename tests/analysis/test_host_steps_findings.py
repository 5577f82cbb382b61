"""Host-bound detection, per-step numbers, and the manifest-based findings."""
import pytest

from dstrace.analysis.findings.host import HOST_BOUND_IDLE_FRACTION
from tests.fixtures.reports import analyze_dir, finding_ids
from tests.fixtures.runs import write_manifest
from tests.fixtures.traces import TraceBuilder, write_zero3_traces


def test_host_bound_names_where_the_host_is(zero3_dir):
    a = analyze_dir(zero3_dir)
    r1 = a.ranks[1]
    assert r1.idle_us / r1.span_us >= HOST_BOUND_IDLE_FRACTION
    assert r1.hta.temporal.idle_us == pytest.approx(r1.idle_us, rel=0.01)
    assert "host_wait" in r1.hta.idle_causes_us
    ranges = r1.host_time["in_dstrace_ranges"]
    assert next(iter(ranges)) == "zero3.fetch LlamaDecoderLayer"
    # each fetch range starts 20 us before its AllGather; the GPU is idle then, except before the first kernel
    assert ranges["zero3.fetch LlamaDecoderLayer"] == pytest.approx(15 * 20.0)
    host = next(f for f in a.findings if f.id == "host-bound")
    assert 1 in host.ranks
    assert "zero3.fetch LlamaDecoderLayer" in host.summary


def test_busy_gpu_is_not_host_bound(tmp_path):
    for r in range(2):
        b = TraceBuilder(r)
        t = 0.0
        for _ in range(50):
            b.compute(t, 100.0, launch_ts=t - 50.0)
            t += 101.0
        b.nccl("AllReduce", t, 10.0, 1000, 1000)
        b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    assert finding_ids(a).isdisjoint({"host-bound", "communication-bound", "peer-wait"})
    assert a.ranks[0].idle_us == pytest.approx(50.0)  # 1 us before each kernel but the first


def test_steps_and_zero3_gathers_model(zero3_dir):
    for r in range(2):
        write_manifest(str(zero3_dir), r, logical_bytes=8_000_000, step_ms=[50.0, 3.0, 3.2, 2.8])
    a = analyze_dir(zero3_dir)
    s = a.steps
    assert s.count == 3 and s.source == "dstrace/step ranges"
    assert s.ms_median == pytest.approx((4 * 700.0 + 200.0) / 1e3)  # start to next start
    assert s.gathered_bytes_median == 8_000_000 and s.gathered_source == "dstrace/zero3.allgather ranges"
    assert s.manifest_ms_median == pytest.approx(3.0)
    f = next(f for f in a.findings if f.id == "zero3-gathers-model-per-step")
    assert f.ranks == [0, 1] and f.evidence["ratio"] == pytest.approx(1.0)
    assert "8.00 MB" in f.summary


def test_no_zero3_finding_when_steps_gather_a_small_part(zero3_dir):
    for r in range(2):
        write_manifest(str(zero3_dir), r, logical_bytes=80_000_000)
    assert "zero3-gathers-model-per-step" not in finding_ids(analyze_dir(zero3_dir))


def test_no_zero3_finding_without_a_model_size(zero3_dir):
    a = analyze_dir(zero3_dir)
    assert a.steps.gathered_bytes_median == 8_000_000 and a.steps.model_bytes is None
    assert "zero3-gathers-model-per-step" not in finding_ids(a)


def test_tp_not_applied(zero3_dir):
    for r in range(2):
        write_manifest(str(zero3_dir), r, tp_request=6, effective_tp=1)
    f = next(f for f in analyze_dir(zero3_dir).findings if f.id == "tp-not-applied")
    assert f.ranks == [0, 1]
    assert "tensor parallel size 6" in f.summary
    assert f.evidence["ranks"]["0"]["requested"][0]["key"] == "tensor_parallel.tp_size"


def test_tp_applied_is_no_finding(zero3_dir):
    for r in range(2):
        write_manifest(str(zero3_dir), r, tp_request=2, effective_tp=2)
    assert finding_ids(analyze_dir(zero3_dir)).isdisjoint({"tp-not-applied", "tp-config-rejected"})


def test_tp_config_rejected(zero3_dir):
    write_manifest(str(zero3_dir), 0, tp_request=6, tp_error=True)
    write_manifest(str(zero3_dir), 1)
    f = next(f for f in analyze_dir(zero3_dir).findings if f.id == "tp-config-rejected")
    assert f.ranks == [0]
    assert "ValidationError" in f.summary and "\n" not in f.summary


def test_communication_bound_counts_transfer_not_peer_wait(tmp_path):
    write_zero3_traces(str(tmp_path), late_us=0.0)
    a = analyze_dir(tmp_path)
    f = next(f for f in a.findings if f.id == "communication-bound")
    assert f.ranks == [0, 1]
    e = f.evidence["ranks"]["0"]
    assert e["exposed_transfer_us"] == pytest.approx(16 * 200.0)
    assert e["hta_comm_comp_overlap_pct"] == 0.0
    assert "peer-wait" not in finding_ids(a)


def test_late_peer_is_peer_wait_not_communication_bound(zero3_dir):
    a = analyze_dir(zero3_dir)
    assert "peer-wait" in finding_ids(a) and "communication-bound" not in finding_ids(a)
