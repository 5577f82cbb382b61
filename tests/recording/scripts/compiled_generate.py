"""generate() on a model whose forward is torch.compile'd (backend "eager": no C++ compiler needed).

Dynamo compiles the prefill's shapes at step 0 and the first decode's at step 1; at step 2 the cache's
length differs from step 1's, so with dynamic=None it compiles once more, with that length dynamic, and the
later steps reuse that graph: the recompile falls in step 2."""
import argparse

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--max-new-tokens", type=int, default=8)
p.add_argument("--backend", default="eager")
args = p.parse_args()

torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, vocab_size=128))
model.forward = torch.compile(model.forward, backend=args.backend)
model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=args.max_new_tokens, do_sample=False,
               eos_token_id=None, pad_token_id=0)
print("generated", flush=True)
