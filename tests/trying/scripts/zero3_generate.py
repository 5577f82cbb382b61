"""The report's shape on a plain causal LM: HfDeepSpeedConfig with ZeRO-3 before from_pretrained (so the model
is built under zero.Init), deepspeed.initialize, then generate() on the engine's module, each rank its own
prompt, greedy. Prints each rank's new token ids."""
import argparse
import json
import os

import torch
import deepspeed
from transformers import AutoModelForCausalLM
from transformers.integrations import HfDeepSpeedConfig

p = argparse.ArgumentParser()
p.add_argument("--checkpoint", required=True)
p.add_argument("--max-new-tokens", type=int, default=6)
args = p.parse_args()

# Threshold 0: a tiny model's weights are all below DeepSpeed's default (1e5 elements), which keeps them resident.
config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
keep = HfDeepSpeedConfig(config)  # noqa: F841 - must stay alive: from_pretrained builds under zero.Init
model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
engine, *_ = deepspeed.initialize(model=model, config=config)
rank = int(os.environ.get("RANK", "0"))
prompt = torch.tensor([[1 + rank, 7, 11 + rank, 3]])
with torch.no_grad():
    out = engine.module.eval().generate(prompt, attention_mask=torch.ones_like(prompt),
                                        max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=0)
print(json.dumps({"rank": rank, "tokens": out[0, prompt.shape[1]:].tolist()}), flush=True)
