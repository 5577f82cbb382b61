"""Config overrides for `dstrace try`, applied inside the job where it hands DeepSpeed a config, and the
hashes of what each generate() returned (whether a change kept the answers).

`dstrace try` validates the `--set` paths before the job starts and passes them in DSTRACE_CONFIG_OVERRIDES
(a JSON list of [path, value]). Here each config the job passes to deepspeed.initialize, init_inference,
HfDeepSpeedConfig or zero.Init is copied (a path is read as JSON), the overrides set on the copy, and the copy
handed on in the original's place; the user's own dict is never changed. Recording code: standard library only,
old syntax kept simple, every failure noted rather than raised.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os

ENV_OVERRIDES = "DSTRACE_CONFIG_OVERRIDES"

INFERENCE_SECTIONS = ("tensor_parallel", "tp", "dtype", "replace_with_kernel_inject", "kernel_inject",
                      "enable_cuda_graph", "mp_size", "max_out_tokens", "max_tokens", "keep_module_on_host",
                      "quant", "moe", "zero", "use_triton", "triton_autotune", "injection_policy", "checkpoint")
"""Top-level keys of DeepSpeed's inference config (DeepSpeedInferenceConfig, 0.16 and 0.19): the only overrides
init_inference gets; the training config's sections (zero_optimization...) mean nothing there."""


class NotApplied(Exception):
    """An override that cannot be set on this config (a path into a value that is not an object)."""


def requested() -> list[tuple[str, object]]:
    """The overrides this job was given; [] when it was given none (or they are not a JSON list of pairs)."""
    text = os.environ.get(ENV_OVERRIDES)
    if not text:
        return []
    data = json.loads(text)
    return [(str(path), value) for path, value in data]


def set_path(config: dict, path: str, value) -> None:
    """config[a][b][c] = value for "a.b.c", making the objects on the way; refusing a step into a non-object."""
    node = config
    parts = path.split(".")
    for i, key in enumerate(parts[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, dict):
            raise NotApplied(f"{'.'.join(parts[:i + 1])} is {json.dumps(child, default=str)[:80]}, not an object")
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def _as_dict(config):
    """The config as a dict of its own: a dict copied, a JSON file read; None for anything else (a pydantic
    config object, a namespace)."""
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)):
        with open(os.fspath(config)) as f:
            loaded = json.load(f)
        return loaded if isinstance(loaded, dict) else None
    return None


def apply(config, api: str, overrides: list[tuple[str, object]]):
    """(config to hand on, record of what was done). The record: {"applied": {path: value}, "config": the config
    handed on} or {"not_applied": reason}; the config handed on is `config` itself when nothing was set."""
    if api == "deepspeed.init_inference":
        overrides = [(p, v) for p, v in overrides if p.split(".")[0] in INFERENCE_SECTIONS]
    if not overrides:
        return config, {"not_applied": "no override concerns this config"}
    if config is None:
        config = {}
    new = _as_dict(config)
    if new is None:
        return config, {"not_applied": f"the config is a {type(config).__name__}, not a dict or a JSON file"}
    for path, value in overrides:
        set_path(new, path, value)
    return new, {"applied": dict(overrides), "config": json.loads(json.dumps(new, default=str))}


def override_call(api: str, arguments: dict, overrides: list[tuple[str, object]]) -> dict:
    """Set the overrides on the config among a DeepSpeed entry point's bound `arguments` (changed in place);
    the record of what was done."""
    if api == "deepspeed.initialize":
        key = "config" if arguments.get("config") is not None else (
            "config_params" if arguments.get("config_params") is not None else None)
        if key is None and getattr(arguments.get("args"), "deepspeed_config", None) is not None:
            ns = copy.copy(arguments["args"])  # the job's namespace keeps its path; DeepSpeed gets the dict
            new, record = apply(ns.deepspeed_config, api, overrides)
            if "applied" in record:
                ns.deepspeed_config = None
                arguments["args"], arguments["config"] = ns, new
            return record
        key = key or "config"
        new, record = apply(arguments.get(key), api, overrides)
        arguments[key] = new
        return record
    if api == "deepspeed.init_inference":
        if arguments.get("config") is not None:
            new, record = apply(arguments["config"], api, overrides)
            arguments["config"] = new
            return record
        kwargs = dict(arguments.get("kwargs") or {})
        new, record = apply(kwargs, api, overrides)
        arguments["kwargs"] = new
        return record
    key = "config_dict_or_path" if arguments.get("config_dict_or_path") is not None else (
        "config" if arguments.get("config") is not None else None)
    if key is None:
        return {"not_applied": "zero.Init was given no config"}
    new, record = apply(arguments[key], api, overrides)
    arguments[key] = new
    return record


def token_hash(tensor) -> str | None:
    """sha256 of a tensor's shape, dtype and bytes (token ids, or inputs_embeds for a call given no ids): equal
    answers, equal hashes. None for anything that is not a tensor."""
    import sys

    tensor = getattr(tensor, "sequences", tensor)
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(tensor, torch.Tensor):
        return None
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    h = hashlib.sha256(json.dumps([list(tensor.shape), str(tensor.dtype)]).encode())
    try:
        h.update(flat.view(torch.uint8).numpy().tobytes())
    except Exception:  # noqa: BLE001 - a torch without numpy: the values as text
        h.update(json.dumps(flat.tolist()).encode())
    return h.hexdigest()


def input_ids_of(args, kwargs):
    """What generate() was given to continue: input_ids / inputs, else inputs_embeds (InternVL-style chat())."""
    for key in ("input_ids", "inputs"):
        if kwargs.get(key) is not None:
            return kwargs[key]
    return args[0] if args else kwargs.get("inputs_embeds")


def device_memory_bytes() -> tuple[int | None, str | None]:
    """(bytes, kind) of the memory one rank's model lives in: its GPU's, else the host's (shared by the ranks on
    it); (None, None) when neither can be read."""
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory), "gpu"
    except Exception:  # noqa: BLE001 - recording must never break the job
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "host"
    except (ValueError, OSError, AttributeError):
        return None, None
