"""What the training stand-ins share: joining the process group on this rank's device, and the timed loop
whose last line each rank prints (ms per step, loss)."""
import os
import time

import torch
import torch.distributed as dist


def join_group() -> torch.device:
    """NCCL on this rank's GPU when there is one, else gloo on the CPU."""
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if not cuda:
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    return device


def train(opt, loss_of, steps: int, before_backward=None) -> None:
    """`steps` optimizer steps of `loss_of()`; `before_backward()` (a planted delay) runs between forward and
    backward. Prints the rank's ms per step and last loss, then leaves the process group."""
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_of()
        if before_backward is not None:
            before_backward()
        loss.backward()
        opt.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(f"rank {dist.get_rank()}: {steps} steps, {(time.perf_counter() - t0) / steps * 1e3:.1f} ms/step, "
          f"loss {loss.item():.5f}", flush=True)
    dist.destroy_process_group()
