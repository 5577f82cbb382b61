"""The path that really splits the weights: `deepspeed.init_inference` with AutoTP, then `module.chat(...)`.

AutoTP replaces each Linear by a column- or row-split shard and all-reduces activations after the
row-split ones; every rank computes the same sequence, so every rank gets the same prompt.

    deepspeed --num_gpus 2 launch/autotp_chat.py --size qwen2-7b --tp-size 2
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 launch/autotp_chat.py --size tiny --tp-size 2
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvlm_standin import (ByteTokenizer, NVLMStandIn, build_config, dtype_argument, place_rank,  # noqa: E402
                          timed_chat, pixel_values, prompt_for, set_local_size_for_cpu_allreduce)

SEED = 0  # every rank builds the same random weights, as if all had loaded one checkpoint


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="tiny")
    p.add_argument("--tp-size", type=int, default=None, help="AutoTP degree (default: the world size)")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1, help="chat() calls, one after the other")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto")
    p.add_argument("--result", default=None, help="append one JSON line per chat() call to this file")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # DeepSpeed's launcher
    return p.parse_args(argv)


def build_model(size: str, dtype, device) -> NVLMStandIn:
    """The full model on this rank's device, same weights on every rank; AutoTP then keeps a shard."""
    torch.manual_seed(SEED)
    with device:
        return NVLMStandIn._from_config(build_config(size), **dtype_argument(dtype))


def main(argv=None) -> None:
    args = parse_args(argv)
    import deepspeed

    place = place_rank(args.dtype)

    set_local_size_for_cpu_allreduce()
    deepspeed.init_distributed()
    model = build_model(args.size, place.dtype, place.device).eval()
    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": args.tp_size or place.world},
                                      dtype=place.dtype)
    model = engine.module

    tokenizer = ByteTokenizer(model.config.llm_config["vocab_size"])
    pixels = pixel_values(place.device, place.dtype)
    for i in range(args.repeats):
        timed_chat(model, tokenizer, pixels, prompt_for(0), args.max_new_tokens, place.rank, i + 1, args.result)


if __name__ == "__main__":
    main()
