"""Findings about how the model is split over the ranks: a tensor-parallel size refused or without effect, and
ZeRO-3 or FSDP gathering the whole model again on every step."""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass

from dstrace.analysis.findings.inputs import FindingInputs, as_int, finding
from dstrace.analysis.loaded import LoadedRun
from dstrace.analysis.results import Finding, RankReport, StepSummary
from dstrace.runfolder.records import error_line
from dstrace.units import ms, percent, ratio, size, step_ms

DOCS = {
    "tp-config-rejected": "docs/root-cause.md#1-the-mechanism",
    "tp-not-applied": "docs/root-cause.md#1-the-mechanism",
    "zero3-gathers-model-per-step": "docs/root-cause.md#1-the-mechanism",
    "fsdp-gathers-model-per-step": "docs/workloads.md#fsdp2-training",
}
"""Where each finding of this module is explained at length (paths in the dstrace repository)."""

ZERO3_MODEL_FRACTION = 0.5
"""The model size (`inventory.logical_bytes`) counts weights a decode forward never runs (the vision
tower of NVLM/InternVL-style models) and ZeRO-3 keeps small parameters persistent, so a step that
re-gathers the whole language model shows well under 100% (73% in the tiny CPU stand-in, ~88% for a
Llama-8B on H200). Above half the model moved every step, step time scales with model size, not tokens."""

TP_ERROR = re.compile(r"tensor_parallel|tp_size|autotp|TPTraining", re.IGNORECASE)
"""DeepSpeed's refusals name the key (`tensor_parallel.tp_size`), or only the nested model and field
(`1 validation error for TPTrainingConfig / tp_size`, seen with 0.19.8)."""

AUTOTP_FIXED = (0, 16, 4)
"""DeepSpeed 0.16.0-0.16.3 have no `tensor_parallel` key in the training config (the block is accepted
and ignored); from 0.16.4 it parses into `TPTrainingConfig`, which refuses `tp_size`."""

SPLIT_REMEDY = ("to split the computation, use `deepspeed.init_inference(model, "
                "tensor_parallel={\"tp_size\": N})` (AutoTP: each rank holds ~1/N of every Linear and all-reduces "
                "activations; all ranks of a TP group must get the same input), a HF `device_map` in one process "
                "(layers spread over the GPUs), or transformers' `from_pretrained(..., tp_plan=\"auto\")` under "
                "torchrun; `dstrace compare` of these configurations measures each")


def version(run: LoadedRun, package: str) -> str | None:
    """The versions of `package` the manifests recorded, joined; None when none did."""
    found = sorted({m.versions.get(package) for m in run.manifests.values() if m.versions.get(package)})
    return ", ".join(found) if found else None


def release(version_: str | None) -> tuple[int, ...] | None:
    """`0.16.1+abc` -> (0, 16, 1); None when it does not start with numbers."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version_ or "")
    return tuple(int(x) for x in m.groups()) if m else None


def tp_config_rejected(inputs: FindingInputs) -> Finding | None:
    run = inputs.run
    hit, evidence = [], {}
    for r, m in sorted(run.manifests.items()):
        errors = [c for c in m.deepspeed_calls
                  if c.error and TP_ERROR.search(f"{c.error.get('type', '')} {c.error.get('message', '')}")]
        if errors:
            hit.append(r)
            evidence[str(r)] = [{"api": c.api, "error": c.error} for c in errors]
    if not hit:
        return None
    call = evidence[str(hit[0])][0]
    summary = f"{call['api']} rejected the tensor_parallel config: {error_line(call['error'])}"
    installed = version(run, "deepspeed")
    numbers = release(installed)
    passed = next((c.config for c in run.manifests[hit[0]].deepspeed_calls if c.api == call["api"]), None)
    block = passed.get("tensor_parallel") if isinstance(passed, dict) else None
    cause = (f"DeepSpeed {installed or '(version not recorded)'}"
             + (" parses the `tensor_parallel` block into its AutoTP training config (TPTrainingConfig), which "
                "forbids keys it does not know" if numbers and numbers >= AUTOTP_FIXED else " refused the block")
             + (f"; passed: \"tensor_parallel\": {json.dumps(block)}" if block is not None else "")
             + "; that block configures AutoTP for training (`autotp_size`), not inference")
    remedy = (SPLIT_REMEDY[0].upper() + SPLIT_REMEDY[1:] + "; to keep ZeRO-3 and split weights for training, "
              "`\"tensor_parallel\": {\"autotp_size\": N}` (accepted with ZeRO-3 from DeepSpeed 0.19.4); "
              "otherwise remove the block")
    found = finding(DOCS, "tp-config-rejected", hit, summary, {"ranks": evidence, "deepspeed": installed}, cause,
                    remedy)
    sizes = [as_int(t.value) for t in run.manifests[hit[0]].tp_requested if (as_int(t.value) or 0) > 1]
    if sizes:  # the remedy's `"tensor_parallel": {"autotp_size": N}`, the block replaced whole
        found.config_change = {"tensor_parallel": {"autotp_size": sizes[0]}}
    return found


def tp_not_applied(inputs: FindingInputs) -> Finding | None:
    run = inputs.run
    hit, evidence = [], {}
    for r, m in sorted(run.manifests.items()):
        requested = [t for t in m.tp_requested if (as_int(t.value) or 0) > 1]
        if requested and m.inventory is not None and m.inventory.effective_tp == 1:
            hit.append(r)
            evidence[str(r)] = {"requested": [{"source": t.source, "key": t.key, "value": t.value} for t in requested],
                                "effective_tp": m.inventory.effective_tp,
                                "zero3_partitioned_weights": m.inventory.zero3_partitioned,
                                "weights": len(m.inventory.weights)}
    if not hit:
        return None
    first = evidence[str(hit[0])]["requested"][0]
    summary = (f"tensor parallel size {first['value']} was requested ({first['source']}: "
               f"{first['key']}) but the weights keep their full shape (effective TP 1): nothing is split by TP")
    installed = version(run, "deepspeed")
    numbers = release(installed)
    keys = sorted({e["key"] for v in evidence.values() for e in v["requested"]})
    if numbers and numbers < AUTOTP_FIXED and any(k.startswith("tensor_parallel.") for k in keys):
        cause = (f"the installed DeepSpeed {installed} has no `tensor_parallel` key in its config: it accepted the "
                 "block and ignored it, so every tp_size runs the same program")
    else:
        cause = (f"the requested size ({', '.join(keys)}) reached no code that splits weights"
                 + (f" (DeepSpeed {installed})" if installed else ""))
    partitioned = evidence[str(hit[0])]["zero3_partitioned_weights"]
    if partitioned:
        cause += (f"; ZeRO-3 partitions parameter storage ({partitioned} weights), not the computation: every "
                  "rank still runs the whole model and gathers it every step")
    return finding(DOCS, "tp-not-applied", hit, summary, {"ranks": evidence, "deepspeed": installed},
                   cause, SPLIT_REMEDY[0].upper() + SPLIT_REMEDY[1:])


@dataclass(frozen=True)
class GatheredModel:
    """The gate ZeRO-3's and FSDP's findings share: the median bytes all-gathered per step are at least
    ZERO3_MODEL_FRACTION of the model."""
    steps: StepSummary
    ratio: float  # gathered bytes per step over the model's
    ranks: list[int]  # the ranks that gather that much (all ranks found, when no rank's own median does)
    step_ms: float  # the run's ms per step, else the median over the profiled window


def gathered_model(inputs: FindingInputs) -> GatheredModel | None:
    steps = inputs.steps
    if steps is None or not steps.model_bytes or not steps.gathered_bytes_median:
        return None
    share = steps.gathered_bytes_median / steps.model_bytes
    if share < ZERO3_MODEL_FRACTION:
        return None
    concerned = [r for r, e in steps.per_rank.items()
                 if e.get("gathered_bytes_median", 0) >= ZERO3_MODEL_FRACTION * steps.model_bytes] or inputs.run.ranks
    return GatheredModel(steps, share, sorted(concerned),
                         steps.ms_per_step if steps.ms_per_step is not None else steps.ms_median)


def _fsdp_run(run: LoadedRun) -> bool:
    """Weights FSDP shards (DTensors over FSDP's mesh dimension) and none ZeRO-3 partitions."""
    invs = [m.inventory for m in run.manifests.values() if m.inventory is not None]
    return any(i.fsdp_sharded for i in invs) and not any(i.zero3_partitioned for i in invs)


def _gather_per_step(ranks: dict[int, RankReport], steps: StepSummary) -> dict[str, float] | None:
    """Median over ranks of the traced AllGather transfer and peer wait per traced step."""
    transfer, wait = [], []
    for r, s in ranks.items():
        ag = s.collectives.get("AllGather")
        count = steps.per_rank.get(r, {}).get("count")
        if ag and count:
            transfer.append(ag.transfer_us / count)
            wait.append(ag.wait_us / count)
    if not transfer:
        return None
    return {"transfer_us": statistics.median(transfer), "wait_us": statistics.median(wait)}


def zero3_gathers_model(inputs: FindingInputs) -> Finding | None:
    gate = None if _fsdp_run(inputs.run) else gathered_model(inputs)
    if gate is None:
        return None
    steps = gate.steps
    per_rank = {str(r): e.get("gathered_bytes_median") for r, e in steps.per_rank.items()}
    step = "decode step" if steps.decode else "step"
    summary = (f"each {step} gathers {size(steps.gathered_bytes_median)} per rank, {percent(gate.ratio)} of the "
               f"model's {size(steps.model_bytes)}: ZeRO-3 gathers the weights again on every forward "
               f"({step_ms(gate.step_ms)} per {step})")
    link = _gather_per_step(inputs.ranks, steps)
    world_size = inputs.run.world_size
    world = f"1/{world_size}" if world_size else "a share"
    cause = (f"ZeRO-3 partitions parameter storage, not the computation: each rank stores {world} of every weight "
             "but runs the whole model, all-gathering each sub-module's weights before its forward and freeing "
             "them after; generate() runs one forward per token (and transformers sets synced_gpus=True under "
             f"ZeRO-3), so {size(steps.gathered_bytes_median)} reach every rank for every token")
    if link:
        cause += (f"; in the profiled steps the all-gathers took {ms(link['transfer_us'])} of transfer and "
                  f"{ms(link['wait_us'])} of waiting for peers per step (median over ranks)")
    remedy = ("if the model fits without partitioning, do not use ZeRO-3 for inference; " + SPLIT_REMEDY
              + "; if ZeRO-3 must stay (model too large), serve several prompts per forward so each gather "
                "serves more tokens, and raise `stage3_param_persistence_threshold` to keep more weights resident")
    found = finding(DOCS, "zero3-gathers-model-per-step", gate.ranks, summary, {
        "gathered_bytes_median": steps.gathered_bytes_median, "gathered_source": steps.gathered_source,
        "model_bytes": steps.model_bytes, "ratio": gate.ratio, "threshold_ratio": ZERO3_MODEL_FRACTION,
        "ms_per_step_median": gate.step_ms, "per_rank_gathered_bytes_median": per_rank,
        "allgather_per_traced_step_us": link}, cause, remedy)
    found.config_change = {"zero_optimization.stage": 0}  # "do not use ZeRO-3 for inference"
    return found


def fsdp_gathers_model(inputs: FindingInputs) -> Finding | None:
    """FSDP's form of ZeRO-3's cost: every sharded unit all-gathered before its forward and again for backward."""
    run = inputs.run
    gate = gathered_model(inputs) if _fsdp_run(run) else None
    if gate is None:
        return None
    steps = gate.steps
    count = {str(r): s.collectives["AllGather"].count / steps.per_rank[r]["count"] for r, s in inputs.ranks.items()
             if "AllGather" in s.collectives and steps.per_rank.get(r, {}).get("count")}
    per_step = statistics.median(count.values()) if count else None
    sharded = max(m.inventory.fsdp_sharded for m in run.manifests.values() if m.inventory is not None)
    summary = (f"each step all-gathers {size(steps.gathered_bytes_median)} per rank, {percent(gate.ratio)} of the "
               f"model's {size(steps.model_bytes)}" + (f", in {per_step:.0f} all-gathers" if per_step else "")
               + f": FSDP gathers every sharded unit's weights for its forward and again for its backward "
               f"({step_ms(gate.step_ms)} per step)")
    cause = (f"FSDP shards {sharded} weights over the data-parallel ranks (ZeRO-3's partitioning): each "
             "`fully_shard` unit all-gathers its weights before its forward, frees them after "
             "(reshard_after_forward=True) and all-gathers them again before its backward, then reduce-scatters "
             f"its gradients; {ratio(gate.ratio)} the model moves to every rank per step")
    link = _gather_per_step(inputs.ranks, steps)
    if link:
        cause += (f"; the all-gathers took {ms(link['transfer_us'])} of transfer and {ms(link['wait_us'])} of "
                  "waiting for peers per step (median over ranks)")
    remedy = ("if the model and its optimizer state fit on one device, DDP moves only gradients (one all-reduce "
              "per bucket); otherwise keep the gathered weights of the last units for backward "
              "(`reshard_after_forward=False` on them), shard over a smaller group (HSDP: a 2-D mesh) or raise the "
              "batch per step so each gather serves more samples; check that FSDP2's prefetching overlaps the "
              "gathers with compute")
    return finding(DOCS, "fsdp-gathers-model-per-step", gate.ranks, summary, {
        "gathered_bytes_median": steps.gathered_bytes_median, "gathered_source": steps.gathered_source,
        "model_bytes": steps.model_bytes, "ratio": gate.ratio, "threshold_ratio": ZERO3_MODEL_FRACTION,
        "allgathers_per_step": count, "fsdp_sharded_weights": sharded, "ms_per_step_median": gate.step_ms,
        "allgather_per_traced_step_us": link}, cause, remedy)
