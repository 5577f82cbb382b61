"""How Kineto traces name things: event categories, collective kernels and ops, dtype sizes, dstrace's ranges.

One place for these rules, so that every analysis (collectives, utilization, steps, the timeline)
classifies and sizes a collective the same way.
"""
from __future__ import annotations

import math
import re

from dstrace.runfolder.range_names import PREFIX

GPU_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
"""Device activity dstrace reads: Kineto writes these for CUDA, ROCm (HIP), Intel XPU and PrivateUse1 devices."""
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver", "xpu_runtime", "xpu_driver",
                               "privateuse1_runtime", "privateuse1_driver"})
"""Host calls that launch that device activity (ROCm traces name theirs cuda_runtime too)."""
ACCELERATOR_CATEGORIES = {
    "mtia_ccp_events": "MTIA", "mtia_insight": "MTIA", "mtia_counters": "MTIA", "mtia_workloadd": "MTIA",
    "mtia_runtime": "MTIA", "hpu_op": "HPU", "mlu_memcpy": "MLU", "mlu_memset": "MLU", "mlu_notifier": "MLU",
    "mlu_runtime": "MLU", "mlu_user_annotation": "MLU",
}
"""Categories Kineto writes for accelerators whose device timeline dstrace does not read (category ->
accelerator): a trace holding them is not CPU-only, and its host times are not the whole story."""
GPU_HOST_CATEGORIES = {"cuda_runtime": "CUDA runtime calls", "cuda_driver": "CUDA driver calls",
                       "cuda_profiler_range": "CUPTI profiler ranges"}
"""Host-side categories only a GPU job writes (category -> what they are): on a trace without GPU activity they
show a GPU job profiled without its device side, not a CPU-only one."""
UNNAMED_NCCL = "NCCL (kind not named)"
"""The kind of an NCCL kernel whose name and args name no collective (`ncclDevKernel_Generic` without
`Collective name` args): its time is counted, but no call on another rank can be told to be the same."""
P2P_KINDS = frozenset({"SendRecv", "Send", "Recv"})
"""Point-to-point kinds: matched across ranks by (sender, receiver) and order, never as a group collective."""
NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
NCCL_HOST_RANGE = re.compile(r"^nccl:(\w+)$")
"""c10d's host-side range around each NCCL call (`nccl:all_to_all`, `nccl:all_reduce`): it enqueues the
transfer, which runs on the GPU; `alltoall_base` launches SendRecv kernels inside its `nccl:all_to_all`."""
CUSTOM_COLLECTIVE_KERNELS = (
    (re.compile(r"\bcross_device_reduce_(?:1stage|2stage|half_butterfly)\b"), "AllReduce"),
    (re.compile(r"\b(?:oneShot|twoShot)AllReduceKernel\b"), "AllReduce"),
)
"""Collective kernels of serving engines, outside NCCL, read in their source (never seen in a trace here):
vLLM's custom all-reduce (csrc/custom_all_reduce.cuh: `cross_device_reduce_1stage`, `_2stage`,
`_half_butterfly`, demangled as `void vllm::cross_device_reduce_1stage<c10::BFloat16, 2>(...)`), the same
kernels in SGLang's sgl-kernel (csrc/allreduce/custom_all_reduce.cuh), and TensorRT-LLM's one-/two-shot
all-reduce that SGLang's trt_reduce builds (customAllReduceKernels.cu). They carry no message sizes."""
COMM_LIBRARY_KERNELS = (
    (NCCL_KERNEL, "NCCL"),
    (re.compile(r"\bvllm::cross_device_reduce_"), "vLLM custom all-reduce"),
    (re.compile(r"\bsglang::cross_device_reduce_"), "SGLang custom all-reduce"),
    (re.compile(r"\bcross_device_reduce_(?:1stage|2stage|half_butterfly)\b"), "vLLM/SGLang custom all-reduce"),
    (re.compile(r"\b(?:oneShot|twoShot)AllReduceKernel\b"), "TensorRT-LLM custom all-reduce"),
    (re.compile(r"\b(?:deep_ep|dpsk::ep)::(?:intranode|internode|internode_ll)::"), "DeepEP"),
    (re.compile(r"\bmscclpp::"), "MSCCL++"),
    (re.compile(r"\bnvshmem[ix]?_"), "NVSHMEM"),
    (re.compile(r"\b(?:multimem_(?:one_shot_)?all_reduce|multimem_all_gather|one_shot_all_reduce|"
                r"two_shot_all_reduce)_kernel\b"), "torch symmetric memory"),
)
"""Kernels that move data between GPUs, by library, first match wins: NCCL's (RCCL names its kernels the
same); the custom all-reduce kernels above; DeepEP's expert-parallel dispatch/combine kernels, in its
`deep_ep::intranode`, `::internode` and `::internode_ll` namespaces (DeepEP's csrc/kernels), and as
`dpsk::ep::internode::dispatch` / `combine` / `notify_dispatch` / `cached_notify` in DeepSeek's public
profile (github.com/deepseek-ai/profile-data, train.json); its `get_dispatch_layout`, which only counts
tokens per rank, is compute. MSCCL++ kernels carry `mscclpp::` types in their demangled names; NVSHMEM's
own kernels are named `nvshmem_` / `nvshmemi_` / `nvshmemx_`. A kernel named here is communication in
the compute/communication split even when dstrace cannot match it across ranks as a collective. torch's
symmetric-memory collectives (torch/csrc/distributed/c10d/symm_mem) launch `multimem_all_reduce_kernel`
and its one-shot/two-shot and all-gather siblings (seen as `(anonymous namespace)::multimem_all_reduce_kernel
<c10::BFloat16, 16>` in TraceLens's B200 trace)."""
UNMATCHED_COMM_LIBRARIES = ("DeepEP", "MSCCL++", "NVSHMEM", "torch symmetric memory")
"""Libraries of `COMM_LIBRARY_KERNELS` whose kernels are not read as collectives: their names give no kind
and their args no group or sizes, so they have no wait/transfer split and no bandwidth."""
GLOO_OP = re.compile(r"^gloo:(\w+)")
C10D_OP = re.compile(r"^c10d::(\w+)")
# CPU ops that are communication or bookkeeping, not compute, in a CPU-only trace.
CPU_NON_COMPUTE = re.compile(r"^(?:c10d::|gloo:|record_param_comms|" + re.escape(PREFIX) + r"|ProfilerStep#|PyTorch Profiler)")
HTA_COMM_KERNEL = re.compile(r"^nccl.*Kernel")  # HTA's kernel types; its OTHER counts as compute
HTA_MEMORY_KERNEL = re.compile(r"^(?:Memcpy|Memset|dma)")
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")

# Canonical kind for a normalised op name (lower case, letters only), first prefix that matches wins.
KIND_PREFIXES = (
    ("allgather", "AllGather"), ("reducescatter", "ReduceScatter"), ("allreduce", "AllReduce"),
    ("alltoall", "AllToAll"), ("broadcast", "Broadcast"), ("reduce", "Reduce"), ("gather", "Gather"),
    ("scatter", "Scatter"), ("sendrecv", "SendRecv"), ("send", "Send"), ("recv", "Recv"), ("barrier", "Barrier"),
)
# c10d ops that are not a collective themselves (waiting on one, or bookkeeping).
NOT_COLLECTIVES = frozenset({"wait", "waitall", "monitoredbarrier"})

DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4,
    "double": 8, "float64": 8, "long": 8, "longint": 8, "int64": 8, "uint64": 8, "complexfloat": 8,
    "complexdouble": 16,
    "bfloat16": 2, "half": 2, "float16": 2, "short": 2, "shortint": 2, "int16": 2, "uint16": 2,
    "byte": 1, "char": 1, "bool": 1, "uint8": 1, "int8": 1, "unsignedchar": 1, "signedchar": 1,
    "float8e4m3fn": 1, "float8e5m2": 1, "float8e4m3fnuz": 1, "float8e5m2fnuz": 1,
}


def dtype_bytes(dtype) -> int | None:
    """Element size of a dtype as traces spell it: "BFloat16", "c10::BFloat16", "float", "long int"."""
    if not isinstance(dtype, str):
        return None
    key = re.sub(r"[^a-z0-9]", "", dtype.lower().replace("c10::", "").replace("torch.", ""))
    return DTYPE_BYTES.get(key)


def collective_kernel_kind(name: str) -> str | None:
    """Kind of a device kernel that is a collective (NCCL's, or a serving engine's custom all-reduce), else None."""
    if name.startswith("nccl"):
        return kind_of(name)
    return next((kind for pattern, kind in CUSTOM_COLLECTIVE_KERNELS if pattern.search(name)), None)


def comm_library(name: str) -> str | None:
    """The library whose communication kernel this is (`COMM_LIBRARY_KERNELS`), else None."""
    return next((library for pattern, library in COMM_LIBRARY_KERNELS if pattern.search(name)), None)


def is_nccl_kernel(name: str) -> bool:
    """An NCCL (or RCCL) kernel, whatever it does: `ncclDevKernel_Generic(...)` names no kind, its args do."""
    return NCCL_KERNEL.match(name) is not None


def kernel_kind(name: str, coll_name) -> str | None:
    """Kind of one collective kernel from its name and its `Collective name` arg: the arg where the name says
    nothing (`ncclDevKernel_Generic`, newer NCCL and RCCL), AllToAll for SendRecv kernels whose arg says
    all_to_all (c10d's `alltoall_base` runs as grouped send/recv), else the name's kind."""
    kind = collective_kernel_kind(name)
    arg = kind_of(coll_name.strip('"')) if isinstance(coll_name, str) else None
    if kind is None or (kind in P2P_KINDS and arg == "AllToAll"):
        return arg
    return kind


def kind_of(name: str) -> str | None:
    """Canonical CamelCase kind (AllGather, AllReduce, ...) of an NCCL kernel or a CPU collective op name."""
    m = NCCL_KERNEL.match(name)
    if m and m.group(1) == "Generic":
        return None
    if m:
        return m.group(1)
    key = re.sub(r"[^a-z]", "", name.lower().split("(")[0].replace("nccl", ""))
    if key in NOT_COLLECTIVES:
        return None
    return next((kind for prefix, kind in KIND_PREFIXES if key.startswith(prefix)), None)


def p2p_side(kind: str | None, coll_name, src_rank, dst_rank) -> tuple[str | None, float | None]:
    """(role, peer) of a point-to-point call: "send" or "recv" from its kind or its `Collective name`, and the
    global rank on the other side from torch's `Dst Rank` / `Src Rank` args (torch >= 2.4); None where the
    trace does not say (older traces, send and recv batched in one kernel) and for every other kind."""
    if kind not in P2P_KINDS:
        return None, None
    name = coll_name.strip('"').lower() if isinstance(coll_name, str) else ""
    role = "send" if kind == "Send" or name == "send" else "recv" if kind == "Recv" or name == "recv" else None
    try:
        peer = float({"send": dst_rank, "recv": src_rank}.get(role))
    except (TypeError, ValueError):
        return role, None
    return role, None if math.isnan(peer) else peer


def parse_ranks(value) -> tuple[int, ...] | None:
    """`Process Group Ranks` is a string like "[0, 1]"; Kineto truncates long lists with "...": unusable."""
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    if not isinstance(value, str) or "..." in value:
        return None
    nums = re.findall(r"-?\d+", value)
    return tuple(int(v) for v in nums) if nums else None


def numel(dims) -> int | None:
    """Elements of a shape, or of a TensorList's shapes, as `Input Dims` records them."""
    if not isinstance(dims, list) or not dims:
        return None
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    if all(isinstance(d, list) for d in dims):
        parts = [numel(d) for d in dims]
        return sum(p for p in parts if p) if parts else None
    return None
