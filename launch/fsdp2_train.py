"""FSDP2 training, tiny: `fully_shard` on each block and on the root, AdamW, synthetic data,
`torchrun --nproc_per_node 2`. Each rank holds 1/world of every weight (a DTensor sharded on dim 0); FSDP
all-gathers each block's weights before its forward and again for its backward, and reduce-scatters its
gradients: ZeRO-3's pattern, torch's way.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_loop import join_group, train  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    device = join_group()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim))
                            for _ in range(args.layers)]).to(device)
    for block in model:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.dim, device=device)
    train(opt, lambda: model(x).pow(2).mean(), args.steps)

if __name__ == "__main__":
    main()
