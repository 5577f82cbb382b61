"""A small generate() job for the failure tests: a rank can crash, or the job can wait to be signalled."""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--crash-rank", type=int, default=None)
p.add_argument("--crash-how", choices=("raise", "kill"), default="raise")
p.add_argument("--crash-at", choices=("start", "after-generate"), default="after-generate")
p.add_argument("--sleep", type=float, default=0.0, help="seconds to wait after generate")
args = p.parse_args()

if "RANK" in os.environ:
    dist.init_process_group("gloo")
rank = dist.get_rank() if dist.is_initialized() else 0


def crash_here(at: str) -> None:
    if args.crash_rank == rank and args.crash_at == at:
        if args.crash_how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"planted crash on rank {rank}")


crash_here("start")
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, vocab_size=128))
model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=8, do_sample=False, eos_token_id=None,
               pad_token_id=0)
print(f"generated on rank {rank}", flush=True)
time.sleep(1.0 if args.crash_rank is not None and args.crash_rank != rank else 0.0)
crash_here("after-generate")
deadline = time.time() + args.sleep
while time.time() < deadline:
    time.sleep(0.1)
