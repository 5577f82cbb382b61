"""A tiny 2-rank gloo job under torch.profiler: real CPU traces for the end-to-end test.

Run with `torchrun --nproc_per_node 2 gloo_job.py OUT_DIR [plain]`. Each rank writes
`<host>_rank<N>.<ms>.pt.trace.json.gz` into OUT_DIR, the names `dstrace record` uses, with the
`dstrace` metadata key and `dstrace/step#<n>` ranges. Rank 1 sleeps before each collective so rank 0
has to wait for it: the analysis must find that wait. Connections are set up before the
profiled window so the first profiled collective is an ordinary one. With `plain`, it is what a user
of torch.profiler alone writes: `prof.step()` marks the steps (ProfilerStep#n), no dstrace ranges or
metadata, and the file is named `rank<N>.pt.trace.json.gz`.
"""
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, schedule

STEPS = 4
LATE_RANK_SLEEP_S = 0.05


def plain_steps(rank: int, world: int, weight_shard, x, prof) -> None:
    for _ in range(STEPS + 1):  # the first is the schedule's warm-up, not recorded
        full = torch.empty(64 * world, 64)
        if rank == 1:
            time.sleep(LATE_RANK_SLEEP_S)
        dist.all_gather_into_tensor(full, weight_shard)
        y = torch.tanh((x @ full[:64]) @ weight_shard)
        if rank == 1:
            time.sleep(LATE_RANK_SLEEP_S)
        dist.all_reduce(y)
        prof.step()


def main(out_dir: str, plain: bool = False) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    weight_shard = torch.randn(64, 64)
    x = torch.randn(16, 64)
    warm = torch.empty(64 * world, 64)
    dist.all_gather_into_tensor(warm, weight_shard)  # gloo connects lazily: keep that out of the window
    dist.all_reduce(x.clone())
    dist.barrier()
    if plain:  # ProfilerStep ranges need a schedule
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     schedule=schedule(wait=0, warmup=1, active=STEPS, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(
                         os.path.join(out_dir, f"rank{rank}.pt.trace.json.gz"))) as prof:
            dist.barrier()
            plain_steps(rank, world, weight_shard, x, prof)
        dist.barrier()
        dist.destroy_process_group()
        return
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.barrier()  # the profilers start at different times: line the ranks up inside the window
        with record_function("dstrace/generate"):
            for step in range(STEPS):
                with record_function(f"dstrace/step#{step}"):
                    full = torch.empty(64 * world, 64)
                    with record_function(f"dstrace/zero3.allgather bytes={full.numel() * full.element_size()}"):
                        if rank == 1:
                            time.sleep(LATE_RANK_SLEEP_S)
                        dist.all_gather_into_tensor(full, weight_shard)
                    y = x @ full[:64]
                    for _ in range(3):
                        y = torch.tanh(y @ weight_shard)
                    if rank == 1:
                        time.sleep(LATE_RANK_SLEEP_S)
                    dist.all_reduce(y)
        prof.add_metadata_json("dstrace", json.dumps({"run_id": os.environ.get("DSTRACE_TEST_RUN_ID", "test-run"),
                                                      "rank": rank, "world_size": world, "window": {"steps": STEPS}}))
    name = f"{socket.gethostname()}_rank{rank}.{int(time.time() * 1000)}.pt.trace.json.gz"
    prof.export_chrome_trace(os.path.join(out_dir, name))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], plain=sys.argv[2:] == ["plain"])
