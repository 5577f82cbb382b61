"""`accelerate launch --num_processes 2` multi-process inference, tiny: every process holds the whole model and
generates for its share of the prompts (`split_between_processes`); the processes only meet at the end
(`gather_object`). A random-weight Llama built from a config: nothing is downloaded.
"""
import argparse
import time

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=256)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model = LlamaForCausalLM(config).to(accelerator.device, dtype).eval()
    prompts = [torch.randint(0, 512, (1, 8 + i)) for i in range(args.prompts)]
    lengths = []
    t0 = time.perf_counter()
    with accelerator.split_between_processes(prompts) as mine:
        for ids in mine:
            out = model.generate(ids.to(accelerator.device), max_new_tokens=args.max_new_tokens,
                                 min_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=0)
            lengths.append(int(out.shape[-1]))
    done = gather_object(lengths)
    if accelerator.is_main_process:
        print(f"{len(done)} prompts, lengths {done}, {time.perf_counter() - t0:.2f} s", flush=True)


if __name__ == "__main__":
    main()
