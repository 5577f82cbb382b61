"""The report's baseline: one process, HF `device_map="auto"` spreading the layers over all GPUs
(a pipeline with one stage active at a time), `chat()` on one prompt after another.

    python launch/device_map_chat.py --size qwen2-7b --prompts 2
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvlm_standin import (ByteTokenizer, NVLMStandIn, build_config, dispatch_over_gpus, dtype_argument,  # noqa: E402
                          timed_chat, pixel_values, prompt_for)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="tiny")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--prompts", type=int, default=1, help="one chat() per prompt, as the ranks would each do")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--result", default=None)
    args = p.parse_args(argv)

    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        model = dispatch_over_gpus(build_config(args.size), dtype)
    else:
        model = NVLMStandIn._from_config(build_config(args.size), **dtype_argument(dtype))
    model.eval()
    first = next(model.parameters()).device
    tokenizer = ByteTokenizer(model.config.llm_config["vocab_size"])
    pixels = pixel_values(first, dtype)
    call = 0
    for _ in range(args.repeats):
        for prompt in range(args.prompts):
            call += 1
            timed_chat(model, tokenizer, pixels, prompt_for(prompt), args.max_new_tokens, 0, call, args.result)


if __name__ == "__main__":
    main()
