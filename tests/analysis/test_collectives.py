"""Bytes, kinds and bandwidths of collectives (nccl-tests formulas)."""
import pandas as pd
import pytest

from dstrace.analysis.collectives import busbw_factor
from dstrace.trace_names import dtype_bytes, kind_of
from tests.fixtures.reports import analyze_dir
from tests.fixtures.traces import TraceBuilder


@pytest.mark.parametrize("name,kind", [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllGather"),
    ("ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWorkElem)", "AllReduce"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ReduceScatter"),
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "Broadcast"),
    ("all_gather", "AllGather"), ("_allgather_base_", "AllGather"), ("allgather_into_tensor_coalesced", "AllGather"),
    ("allreduce_", "AllReduce"), ("_reduce_scatter_base", "ReduceScatter"), ("alltoall_base_", "AllToAll"),
    ("broadcast_", "Broadcast"), ("barrier", "Barrier"), ("wait", None), ("aten::mm", None),
])
def test_kind_of(name, kind):
    assert kind_of(name) == kind


@pytest.mark.parametrize("dtype,size", [("BFloat16", 2), ("c10::BFloat16", 2), ("Float", 4), ("float", 4),
                                        ("Half", 2), ("long int", 8), ("Byte", 1), ("Float8_e4m3fn", 1), ("weird", None)])
def test_dtype_bytes(dtype, size):
    assert dtype_bytes(dtype) == size


def test_busbw_factors_follow_nccl_tests():
    assert busbw_factor("AllGather", 4) == pytest.approx(0.75)
    assert busbw_factor("ReduceScatter", 4) == pytest.approx(0.75)
    assert busbw_factor("AllReduce", 4) == pytest.approx(1.5)
    assert busbw_factor("Broadcast", 4) == 1.0
    assert busbw_factor("AllReduce", 1) == 0.0


def test_bytes_and_bandwidth_from_nccl_args(tmp_path):
    builders = [TraceBuilder(r, world_size=4) for r in range(4)]
    for b in builders:
        # 1M bf16 out of 250k in: 2 MB gathered in 200 us, all ranks together (no wait)
        b.nccl("AllGather", 100.0, 200.0, 250_000, 1_000_000)
        b.nccl("AllReduce", 1000.0, 100.0, 500_000, 500_000, dtype="Float")
        b.compute(400.0, 50.0)
        b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    ag = a.ranks[2].collectives["AllGather"]
    assert ag.count == 1 and ag.bytes == 2_000_000
    assert ag.algbw_GBps == pytest.approx(10.0)
    assert ag.busbw_GBps == pytest.approx(7.5)
    assert ag.wait_us == 0.0 and ag.transfer_us == pytest.approx(200.0)
    ar = a.ranks[0].collectives["AllReduce"]
    assert ar.bytes == 2_000_000
    assert ar.algbw_GBps == pytest.approx(20.0)
    assert ar.busbw_GBps == pytest.approx(30.0)
    assert ar.group_size == 4


def test_cpu_collectives_from_record_param_comms(tmp_path):
    """CPU-only traces without gloo ops: record_param_comms carries the same args as NCCL kernels."""
    for r in range(2):
        b = TraceBuilder(r)
        b.host_range("record_param_comms", 100.0 + 50 * r, 300.0 - 50 * r, cat="cpu_op",
                     args={"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000,
                           "dtype": "Float", "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]"})
        b.host_range("aten::mm", 500.0, 100.0, cat="cpu_op")
        b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    assert a.device == "cpu"
    assert any("no GPU kernels" in n for n in a.notes)
    ar = a.ranks[0].collectives["AllReduce"]
    assert ar.bytes == 4000 and ar.count == 1
    assert ar.wait_us == pytest.approx(50.0)
    assert isinstance(a.waits_over_time, pd.DataFrame) and len(a.waits_over_time) == 2
