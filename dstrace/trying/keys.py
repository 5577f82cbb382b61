"""`--set KEY=VALUE`: DeepSpeed config paths, checked before the job starts.

The check is an allow-list kept here, not DeepSpeed's own config classes: dstrace's environment need not have
the job's DeepSpeed (the job may run another interpreter, another DeepSpeed, on another node), and importing
DeepSpeed costs seconds. It lists the top-level sections of DeepSpeed's training config (runtime/config.py) and
inference config (inference/config.py), each as an object or a value, and, for the two sections a config fix
touches and whose DeepSpeed model forbids unknown keys, their fields: `zero_optimization` (DeepSpeedZeroConfig,
aliases included) and `tensor_parallel` (TPTrainingConfig from 0.16.4, DeepSpeedTPConfig of init_inference).
The fields are the union of DeepSpeed 0.16.1 and 0.19.8 (read from their pydantic models); deeper levels are not
checked. tests/trying/test_keys.py checks the lists against the DeepSpeed installed beside dstrace.
"""
from __future__ import annotations

import difflib
import json

from dstrace.errors import UserError

OBJECT, VALUE = "object", "value"

SECTIONS: dict[str, str] = {
    # training config (deepspeed.initialize, HfDeepSpeedConfig, zero.Init)
    "train_batch_size": VALUE, "train_micro_batch_size_per_gpu": VALUE, "gradient_accumulation_steps": VALUE,
    "steps_per_print": VALUE, "dump_state": VALUE, "disable_allgather": VALUE, "gradient_clipping": VALUE,
    "prescale_gradients": VALUE, "gradient_predivide_factor": VALUE, "sparse_gradients": VALUE,
    "communication_data_type": VALUE, "seq_parallel_communication_data_type": VALUE,
    "zero_allow_untested_optimizer": VALUE, "zero_force_ds_cpu_optimizer": VALUE, "memory_breakdown": VALUE,
    "wall_clock_breakdown": VALUE, "load_universal_checkpoint": VALUE, "use_node_local_storage": VALUE,
    "graph_harvesting": VALUE, "optimizer": OBJECT, "scheduler": OBJECT, "fp16": OBJECT, "bf16": OBJECT,
    "amp": OBJECT, "torch_autocast": OBJECT, "zero_optimization": OBJECT, "activation_checkpointing": OBJECT,
    "flops_profiler": OBJECT, "comms_logger": OBJECT, "tensorboard": OBJECT, "wandb": OBJECT,
    "csv_monitor": OBJECT, "comet": OBJECT, "aio": OBJECT, "checkpoint": OBJECT, "data_efficiency": OBJECT,
    "data_types": OBJECT, "compression_training": OBJECT, "elasticity": OBJECT, "autotuning": OBJECT,
    "pipeline": OBJECT, "sparse_attention": OBJECT, "eigenvalue": OBJECT, "progressive_layer_drop": OBJECT,
    "curriculum_learning": OBJECT, "nebula": OBJECT, "weight_quantization": OBJECT, "hybrid_engine": OBJECT,
    "compile": OBJECT, "timers": OBJECT, "tensor_parallel": OBJECT,
    # inference config (deepspeed.init_inference) where it differs
    "tp": OBJECT, "dtype": VALUE, "replace_with_kernel_inject": VALUE, "kernel_inject": VALUE,
    "enable_cuda_graph": VALUE, "mp_size": VALUE, "max_out_tokens": VALUE, "max_tokens": VALUE,
    "keep_module_on_host": VALUE, "quant": OBJECT, "moe": OBJECT, "zero": OBJECT, "use_triton": VALUE,
    "triton_autotune": VALUE, "injection_policy": OBJECT,
}

ZERO_OBJECTS = ("offload_param", "offload_optimizer", "zenflow", "leaf_module")
ZERO_VALUES = (
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "compute_grad_norm", "load_from_fp32_weights",
    "elastic_checkpoint", "sub_group_size", "cpu_offload_param", "cpu_offload_use_pin_memory", "cpu_offload",
    "prefetch_bucket_size", "stage3_prefetch_bucket_size", "param_persistence_threshold",
    "stage3_param_persistence_threshold", "model_persistence_threshold", "stage3_model_persistence_threshold",
    "max_live_parameters", "stage3_max_live_parameters", "max_reuse_distance", "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
    "module_granularity_threshold", "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
    "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients",
    "parameter_alignment", "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "mics_shard_size", "mics_hierarchical_params_gather", "memory_efficient_linear",
    "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
    "save_muon_momentum_buffer_in_memory")
TP_OBJECTS = ("tensor_parallel", "tp")
TP_VALUES = ("autotp_size", "tp_size", "dtype", "tp_overlap_comm", "vocab_parallel_lm_head",
             "vocab_parallel_ce_backend", "injection_policy_tuple", "partition_config", "preset_model",
             "keep_module_on_host", "replace_with_kernel_inject", "kernel_inject", "enabled", "mpu", "tp_group")

FIELDS: dict[str, dict[str, str]] = {
    "zero_optimization": {**{k: OBJECT for k in ZERO_OBJECTS}, **{k: VALUE for k in ZERO_VALUES}},
    "tensor_parallel": {**{k: OBJECT for k in TP_OBJECTS}, **{k: VALUE for k in TP_VALUES}},
}
FIELDS["tp"] = FIELDS["tensor_parallel"]


def parse_value(text: str):
    """JSON where it parses (0, 1e9, true, {"autotp_size": 2}), else the text as a string (bf16, cpu)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _close(word: str, known) -> str:
    near = difflib.get_close_matches(word, list(known), n=3)
    return f"; did you mean {' or '.join(near)}?" if near else ""


def check_path(path: str, value) -> None:
    """UserError for a path DeepSpeed does not know or one that steps into a value."""
    parts = path.split(".")
    if not path or any(not p for p in parts):
        raise UserError(f"--set {path}: not a config path; write it as section.key=value, "
                        "e.g. zero_optimization.stage=0")
    kind = SECTIONS.get(parts[0])
    if kind is None:
        raise UserError(f"--set {path}: {parts[0]!r} is not a DeepSpeed config section{_close(parts[0], SECTIONS)} "
                        "(docs/try.md lists the sections dstrace knows)")
    if len(parts) == 1:
        return
    if kind == VALUE:
        raise UserError(f"--set {path}: {parts[0]} is a value, not an object: a path cannot go into it")
    fields = FIELDS.get(parts[0])
    if fields is None:
        return
    field = fields.get(parts[1])
    if field is None:
        raise UserError(f"--set {path}: {parts[0]} has no key {parts[1]!r} in DeepSpeed 0.16-0.19"
                        f"{_close(parts[1], fields)} (docs/try.md lists the keys dstrace knows)")
    if len(parts) > 2 and field == VALUE:
        raise UserError(f"--set {path}: {parts[0]}.{parts[1]} is a value, not an object: a path cannot go into it")


def parse_sets(items: list[str]) -> list[tuple[str, object]]:
    """[(path, value)] in the order given; a path given twice keeps its last value."""
    out: dict[str, object] = {}
    for item in items:
        path, sep, text = item.partition("=")
        if not sep:
            raise UserError(f"--set {item}: expected KEY=VALUE, e.g. zero_optimization.stage=0")
        path = path.strip()
        value = parse_value(text)
        check_path(path, value)
        out.pop(path, None)
        out[path] = value
    paths = list(out)
    for a in paths:
        for b in paths:
            if b.startswith(a + "."):
                raise UserError(f"--set {a} and --set {b}: one sets a value inside the other; give one of them")
    return list(out.items())


def describe(overrides: list[tuple[str, object]]) -> str:
    return ", ".join(f"{p}={json.dumps(v)}" for p, v in overrides)
