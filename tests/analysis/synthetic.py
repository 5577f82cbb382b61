"""Hand-made traces shaped like Kineto's GPU output, for tests that need exact, known numbers.

Event shapes follow real torch.profiler CUDA traces (and HTA's test traces): kernels are `ph: X`,
`cat: kernel` on pid = device, tid = stream, with `correlation`/`External id`/`stream`/`device` args;
each is launched by a `cuda_runtime` event on the host thread with the same correlation, linked by an
`ac2g` flow (`ph: s` on the host, `ph: f` with `bp: e` on the stream). NCCL kernels carry the
`Collective name`, `In msg nelems`, `Out msg nelems`, `dtype`, `Group size`, `Process Group *` args.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import asdict

from dstrace.runfolder.records import (
    MANIFEST_SCHEMA, RUN_SCHEMA, DeepSpeedCall, GenerationCall, Inventory, Manifest, RankStatus, RunRecord, TPRequest, write_json_atomic,
)

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
HOST_PID = 4242
HOST_TID = 4242
COLL_NAMES = {"AllGather": "_allgather_base", "AllReduce": "allreduce", "ReduceScatter": "_reduce_scatter_base",
              "Broadcast": "broadcast"}


class TraceBuilder:
    """One rank's trace. Times are given on a shared 'true' clock; `clock_offset_us` is added on output,
    as if the rank's host clock were that far ahead."""

    def __init__(self, rank: int, world_size: int = 2, host: str = "hostA", run_id: str | None = "run-1",
                 distributed: bool = True, dstrace_meta: str = "object", clock_offset_us: float = 0.0, base_ts: float = 1.0e12):
        self.rank, self.world_size, self.host, self.run_id = rank, world_size, host, run_id
        self.distributed, self.dstrace_meta = distributed, dstrace_meta
        self.offset, self.base = clock_offset_us, base_ts
        self.events: list[dict] = []
        self._corr = 1000
        self._ext = 1

    def _t(self, ts: float) -> float:
        return self.base + ts + self.offset

    def host_range(self, name: str, ts: float, dur: float, cat: str = "user_annotation", args: dict | None = None):
        self._ext += 1
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": HOST_PID, "tid": HOST_TID,
                            "ts": self._t(ts), "dur": dur, "args": {"External id": self._ext, **(args or {})}})

    def kernel(self, name: str, ts: float, dur: float, launch_ts: float | None = None, stream: int = 7,
               device: int = 0, args: dict | None = None, cat: str = "kernel", launch_cat: str = "cuda_runtime"):
        self._corr += 1
        self._ext += 1
        launch = ts - 5.0 if launch_ts is None else launch_ts
        self.events.append({"ph": "X", "cat": launch_cat, "name": "cudaLaunchKernel", "pid": HOST_PID,
                            "tid": HOST_TID, "ts": self._t(launch), "dur": 3.0,
                            "args": {"External id": self._ext, "cbid": 211, "correlation": self._corr}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": self._t(ts),
                            "dur": dur, "args": {"External id": self._ext, "device": device, "stream": stream,
                                                 "correlation": self._corr, "registers per thread": 96,
                                                 "shared memory": 0, "grid": [4, 1, 1], "block": [640, 1, 1],
                                                 **(args or {})}})
        self.events.append({"ph": "s", "id": self._corr, "pid": HOST_PID, "tid": HOST_TID, "ts": self._t(launch),
                            "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": self._corr, "pid": device, "tid": stream, "ts": self._t(ts),
                            "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def compute(self, ts: float, dur: float, **kw):
        self.kernel(GEMM, ts, dur, **kw)

    def nccl(self, kind: str, ts: float, dur: float, in_nelems: int, out_nelems: int, dtype: str = "BFloat16",
             pg: str = "0", ranks: tuple[int, ...] | None = None, **kw):
        ranks = tuple(range(self.world_size)) if ranks is None else ranks
        args = {"Collective name": COLL_NAMES.get(kind, kind.lower()), "In msg nelems": in_nelems,
                "Out msg nelems": out_nelems, "Group size": len(ranks), "dtype": dtype, "In split size": "[]",
                "Out split size": "[]", "Process Group Name": pg, "Process Group Description": "default_pg",
                "Process Group Ranks": str(list(ranks))}
        self.kernel(f"ncclDevKernel_{kind}_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ts, dur, stream=20, args=args, **kw)

    def p2p(self, role: str, peer: int, ts: float, dur: float, nelems: int = 1000, pg: str = "0",
            ranks: tuple[int, ...] | None = None, **kw):
        """A send or recv as torch >= 2.4 writes it: an `ncclDevKernel_SendRecv` kernel whose args name the
        collective (send / recv) and the peer's global rank (`Dst Rank` / `Src Rank`)."""
        ranks = tuple(range(self.world_size)) if ranks is None else ranks
        args = {"Collective name": role, "In msg nelems": nelems, "Out msg nelems": nelems, "Group size": len(ranks),
                "dtype": "BFloat16", "Process Group Name": pg, "Process Group Description": "default_pg",
                "Process Group Ranks": str(list(ranks)), ("Dst Rank" if role == "send" else "Src Rank"): peer}
        self.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", ts, dur, stream=20, args=args, **kw)

    def device_event(self, cat: str, name: str, ts: float, dur: float, pid: int = 17, tid: int = 3774,
                     args: dict | None = None):
        """An event of another accelerator's category (MTIA's mtia_ccp_events, Gaudi's hpu_op, ...)."""
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": self._t(ts),
                            "dur": dur, "args": dict(args or {})})

    def to_dict(self) -> dict:
        data = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150e9}],
                "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_700_000_000_000_000_000,
                "traceEvents": [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                                 "tid": "PyTorch Profiler", "ts": self._t(0), "dur": 1.0, "args": {"Op count": 0}}]
                + self.events}
        if self.distributed:
            data["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": self.world_size,
                                       "pg_count": 1, "nccl_version": "2.28.3",
                                       "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": self.world_size,
                                                      "ranks": list(range(self.world_size))}]}
        if self.host:
            data["host_name"] = self.host
        if self.dstrace_meta:
            meta = {"run_id": self.run_id, "rank": self.rank, "world_size": self.world_size,
                    "window": {"mode": "full", "call": 0, "start": 1, "steps": 3}}
            data["dstrace"] = json.dumps(meta) if self.dstrace_meta == "string" else meta
        return data

    def write(self, folder: str, name: str | None = None) -> str:
        name = name or f"{self.host or 'host'}_rank{self.rank}.1700000000000.pt.trace.json.gz"
        path = os.path.join(folder, name)
        payload = json.dumps(self.to_dict()).encode()
        if path.endswith(".gz"):
            with gzip.open(path, "wb") as f:
                f.write(payload)
        else:
            with open(path, "wb") as f:
                f.write(payload)
        return path


def zero3_run(folder: str, world_size: int = 2, steps: int = 4, late_rank: int = 1, late_us: float = 300.0,
              layers: int = 4, layer_nelems: int = 1_000_000, host_of=lambda r: "hostA",
              clock_offsets: dict[int, float] | None = None, gemm_us: float = 100.0, ag_us: float = 200.0,
              **builder_kw) -> list[TraceBuilder]:
    """A ZeRO-3-like decode window: each step, per layer, a fetch range launching an AllGather of the
    layer's bf16 weights, then a GEMM. `late_rank` reaches every AllGather `late_us` after the others."""
    builders = [TraceBuilder(r, world_size, host=host_of(r), clock_offset_us=(clock_offsets or {}).get(r, 0.0),
                             **builder_kw) for r in range(world_size)]
    t = 0.0
    step_len = layers * (late_us + ag_us + gemm_us + 100.0) + 200.0
    for s in range(steps):
        step_start = t
        for b in builders:
            b.host_range(f"dstrace/step#{s}", step_start, step_len - 50.0)
        t += 50.0
        for layer in range(layers):
            for b in builders:
                arrive = t + (late_us if b.rank == late_rank else 0.0)
                end = t + late_us + ag_us  # every rank finishes when the last one has transferred
                b.host_range(f"dstrace/zero3.fetch LlamaDecoderLayer#{layer}", arrive - 20.0, 30.0)
                b.host_range(f"dstrace/zero3.allgather bytes={layer_nelems * 2}", arrive - 10.0, 15.0)
                b.nccl("AllGather", arrive, end - arrive, layer_nelems // world_size, layer_nelems,
                       launch_ts=arrive - 8.0)
                b.compute(end + 10.0, gemm_us, launch_ts=end - 10.0)
            t += late_us + ag_us + gemm_us + 100.0
        t = step_start + step_len
    return builders


def write_manifest(folder: str, rank: int, run_id: str = "run-1", world_size: int = 2, logical_bytes: int = 8_000_000,
                   tp_request: int | None = None, effective_tp: int = 1, tp_error: bool = False,
                   gathered_bytes: list[int] | None = None, step_ms: list[float] | None = None,
                   error_message: str = "1 validation error for DeepSpeedConfigModel\ntensor_parallel.tp_size\n"
                                        "  Extra inputs are not permitted") -> str:
    inv = Inventory(taken_at="deepspeed.initialize", model_class="LlamaForCausalLM", weights=[],
                    logical_numel=logical_bytes // 2, local_numel=logical_bytes // 2 // world_size,
                    local_bytes=logical_bytes // world_size, logical_bytes=logical_bytes, zero3_partitioned=4,
                    module_classes={"LlamaDecoderLayer": 4}, effective_tp=effective_tp)
    calls = [DeepSpeedCall(api="deepspeed.initialize", config={"tensor_parallel": {"tp_size": tp_request}} if tp_request else {},
                           error={"type": "ValidationError", "message": error_message} if tp_error else None)]
    m = Manifest(schema=MANIFEST_SCHEMA, run_id=run_id, status="complete", rank=rank, local_rank=rank,
                 world_size=world_size, host="hostA", pid=100 + rank, started=1.0, ended=2.0,
                 deepspeed_calls=calls, inventory=inv,
                 tp_requested=[TPRequest("deepspeed.initialize config", "tensor_parallel.tp_size", tp_request)] if tp_request else [],
                 calls=[GenerationCall(index=0, api="generate", model_class="LlamaForCausalLM",
                                       step_ms=step_ms or [], gathered_bytes=gathered_bytes or [])])
    path = os.path.join(folder, f"rank{rank}.manifest.json")
    write_json_atomic(path, asdict(m))
    return path


def write_run_record(folder: str, run_id: str = "run-1", world_size: int = 2) -> str:
    rec = RunRecord(schema=RUN_SCHEMA, run_id=run_id, command=["python", "main.py"], cwd="/", started=1.0,
                    status="complete", world_size=world_size,
                    ranks=[RankStatus(r, "complete", f"rank{r}.manifest.json", []) for r in range(world_size)])
    path = os.path.join(folder, "run.json")
    write_json_atomic(path, asdict(rec))
    return path
