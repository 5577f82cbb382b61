"""ZeRO-3 generate() on two gloo ranks where rank 1 asks for fewer new tokens: transformers' synced_gpus
(on by default under ZeRO-3 with more than one rank) keeps the finished rank running forwards, each one
gathering every layer's parameters as the other rank's forwards do, until the last rank is done."""
import argparse

import deepspeed
import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.integrations import HfDeepSpeedConfig

p = argparse.ArgumentParser()
p.add_argument("--max-new-tokens", type=int, default=10)
p.add_argument("--short-rank-tokens", type=int, default=4, help="rank 1's max_new_tokens")
p.add_argument("--local_rank", type=int, default=None)
args = p.parse_args()

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no JIT build of an op only AutoTP calls
deepspeed.init_distributed("gloo")
rank = dist.get_rank()
config = {"train_micro_batch_size_per_gpu": 1,  # every parameter partitioned: each forward gathers them all
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
dschf = HfDeepSpeedConfig(config)  # noqa: F841 - kept alive: the model is built under zero.Init
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, vocab_size=128))
engine, *_ = deepspeed.initialize(model=model, config_params=config)
model = engine.module.eval()
new = args.short_rank_tokens if rank == 1 else args.max_new_tokens
with torch.no_grad():
    out = model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=new, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
print(f"rank {rank}: {out.shape[-1] - 4} new tokens", flush=True)
