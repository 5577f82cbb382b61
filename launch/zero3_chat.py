"""The report's main.py: HfDeepSpeedConfig with ZeRO-3 and a `tensor_parallel` block, from_pretrained,
deepspeed.initialize, then `module.chat(...)` with a different prompt on each rank.

    deepspeed --num_gpus 2 launch/zero3_chat.py --size qwen2-7b --tp-size 2
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 launch/zero3_chat.py --size tiny --tp-size 2
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvlm_standin import (ByteTokenizer, NVLMStandIn, build_config, dtype_argument, pixel_values,  # noqa: E402
                          place_rank, prompt_for, set_local_size_for_cpu_allreduce, skip_cpu_allreduce_op,
                          timed_chat)

CHECKPOINT_WAIT_S = 900


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="tiny")
    p.add_argument("--tp-size", type=int, default=None,
                   help='put "tensor_parallel": {"tp_size": N} in the config, as the report did')
    p.add_argument("--autotp-size", type=int, default=None,
                   help='put "tensor_parallel": {"autotp_size": N} in the config (DeepSpeed >= 0.16.4); the ranks '
                        'of an AutoTP group share one input, so every rank then gets the same prompt')
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1, help="chat() calls, one after the other")
    p.add_argument("--load", choices=("pretrained", "config"), default="pretrained",
                   help="from_pretrained of a random-weight checkpoint, or from_config (no disk)")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto")
    p.add_argument("--result", default=None, help="append one JSON line per chat() call to this file")
    p.add_argument("--no-cpu-allreduce-op", action="store_true",
                   help="without AutoTP: do not let DeepSpeed compile its CPU all-reduce op, which only AutoTP "
                        "calls (minutes on a small machine; make demo)")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # DeepSpeed's launcher
    return p.parse_args(argv)


def ds_config(args, bf16: bool) -> dict:
    """The report's config; the tensor_parallel block only when asked for."""
    config = {
        "bf16": {"enabled": bf16},
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True},
    }
    tp = {}
    if args.tp_size is not None:
        tp["tp_size"] = args.tp_size
    if args.autotp_size is not None:
        tp["autotp_size"] = args.autotp_size
    if tp:
        config["tensor_parallel"] = tp
    return config


def ensure_checkpoint(path: str, size: str, dtype, rank: int) -> None:
    """Rank 0 saves a random-weight checkpoint once; the other ranks wait for it to appear whole."""
    done = os.path.join(path, "config.json")
    if rank == 0 and not os.path.exists(done):
        tmp = f"{path}.{os.getpid()}.tmp"
        NVLMStandIn(build_config(size)).to(dtype).save_pretrained(tmp)
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    deadline = time.time() + CHECKPOINT_WAIT_S
    while not os.path.exists(done):
        if time.time() > deadline:
            raise SystemExit(f"rank {rank}: checkpoint {path} did not appear")
        time.sleep(0.5)


def build(args):
    """The report's set-up, up to a model ready to chat: (model, tokenizer, pixels, prompt, place)."""
    import deepspeed
    import transformers
    from transformers.integrations import HfDeepSpeedConfig

    place = place_rank(args.dtype)
    config = ds_config(args, place.bf16)
    if (args.autotp_size or 0) > 1:
        set_local_size_for_cpu_allreduce()
    elif args.no_cpu_allreduce_op:
        skip_cpu_allreduce_op()
    dschf = HfDeepSpeedConfig(config)  # noqa: F841 - must stay alive: from_pretrained builds under zero.Init

    if args.load == "pretrained":
        # One checkpoint per transformers release: the report's era (4.4x) and today's save differently.
        default = f"dstrace-standin-{args.size}-transformers{transformers.__version__}"
        path = args.checkpoint_dir or os.path.join("/tmp", default)
        ensure_checkpoint(path, args.size, place.dtype, place.rank)
        model = NVLMStandIn.from_pretrained(path, **dtype_argument(place.dtype))
    else:
        model = NVLMStandIn._from_config(build_config(args.size), **dtype_argument(place.dtype))
    engine, *_ = deepspeed.initialize(model=model, config_params=config)
    model = engine.module.eval()

    tokenizer = ByteTokenizer(model.config.llm_config["vocab_size"])
    pixels = pixel_values(place.device, place.dtype)
    prompt = prompt_for(0 if (args.autotp_size or 0) > 1 else place.rank)
    return model, tokenizer, pixels, prompt, place


def main(argv=None) -> None:
    args = parse_args(argv)
    model, tokenizer, pixels, prompt, place = build(args)
    for i in range(args.repeats):
        timed_chat(model, tokenizer, pixels, prompt, args.max_new_tokens, place.rank, i + 1, args.result)


if __name__ == "__main__":
    main()
