"""A tiny generate() whose every decoder layer runs collectives, like ZeRO-3 gathering its weights.

Started by torchrun on each "node"; gloo on CPU. Each forward of each layer all-gathers a shard and
all-reduces an activation-sized tensor, so a profiled window of a few decode steps holds dozens of
collectives to match across nodes. The ranks take turns arriving last: gloo's ops do not end together
the way NCCL kernels do, so a clock offset between CPU traces is pinned only by collectives each rank
was late to (see docs/multi-node.md).
"""
import time

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

GATHERS_PER_LAYER = 3
REDUCES_PER_LAYER = 2
LATE_S = 0.002

dist.init_process_group("gloo")
world = dist.get_world_size()
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, vocab_size=128))
shard = torch.randn(256)
calls = [0]


def communicate(module, args):
    calls[0] += 1
    if calls[0] % world == dist.get_rank():
        time.sleep(LATE_S)
    full = torch.empty(256 * world)
    for _ in range(GATHERS_PER_LAYER):
        dist.all_gather_into_tensor(full, shard)
    for _ in range(REDUCES_PER_LAYER):
        dist.all_reduce(torch.ones(64))


for layer in model.model.layers:
    layer.register_forward_pre_hook(communicate)
dist.barrier()
model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=10, do_sample=False, eos_token_id=None,
               pad_token_id=0)
dist.barrier()
dist.destroy_process_group()
