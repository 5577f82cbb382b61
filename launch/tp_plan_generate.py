"""transformers' own tensor parallelism: `from_pretrained(..., tp_plan="auto")` splits a Llama's attention
and MLP weights over the ranks as DTensors (torch-native TP underneath), then `generate()`.
`torchrun --nproc_per_node 2`; rank 0 saves a random-weight checkpoint first (nothing is downloaded).
"""
import argparse
import os
import shutil
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True, help="folder for the random-weight checkpoint")
    p.add_argument("--max-new-tokens", type=int, default=8)
    args = p.parse_args()
    done = os.path.join(args.checkpoint, "config.json")
    if int(os.environ.get("RANK", 0)) == 0 and not os.path.exists(done):
        torch.manual_seed(0)
        tmp = f"{args.checkpoint}.{os.getpid()}.tmp"
        LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=4)).save_pretrained(tmp)
        shutil.move(tmp, args.checkpoint)
    while not os.path.exists(done):
        time.sleep(0.2)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, tp_plan="auto")
    out = model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=args.max_new_tokens, do_sample=False)
    print(f"rank {os.environ.get('RANK', 0)}: generated {out.shape[1] - 4} tokens", flush=True)


if __name__ == "__main__":
    main()
