"""A tiny 2-rank gloo job under torch.profiler: real CPU traces for the end-to-end test.

Run with `torchrun --nproc_per_node 2 gloo_job.py OUT_DIR`. Each rank writes
`<host>_rank<N>.<ms>.pt.trace.json.gz` into OUT_DIR, the names `dstrace record` uses, with the
`dstrace` metadata key and `dstrace/step#<n>` ranges. Rank 1 sleeps before each collective so rank 0
has to wait for it: the analysis must find that wait. Connections are set up before the
profiled window so the first profiled collective is an ordinary one.
"""
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

STEPS = 4
LATE_RANK_SLEEP_S = 0.05


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    weight_shard = torch.randn(64, 64)
    x = torch.randn(16, 64)
    warm = torch.empty(64 * world, 64)
    dist.all_gather_into_tensor(warm, weight_shard)  # gloo connects lazily: keep that out of the window
    dist.all_reduce(x.clone())
    dist.barrier()
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
                    dist.all_reduce(y)
        prof.add_metadata_json("dstrace", json.dumps({"run_id": os.environ.get("DSTRACE_TEST_RUN_ID", "test-run"),
                                                      "rank": rank, "world_size": world, "window": {"steps": STEPS}}))
    name = f"{socket.gethostname()}_rank{rank}.{int(time.time() * 1000)}.pt.trace.json.gz"
    prof.export_chrome_trace(os.path.join(out_dir, name))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
