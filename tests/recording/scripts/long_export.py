"""A job whose window's trace takes a while to write: many small ops in each profiled iteration (the window
follows optimizer.step, iterations 2-4, and is written inside the step that ends iteration 4).

--crash-rank R: rank R dies (os._exit(3)) once another rank has begun writing its trace (torchrun then sends
SIGTERM to every other rank). --after S: sleep S seconds after the loop. --interrupt-wait: wait in the window for a
Ctrl-C (KeyboardInterrupt ends the job, and the trace is written at exit). --wait-before: the same, before the
window (before the loop).
"""
import argparse
import os
import sys
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--ops", type=int, default=4000)
ap.add_argument("--after", type=float, default=0.0)
ap.add_argument("--crash-rank", type=int, default=None)
ap.add_argument("--interrupt-wait", action="store_true")
ap.add_argument("--wait-before", action="store_true")
args = ap.parse_args()
rank = int(os.environ.get("RANK", "0"))
run_dir = os.environ.get("DSTRACE_RUN_DIR", ".")


def another_rank_writing() -> bool:
    return any(n.endswith(".json.tmp") and f"rank{rank}." not in n for n in os.listdir(run_dir))


w = torch.zeros(4, requires_grad=True)
if args.wait_before:
    print("before-window", flush=True)
    time.sleep(120)
opt = torch.optim.SGD([w], lr=0.01)
for i in range(8):
    x = w
    for _ in range(args.ops):
        x = x + 1
    x.sum().backward()
    if args.interrupt_wait and i == 3:
        print("in-window", flush=True)
        time.sleep(120)
    opt.step()
    opt.zero_grad()
    if args.crash_rank == rank and i == 4:
        while not another_rank_writing():
            time.sleep(0.005)
        print(f"rank {rank} dies while another rank writes its trace", flush=True)
        os._exit(3)
print(f"loop done on rank {rank}", flush=True)
time.sleep(args.after)
sys.exit(0)
