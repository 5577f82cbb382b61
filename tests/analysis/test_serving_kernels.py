"""Serving engines' own all-reduce kernels (vLLM, SGLang, TensorRT-LLM) counted as collectives in a trace the
user brings: names as their sources define them (never seen in a real trace here: docs/workloads.md)."""
import pytest

from dstrace.trace_names import collective_kernel_kind
from tests.fixtures.reports import analyze_dir
from tests.fixtures.traces import TraceBuilder

VLLM_1STAGE = ("void vllm::cross_device_reduce_1stage<c10::BFloat16, 2>(vllm::RankData*, vllm::RankSignals, "
               "vllm::Signal*, c10::BFloat16*, int, int)")


@pytest.mark.parametrize("name,kind", [
    (VLLM_1STAGE, "AllReduce"),
    ("void vllm::cross_device_reduce_2stage<__half, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __half*, int, int)",
     "AllReduce"),
    ("void vllm::cross_device_reduce_half_butterfly<float, 4>(...)", "AllReduce"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 2>(AllReduceParams)", "AllReduce"),
    ("void twoShotAllReduceKernel<half, 8, true>(AllReduceParams)", "AllReduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllGather"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::reduce_kernel>(...)", None),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_32x6_tn", None),
])
def test_collective_kernel_kind(name, kind):
    assert collective_kernel_kind(name) == kind


def test_vllm_custom_allreduce_is_communication(tmp_path):
    """A TP decode step of a vLLM-style trace: GEMM, then the custom all-reduce, rank 1 late to it."""
    for rank in range(2):
        b = TraceBuilder(rank, dstrace_meta=None)
        for step in range(3):
            t = step * 1000.0
            b.host_range(f"ProfilerStep#{step}", t, 900.0)
            b.compute(t + 10.0, 300.0)
            arrive = t + 320.0 + (200.0 if rank == 1 else 0.0)
            b.kernel(VLLM_1STAGE, arrive, t + 600.0 - arrive, stream=7)
        b.write(str(tmp_path))
    a = analyze_dir(str(tmp_path))
    for r in (0, 1):
        assert a.ranks[r].collectives["AllReduce"].count == 3
        assert a.ranks[r].busy_us["communication"] > 0
    assert a.ranks[0].wait_us > a.ranks[1].wait_us  # rank 0 spins in the kernel while rank 1 is late
