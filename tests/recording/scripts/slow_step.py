"""A generate() whose fourth forward (inside the default profiling window, steps 2-4) waits to be signalled."""
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, vocab_size=128))
forwards = []


def pre(module, args, kwargs):
    forwards.append(1)
    if len(forwards) == 4:
        print("in-window", flush=True)
        time.sleep(60)


model.register_forward_pre_hook(pre, with_kwargs=True)
model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
print("finished", flush=True)
sys.exit(0)
