"""FSDP2 training, tiny: `fully_shard` on each block and on the root, AdamW, synthetic data,
`torchrun --nproc_per_node 2`. Each rank holds 1/world of every weight (a DTensor sharded on dim 0); FSDP
all-gathers each block's weights before its forward and again for its backward, and reduce-scatters its
gradients: ZeRO-3's pattern, torch's way.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim))
                            for _ in range(args.layers)]).to(device)
    for block in model:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.dim, device=device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
    if cuda:
        torch.cuda.synchronize()
    print(f"rank {dist.get_rank()}: {args.steps} steps, {(time.perf_counter() - t0) / args.steps * 1e3:.1f} ms/step, "
          f"loss {loss.item():.5f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
