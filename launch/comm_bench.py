"""A comm benchmark in the style of nccl-tests, in Python: a loop of bare torch.distributed collectives on
tensors (all_reduce, all_gather_into_tensor, broadcast, barrier), no nn.Module, no optimizer, so the window is
the time-based one, ticked at the collective calls. Rank 0 decides when the time is up and broadcasts it, so
every rank runs the same number of iterations. Each rank checks every result and prints what it checked,
then its iterations and ms per iteration; it exits 1 if a result was wrong.
`torchrun --nproc_per_node 2 comm_bench.py --seconds 5`.
"""
import argparse
import sys
import time

import torch
import torch.distributed as dist

from train_loop import join_group


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0, help="how long rank 0 keeps the loop going")
    p.add_argument("--numel", type=int, default=1 << 16, help="elements of each rank's float32 buffer")
    args = p.parse_args()
    device = join_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.empty(args.numel, device=device)
    gathered = torch.empty(world * args.numel, device=device)
    go = torch.empty(1, dtype=torch.int64, device=device)
    reduced = world * (world + 1) / 2
    owners = torch.arange(world, dtype=torch.float32, device=device).repeat_interleave(args.numel)
    ok, iterations = True, 0
    deadline = time.perf_counter() + args.seconds
    t0 = time.perf_counter()
    while True:
        go.fill_(int(time.perf_counter() < deadline) if rank == 0 else -1)
        dist.broadcast(go, src=0)
        ok = ok and int(go.item()) in (0, 1)
        if go.item() != 1:
            break
        x.fill_(rank + 1)
        dist.all_reduce(x)
        ok = ok and bool((x == reduced).all())
        x.fill_(rank)
        dist.all_gather_into_tensor(gathered, x)
        ok = ok and bool(torch.equal(gathered, owners))
        dist.barrier()
        iterations += 1
    ms = (time.perf_counter() - t0) / max(iterations, 1) * 1e3
    # One write: the ranks share the launcher's stdout, and a print() of a line and its newline could interleave.
    sys.stdout.write(f"rank {rank} of {world}: all_reduce {reduced:g}, all_gather_into_tensor ranks 0-{world - 1}, "
                     f"broadcast from rank 0: {'correct' if ok else 'WRONG'}\n"
                     f"rank {rank}: {iterations} iterations, {ms:.3f} ms per iteration\n")
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
