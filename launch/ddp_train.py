"""timm-style DDP training: a small convnet (or `--timm resnet50`), SGD, synthetic images, `torchrun --nproc_per_node 2`.

No generate(), no DeepSpeed: the window follows the optimizer's steps. DDP's gradient all-reduce runs in
buckets during backward (`--bucket-mb`); with `--late-rank R --late-ms M` that rank's backward is slower,
so its peers wait in the all-reduce.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_loop import join_group, train  # noqa: E402


def model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(width * 16, 256), nn.ReLU(), nn.Linear(256, 10))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bucket-mb", type=float, default=0.25)
    p.add_argument("--late-rank", type=int, default=-1)
    p.add_argument("--late-ms", type=float, default=0.0)
    p.add_argument("--timm", default=None, help="a timm model name (e.g. resnet50) instead of the tiny convnet")
    p.add_argument("--image", type=int, default=32)
    args = p.parse_args()
    device = join_group()
    rank = dist.get_rank()
    torch.manual_seed(0)
    if args.timm:
        import timm

        module = timm.create_model(args.timm, pretrained=False, num_classes=10)
    else:
        module = model(args.width)
    net = DDP(module.to(device), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 3, args.image, args.image, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    late = (lambda: time.sleep(args.late_ms / 1e3)) if rank == args.late_rank else None
    train(opt, lambda: loss_fn(net(x), y), args.steps, before_backward=late)

if __name__ == "__main__":
    main()
