"""Why `dstrace try --set zero_optimization.stage=0` changes the stand-in's greedy answer on a GPU (issue #26):
the report's set-up (launch/zero3_chat.py: HfDeepSpeedConfig, from_pretrained of one saved checkpoint,
deepspeed.initialize) with the stage given here, then what each stage computes from the same checkpoint:
every buffer (name, dtype, device, a hash of its values), a hash of a few weights, the prefill's last logits
and the greedy token ids. Run once per stage, then compare:

    torchrun --nproc_per_node 1 launch/answers_diff.py --stage 3 --out s3.json --checkpoint-dir DIR --size qwen2-7b
    torchrun --nproc_per_node 1 launch/answers_diff.py --stage 0 --out s0.json --checkpoint-dir DIR --size qwen2-7b
    python launch/answers_diff.py --compare s3.json s0.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def digest(t) -> str:
    import torch
    return hashlib.sha256(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()).hexdigest()[:16]


def measure(args) -> dict:
    import torch
    import zero3_chat
    from nvlm_standin import generation_config

    base = zero3_chat.ds_config
    zero3_chat.ds_config = lambda a, bf16: {**base(a, bf16), "zero_optimization": {"stage": args.stage}}
    cpu_only = [] if torch.cuda.is_available() else ["--no-cpu-allreduce-op"]
    chat_args = zero3_chat.parse_args(["--size", args.size, "--checkpoint-dir", args.checkpoint_dir, *cpu_only])
    model, tokenizer, pixels, prompt, place = zero3_chat.build(chat_args)
    out = {"stage": args.stage, "buffers": {}, "weights": {}}
    for name, buf in model.named_buffers():
        out["buffers"][name] = [str(buf.dtype), str(buf.device), digest(buf)]
    names = ["language_model.lm_head.weight", "language_model.model.layers.0.self_attn.q_proj.weight",
             "language_model.model.norm.weight", "mlp1.1.weight"]
    params = dict(model.named_parameters())
    import deepspeed
    with deepspeed.zero.GatheredParameters([params[n] for n in names if n in params]):
        for n in names:
            if n in params:
                out["weights"][n] = [str(params[n].dtype), digest(params[n])]
    with torch.no_grad():
        image = model.mlp1(model.vision_model(pixels))
        ids = torch.tensor([tokenizer.encode(f"<image>\n{prompt}")], device=image.device)
        text = model.language_model.get_input_embeddings()(ids)
        embeds = torch.cat([image.unsqueeze(0).to(text.dtype), text], dim=1)
        out["image_features"] = digest(image)
        logits = model.language_model(inputs_embeds=embeds).logits[0, -1].float()
        top = torch.topk(logits, 5)
        out["prefill_top5"] = [[int(i), float(v)] for v, i in zip(top.values, top.indices)]
        out["prefill_logits"] = logits.cpu().tolist()
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        gen = model.language_model.generate(inputs_embeds=embeds, attention_mask=mask, **generation_config(16))
        out["tokens"] = [int(t) for t in gen[0]]
    return out


def compare(a_path: str, b_path: str) -> None:
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    print(f"stage {a['stage']} vs stage {b['stage']}")
    for kind in ("buffers", "weights"):
        for name in sorted(set(a[kind]) | set(b[kind])):
            x, y = a[kind].get(name), b[kind].get(name)
            if x != y:
                print(f"  {kind[:-1]} {name}: {x} vs {y}")
    print(f"  image features: {'same' if a['image_features'] == b['image_features'] else 'differ'}")
    diff = max(abs(p - q) for p, q in zip(a["prefill_logits"], b["prefill_logits"]))
    scale = max(abs(p) for p in a["prefill_logits"])
    print(f"  prefill logits: max |diff| {diff:.4g} (largest logit {scale:.4g}); top-5 {a['prefill_top5']} vs "
          f"{b['prefill_top5']}")
    first = next((i for i, (p, q) in enumerate(zip(a["tokens"], b["tokens"])) if p != q), None)
    print(f"  greedy tokens: {'same' if first is None else f'first differ at position {first}'}: "
          f"{a['tokens']} vs {b['tokens']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", type=int, choices=(0, 3))
    p.add_argument("--size", default="tiny")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--out")
    p.add_argument("--compare", nargs=2, metavar="JSON")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    result = measure(args)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
