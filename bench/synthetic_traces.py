"""Write a synthetic run folder of large Kineto-shaped traces, for benchmarking `dstrace analyze` against HTA.

Each rank's trace looks like the GPU traces `dstrace record` writes (see tests/fixtures/traces.py
and traces/h200-*): Kineto's own text layout, a `distributedInfo` block and the `dstrace` metadata
block; per decode step a `dstrace/step#N` range, and per decoder layer the ZeRO-3 ranges
(`dstrace/zero3.fetch ...`, `dstrace/zero3.allgather bytes=N`, `dstrace/zero3.release ...`), CPU ops,
`cudaLaunchKernel` / `cuLaunchKernelEx` calls with `ac2g` flows to their kernels, GEMM kernels and an
`ncclDevKernel_AllGather_RING_LL` kernel with NCCL's args. The mix of event kinds follows the H200
reference traces. Steps are added until the trace reaches the requested size.

    python bench/synthetic_traces.py /tmp/dstrace-bench/synth8 --ranks 8 --mb 300
"""
from __future__ import annotations

import argparse
import gzip
import json
import os

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)"
NCCL = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
CPU_OPS = ("aten::linear", "aten::t", "aten::matmul", "aten::mm", "aten::add", "aten::mul", "aten::silu",
           "aten::empty", "aten::view", "aten::reshape")
PID, TID, STREAM, NCCL_STREAM = 855, 855, 7, 17


class Writer:
    """One rank's events, written in Kineto's layout as they are made."""

    def __init__(self, f, rank: int, world: int):
        self.f, self.rank, self.world = f, rank, world
        self.first = True
        self.ext = 0
        self.corr = 100_000  # correlation ids count from the process's start, long before the window
        self.ev_idx = 0

    def _event(self, body: str) -> None:
        self.f.write(("  {\n" if self.first else ",\n  {\n").encode() + body.encode() + b"\n  }")
        self.first = False

    def host(self, cat: str, name: str, ts: float, dur: float) -> None:
        self.ext += 1
        self.ev_idx += 1
        self._event(f'    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {PID}, "tid": {TID},\n'
                    f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n'
                    f'      "External id": {self.ext},"Record function id": 0, "Ev Idx": {self.ev_idx}\n    }}')

    def launch(self, name: str, ts: float, kts: float, kdur: float, stream: int = STREAM, nccl_bytes: int = 0) -> None:
        self.corr += 1
        api, cat = ("cuLaunchKernelEx", "cuda_driver") if nccl_bytes else ("cudaLaunchKernel", "cuda_runtime")
        self._event(f'    "ph": "X", "cat": "{cat}", "name": "{api}", "pid": {PID}, "tid": {TID},\n'
                    f'    "ts": {ts:.3f}, "dur": 4.120,\n    "args": {{\n'
                    f'      "External id": {self.ext},"cbid": 211, "correlation": {self.corr}\n    }}')
        self._event(f'    "ph": "s", "id": {self.corr}, "pid": {PID}, "tid": {TID}, "ts": {ts:.3f},\n'
                    f'    "cat": "ac2g", "name": "ac2g"')
        extra = ""
        if nccl_bytes:
            n = nccl_bytes // 2
            extra = (f', "Collective name": "_allgather_base", "In msg nelems": {n // self.world}, '
                     f'"Out msg nelems": {n}, "Group size": {self.world}, "dtype": "BFloat16", "In split size": "[]", '
                     f'"Out split size": "[]", "Process Group Name": "0", "Process Group Description": "default_pg", '
                     f'"Process Group Ranks": "{list(range(self.world))}"')
        self._event(f'    "ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": {stream},\n'
                    f'    "ts": {kts:.3f}, "dur": {kdur:.3f},\n    "args": {{\n'
                    f'      "External id": {self.ext}, "queued": 0, "device": 0, "context": 1,\n'
                    f'      "stream": {stream}, "correlation": {self.corr}, "registers per thread": 96,\n'
                    f'      "shared memory": 103808, "blocks per SM": 0.181818, "warps per SM": 3.090909,\n'
                    f'      "grid": [24, 1, 1], "block": [544, 1, 1], "est. achieved occupancy %": 0{extra}\n    }}')
        self._event(f'    "ph": "f", "id": {self.corr}, "pid": 0, "tid": {stream}, "ts": {kts:.3f},\n'
                    f'    "cat": "ac2g", "name": "ac2g", "bp": "e"')


def write_rank(folder: str, rank: int, world: int, target_bytes: int, layers: int, gz: bool) -> str:
    name = f"synth_rank{rank}.1800000000000.pt.trace.json" + (".gz" if gz else "")
    path = os.path.join(folder, name)
    raw = gzip.open(path + ".tmp", "wb", compresslevel=1) if gz else open(path + ".tmp", "wb")
    with raw as f:
        head = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320}],
                "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 1,
                                    "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": world,
                                                   "ranks": list(range(world))}], "nccl_version": "2.28.9"},
                "dstrace": {"run_id": "synthetic", "rank": rank, "world_size": world,
                            "window": {"mode": "full", "call": 1, "start": 2, "steps": 3}},
                "displayTimeUnit": "ms", "baseTimeNanoseconds": 1790857026000000000}
        f.write(b"\n  {\n" + b",\n".join(f'  "{k}": {json.dumps(v)}'.encode() for k, v in head.items())
                + b',\n  "traceEvents": [\n')
        w = Writer(f, rank, world)
        t = 5142755741471.976 + rank * 3.5
        step = 2
        layer_bytes = 466_000_000
        step_us = 50.0 + layers * (900.0 + 12 * 60.0 + 30.0)
        while f.tell() < target_bytes:  # a GzipFile's tell() counts uncompressed bytes
            step_start = t
            w.host("user_annotation", f"dstrace/step#{step}", t, step_us - 10.0)
            t += 50.0
            for layer in range(layers):
                w.host("user_annotation", f"dstrace/zero3.fetch Qwen2DecoderLayer#{layer}", t, 900.0)
                w.host("user_annotation", f"dstrace/zero3.allgather bytes={layer_bytes}", t + 5, 40.0)
                w.host("cpu_op", "nccl:_all_gather_base", t + 8, 30.0)
                wait = 150.0 if rank == 1 else 0.0
                w.launch(NCCL, t + 10, t + 20, 800.0 + (150.0 - wait), stream=NCCL_STREAM, nccl_bytes=layer_bytes)
                t += 900.0
                for op in range(12):
                    w.host("cpu_op", CPU_OPS[op % len(CPU_OPS)], t, 25.0)
                    w.host("cpu_op", "aten::empty", t + 2, 3.0)
                    w.host("cpu_op", "aten::view", t + 6, 2.0)
                    w.launch(GEMM if op % 3 == 0 else ELEMENTWISE, t + 10, t + 30, 40.0 if op % 3 == 0 else 6.0)
                    t += 60.0
                w.host("user_annotation", f"dstrace/zero3.release Qwen2DecoderLayer#{layer}", t, 20.0)
                t += 30.0
            step += 1
            t = step_start + step_us + 100.0
        f.write(b'\n  ],\n  "traceName": "' + path.encode() + b'"\n}')
    os.replace(path + ".tmp", path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb", type=float, default=300.0, help="uncompressed JSON size per rank, MB (1e6 bytes)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--plain", action="store_true", help="write .json instead of .json.gz")
    args = ap.parse_args()
    os.makedirs(args.folder, exist_ok=True)
    for r in range(args.ranks):
        path = write_rank(args.folder, r, args.ranks, int(args.mb * 1e6), args.layers, not args.plain)
        print(path, flush=True)


if __name__ == "__main__":
    main()
