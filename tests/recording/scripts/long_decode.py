"""A long greedy decode on a model whose KV cache is large per token (8 heads of 64 per layer, no sharing):
the cache's concatenation and the attention over it cost more at each step, while the rest of a step stays
the same."""
import argparse

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--max-new-tokens", type=int, default=400)
args = p.parse_args()

torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(hidden_size=512, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=8, num_key_value_heads=8, vocab_size=128))
with torch.no_grad():
    model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=args.max_new_tokens, do_sample=False,
                   eos_token_id=None, pad_token_id=0)
print("generated", flush=True)
