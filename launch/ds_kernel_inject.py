"""DeepSpeed `init_inference` with kernel injection, the tortoise-tts way: a GPT-2 model (random weights, from a
config) handed to `deepspeed.init_inference(model, replace_with_kernel_inject=True, dtype=half)`, then HF
`generate()`. GPU only (the fused inference kernels are CUDA). `deepspeed --num_gpus N ds_kernel_inject.py`
splits it over N GPUs (`tensor_parallel.tp_size`).
"""
import argparse
import os
import time

import deepspeed
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--no-inject", action="store_true")
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=16, n_positions=1024, vocab_size=50257)
    model = GPT2LMHeadModel(config).half().eval()
    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": world}, dtype=torch.half,
                                      replace_with_kernel_inject=not args.no_inject)
    ids = torch.randint(0, 50257, (1, 32), device=f"cuda:{local}")
    for call in range(args.calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = engine.module.generate(ids, max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
                                     do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        print(f"rank {local} call {call + 1}: {out.shape[-1] - ids.shape[-1]} tokens, "
              f"{(time.perf_counter() - t0) / args.max_new_tokens * 1e3:.2f} ms/token", flush=True)


if __name__ == "__main__":
    main()
