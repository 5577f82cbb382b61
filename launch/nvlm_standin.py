"""A small NVLM-D-shaped stand-in: a vision tower, a projector and a Qwen2 language model, with an
InternVL-style `chat()` that embeds the image, builds the prompt and calls `language_model.generate`.

Weights are random (built from a config: nothing can be downloaded). Generation always produces
exactly `max_new_tokens` tokens, so runs of different configurations are comparable step for step.
"""
from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

# Language-model shapes. "tiny" and "mini" run on CPU in tests; "qwen2-7b" is the 7-8B class used on the H200s;
# "qwen2-72b" is the report's language model (shape only: it needs more than 2 GPUs).
SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
    # The smallest shape AutoTP splits two ways: DeepSpeed shards rows in grains of 64, so a 64-wide
    # weight (as in "tiny") stays whole on one rank.
    "mini": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
    "small": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=32000),
    "qwen2-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=151936),
    "qwen2-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, vocab_size=152064),
    "qwen2-72b": dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
                      num_key_value_heads=8, vocab_size=152064),
}
IMAGE_TOKENS = 16
PATCH_DIM = 3 * 14 * 14


class NVLMStandInConfig(PretrainedConfig):
    model_type = "nvlm_standin"

    def __init__(self, llm_config: dict | None = None, vision_hidden: int = 64, **kwargs):
        super().__init__(**kwargs)
        self.llm_config = dict(llm_config or SIZES["tiny"])
        self.vision_hidden = vision_hidden


class ByteTokenizer:
    """Enough of a tokenizer for chat(): bytes folded into the vocabulary."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [1 + b % (self.vocab_size - 1) for b in text.encode()]

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)


class NVLMStandIn(PreTrainedModel):
    config_class = NVLMStandInConfig
    base_model_prefix = "nvlm"
    _no_split_modules = ["Qwen2DecoderLayer"]

    def __init__(self, config: NVLMStandInConfig):
        super().__init__(config)
        llm = Qwen2Config(**config.llm_config, pad_token_id=0, bos_token_id=None, eos_token_id=None)
        vh = config.vision_hidden
        self.vision_model = nn.Sequential(nn.Linear(PATCH_DIM, vh), nn.GELU(), nn.Linear(vh, vh))
        self.mlp1 = nn.Sequential(nn.LayerNorm(vh), nn.Linear(vh, llm.hidden_size), nn.GELU(),
                                  nn.Linear(llm.hidden_size, llm.hidden_size))
        self.language_model = Qwen2ForCausalLM(llm)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, 0.02)
            if module.bias is not None:
                module.bias.data.zero_()

    def chat(self, tokenizer, pixel_values, question, generation_config: dict):
        """InternVL's shape of chat(): image features spliced in front of the prompt's embeddings."""
        image = self.mlp1(self.vision_model(pixel_values))  # [patches, hidden]
        ids = torch.tensor([tokenizer.encode(f"<image>\n{question}")], device=image.device)
        text = self.language_model.get_input_embeddings()(ids)
        embeds = torch.cat([image.unsqueeze(0).to(text.dtype), text], dim=1)
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        out = self.language_model.generate(inputs_embeds=embeds, attention_mask=mask, **generation_config)
        return tokenizer.decode(out[0])


def random_weight(shape, dtype, device) -> torch.Tensor:
    """Matrices N(0, 0.02), vectors (norms, biases) ones: random, but numerically tame."""
    t = torch.empty(shape, dtype=dtype, device=device)
    return t.normal_(0.0, 0.02) if len(shape) >= 2 else t.fill_(1.0)


def dispatch_over_gpus(config: NVLMStandInConfig, dtype) -> NVLMStandIn:
    """What `from_pretrained(..., device_map="auto")` builds, without a checkpoint: the layers balanced
    over all visible GPUs, each weight created directly on its GPU."""
    from accelerate import dispatch_model, infer_auto_device_map, init_empty_weights
    from accelerate.utils import get_balanced_memory, set_module_tensor_to_device

    with init_empty_weights():
        model = NVLMStandIn(config)
    no_split = model._no_split_modules
    memory = get_balanced_memory(model, dtype=dtype, no_split_module_classes=no_split)
    device_map = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype)
    for name, param in list(model.named_parameters()):
        owner = max((k for k in device_map if k == "" or name == k or name.startswith(k + ".")), key=len)
        device = device_map[owner]
        set_module_tensor_to_device(model, name, device, value=random_weight(param.shape, dtype, device),
                                    dtype=dtype)
    return dispatch_model(model, device_map=device_map)


def dtype_argument(dtype) -> dict:
    """The dtype keyword of `from_pretrained`/`_from_config`: `dtype` from transformers 4.56 on, `torch_dtype`
    before it (the report's era, 4.4x)."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def build_config(size: str) -> NVLMStandInConfig:
    if size not in SIZES:
        raise SystemExit(f"unknown size {size!r}: choose one of {', '.join(SIZES)}")
    return NVLMStandInConfig(llm_config=SIZES[size])


def generation_config(max_new_tokens: int) -> dict:
    """Greedy, no end-of-sequence token: every call produces exactly max_new_tokens tokens."""
    return dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)


def prompt_for(rank: int) -> str:
    """A different prompt on each rank, as in the report."""
    return f"Describe image {rank} in detail, rank {rank}." + " more" * rank


@dataclass
class Placement:
    """Where this rank runs: its identity from the launcher's environment, its device and dtype."""
    rank: int
    local_rank: int
    world: int
    device: torch.device
    dtype: torch.dtype

    @property
    def bf16(self) -> bool:
        return self.dtype == torch.bfloat16


def place_rank(dtype_choice: str) -> Placement:
    """Read RANK/LOCAL_RANK/WORLD_SIZE, make this rank's GPU current, and pick the dtype: bf16 on GPUs
    and fp32 on CPU unless `dtype_choice` ("auto", "bf16", "fp32") says otherwise."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    bf16 = dtype_choice == "bf16" or (dtype_choice == "auto" and cuda)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return Placement(rank, local_rank, world, device, torch.bfloat16 if bf16 else torch.float32)


MS_PER_TOKEN_COVERS = ("the call's wall time over its new tokens: prefill, every step and any profiler window "
                       "included; `dstrace analyze` prints ms per decode step without the prefill and the "
                       "profiled steps")


def timed_chat(model, tokenizer, pixels, prompt: str, max_new_tokens: int, rank: int, call: int,
               result: str | None = None, **extra) -> dict:
    """One chat() call, timed to the last GPU kernel, printed (and appended to `result`) as a JSON line:
    the line every sweep and benchmark reads; `extra` fields go into the line too."""
    import json
    import time

    t0 = time.perf_counter()
    with torch.no_grad():
        model.chat(tokenizer, pixels, prompt, generation_config(max_new_tokens))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    line = {"rank": rank, "call": call, "wall_s": wall, "tokens": max_new_tokens,
            "ms_per_token": wall * 1e3 / max_new_tokens, "ms_per_token_covers": MS_PER_TOKEN_COVERS, **extra}
    print(json.dumps(line), flush=True)
    if result:
        with open(result, "a") as f:
            f.write(json.dumps(line) + "\n")
    return line


def pixel_values(device, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(IMAGE_TOKENS, PATCH_DIM, generator=g).to(device=device, dtype=dtype)


def set_local_size_for_cpu_allreduce() -> None:
    """DeepSpeed's CPU all-reduce kernel (AutoTP's all-reduce on CPU) maps its shared memory only when
    LOCAL_SIZE equals the world size, but runs whether or not it did: without LOCAL_SIZE, which DeepSpeed's
    launcher sets and torchrun does not, the first AutoTP all-reduce reads an unmapped workspace and the
    rank dies with SIGSEGV. torchrun's LOCAL_WORLD_SIZE is the same number. Call before init_distributed."""
    if "LOCAL_SIZE" not in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        os.environ["LOCAL_SIZE"] = os.environ["LOCAL_WORLD_SIZE"]
    atexit.register(_remove_cpu_allreduce_buffer)


def skip_cpu_allreduce_op() -> None:
    """DeepSpeed on CPU JIT-compiles its shared-memory all-reduce op in init_distributed (4-6 min on two
    busy cores), yet only `inference_all_reduce`, AutoTP's layers, calls it. Marked unavailable, DeepSpeed
    skips it (`comm/torch.py: build_shm_op`) and every collective runs on gloo, as a GPU run's do on NCCL.
    For runs without AutoTP; call before deepspeed.initialize."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def _remove_cpu_allreduce_buffer() -> None:
    """The kernel never unlinks its 66 MB shared-memory buffer: each run would leave one per rank in /dev/shm."""
    name = "_".join(["deepspeed_allreduce_buffer", str(os.getuid()), os.environ.get("MASTER_ADDR", ""),
                     os.environ.get("MASTER_PORT", ""), os.environ.get("RANK", "0")])
    try:
        os.unlink(os.path.join("/dev/shm", name))
    except OSError:
        pass
