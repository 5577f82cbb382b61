"""No traceback on the shapes of trace torch.profiler writes: CUDA, CPU-only (gloo), ROCm, MTIA; no profiler
step, one, or many; with and without dstrace's ranges; one rank or two. Each variant is written as Kineto writes
it (event categories and names as in the corpus: HTA's ROCm and MTIA sets, TraceLens's MI300 traces) and goes
through `dstrace analyze` as a user runs it."""
from __future__ import annotations

import gzip
import json
import os

import pytest
from tests.corpus.test_corpus import analyze, assert_no_traceback

KINDS = {
    "cuda": {"device": "NVIDIA H100 80GB HBM3", "kernel": "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn",
             "comm": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             "backend": "nccl"},
    "rocm": {"device": "AMD Instinct MI300X", "kernel": "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1",
             "comm": "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "backend": "nccl"},
    "cpu": {"device": None, "kernel": None, "comm": None, "backend": "gloo"},
    "mtia": {"device": None, "kernel": None, "comm": None, "backend": "mtia:hccl,cpu:gloo"},
}
PID, TID = 100, 100


def variant(kind: str, rank: int, world: int, steps: int, ranges: bool) -> dict:
    """One rank's trace: `steps` iterations (ProfilerStep#n, and dstrace/step#n when `ranges`), each a matmul
    and an all-reduce; a trace with no step has the same work without the step ranges."""
    k = KINDS[kind]
    ev: list[dict] = [{"ph": "M", "name": "process_name", "pid": PID, "args": {"name": "python"}}]
    corr = 0

    def host(name, ts, dur, cat="cpu_op"):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur, "args": {}})

    def device(name, ts, dur, args=None):
        nonlocal corr
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel" if kind == "rocm" else
                   "cudaLaunchKernel", "pid": PID, "tid": TID, "ts": ts - 8, "dur": 4, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                   "args": {"correlation": corr, "device": 0, "stream": 7, **(args or {})}})

    t = 1_000_000.0 + 37 * rank
    for i in range(max(steps, 1)):
        if steps:
            host(f"ProfilerStep#{i}", t, 1000, "user_annotation")
            if kind in ("cuda", "rocm"):
                ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{i}", "pid": 0, "tid": 7,
                           "ts": t + 10, "dur": 950, "args": {}})
        if ranges:
            host(f"dstrace/step#{i}", t + 1, 990, "user_annotation")
        host("aten::mm", t + 10, 300)
        if k["kernel"]:
            device(k["kernel"], t + 30, 400)
        if kind == "mtia":
            ev.append({"ph": "X", "cat": "mtia_ccp_events", "name": "mtia_kernel", "pid": 1, "tid": 1,
                       "ts": t + 30, "dur": 400, "args": {}})
            ev.append({"ph": "X", "cat": "mtia_runtime", "name": "mtia_launch", "pid": PID, "tid": TID,
                       "ts": t + 20, "dur": 5, "args": {}})
        if world > 1:
            name = "gloo:all_reduce" if kind in ("cpu", "mtia") else "nccl:all_reduce"
            host(name, t + 500, 300, "user_annotation")
            host("c10d::allreduce_", t + 501, 298)
            if k["comm"]:
                device(k["comm"], t + 520, 200 + 50 * rank,
                       {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20,
                        "dtype": "BFloat16", "Group size": world, "Process Group Name": "0",
                        "Process Group Ranks": str(list(range(world)))})
        t += 1200
    trace: dict = {"schemaVersion": 1, "traceEvents": ev, "displayTimeUnit": "ms"}
    if k["device"]:
        trace["deviceProperties"] = [{"id": 0, "name": k["device"], "totalGlobalMem": 85899345920}]
    if world > 1:
        trace["distributedInfo"] = {"backend": k["backend"], "rank": rank, "world_size": world}
    return trace


CASES = ([(kind, 2, steps, ranges) for kind in KINDS for steps in (0, 1, 3) for ranges in (False, True)]
         + [(kind, 1, steps, False) for kind in KINDS for steps in (0, 3)])


@pytest.mark.parametrize(("kind", "world", "steps", "ranges"),
                         [pytest.param(*c,
                                       id=f"{c[0]}-{c[1]}ranks-{c[2]}steps-{'ranges' if c[3] else 'plain'}")
                          for c in CASES])
def test_variant_has_no_traceback(tmp_path, kind, world, steps, ranges):
    for rank in range(world):
        with gzip.open(os.path.join(tmp_path, f"rank{rank}.pt.trace.json.gz"), "wt") as f:
            json.dump(variant(kind, rank, world, steps, ranges), f)
    for fmt in ("json", "text"):
        run = analyze(str(tmp_path), fmt)
        assert_no_traceback(run)
        if fmt == "json" and run.returncode == 0:
            report = json.loads(run.stdout)
            assert report["ranks_found"] == list(range(world))
