"""torch-native tensor parallelism: a stack of MLPs split with `parallelize_module` (ColwiseParallel for
`up_proj`, RowwiseParallel for `down_proj`), an inference loop of its own: no generate(), no optimizer, no
DDP, so the window is the time-based one. Each rank holds `up_proj` as (hidden/world) x dim of hidden x dim.
`torchrun --nproc_per_node 2 tp_mlp.py --steps 600`.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(torch.relu(self.up_proj(x)))


class Stack(nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(MLP(dim, hidden) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=600)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    kind = "cuda" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    mesh = init_device_mesh(kind, (int(os.environ["WORLD_SIZE"]),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = Stack(args.dim, args.hidden, args.layers).to(kind)
    plan = {}
    for i in range(args.layers):
        plan[f"layers.{i}.up_proj"] = ColwiseParallel()
        plan[f"layers.{i}.down_proj"] = RowwiseParallel()
    model = parallelize_module(model, mesh, plan)
    x = torch.randn(4, args.dim, device=kind)
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(args.steps):
            x = torch.tanh(model(x))
    if cuda:
        torch.cuda.synchronize()
    local = model.layers[0].up_proj.weight.to_local().shape
    print(f"rank {dist.get_rank()}: {args.steps} forwards, {(time.perf_counter() - t0) / args.steps * 1e3:.2f} ms each, "
          f"up_proj local {tuple(local)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
