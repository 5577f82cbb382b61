"""Small hand-made run folders: manifests and run records written as `dstrace record` writes them."""
from __future__ import annotations

import os

from dstrace.runfolder.names import manifest_path
from dstrace.runfolder.records import (
    MANIFEST_SCHEMA, RUN_SCHEMA, DeepSpeedCall, GenerationCall, Inventory, Manifest, RankStatus, RunRecord, TPRequest, Weight, Window, to_json, write_json_atomic,
)

HIDDEN = 8
WEIGHTS = [("embed.weight", [32, HIDDEN]), ("layer.q.weight", [HIDDEN, HIDDEN]), ("layer.up.weight", [16, HIDDEN])]


def inventory(world: int, tp: int = 1, zero3: bool = True) -> Inventory:
    weights = []
    for name, shape in WEIGHTS:
        split = tp if name.startswith("layer.") else 1
        local_shape = [shape[0] // split, shape[1]]
        numel = local_shape[0] * local_shape[1]
        weights.append(Weight(name=name, shape=local_shape, local_numel=numel // world if zero3 else numel,
                              dtype="float32", module_class="LinearLayer" if split > 1 else "Linear",
                              split=float(split)))
    logical = sum(w.shape[0] * w.shape[1] for w in weights)
    local = sum(w.local_numel for w in weights)
    return Inventory(taken_at="deepspeed.initialize", model_class="Toy", weights=weights, logical_numel=logical,
                     local_numel=local, local_bytes=4 * local, logical_bytes=4 * logical,
                     zero3_partitioned=len(weights) if zero3 else 0, module_classes={}, effective_tp=tp)


def dtensor_inventory(tp: int) -> Inventory:
    """The weights as transformers' `tp_plan="auto"` leaves them, as `recording.inventory` records them: DTensors
    whose `shape` is the global one, `Shard(dim=0)` over a `tp`-rank mesh, so split = tp and the rank holds
    1/tp of each."""
    weights = [Weight(name=name, shape=list(shape), local_numel=shape[0] * shape[1] // tp, dtype="float32",
                      module_class="Linear", split=float(tp), placements=f"Shard(dim=0)@tp={tp}")
               for name, shape in WEIGHTS]
    logical = sum(w.shape[0] * w.shape[1] for w in weights)
    local = sum(w.local_numel for w in weights)
    return Inventory(taken_at="generate", model_class="Toy", weights=weights, logical_numel=logical,
                     local_numel=local, local_bytes=4 * local, logical_bytes=4 * logical, zero3_partitioned=0,
                     module_classes={"Linear": len(weights)}, effective_tp=tp, dtensors=len(weights))


def write_run(run_dir: str, step_ms: list[float], *, world: int = 2, gathered: int = 0, tp_requested: int | None = None,
              tp: int = 1, zero3: bool = True, refused: bool = False, deepspeed: str = "0.16.1",
              window_steps: tuple[int, ...] = (2, 3), dtensor: bool = False) -> str:
    """A finished run of `world` ranks, each with one chat() call of the given step times; `dtensor`: its
    weights are torch-native TP DTensors over `tp` ranks (`dtensor_inventory`) instead."""
    os.makedirs(run_dir, exist_ok=True)
    config = {"zero_optimization": {"stage": 3}}
    if tp_requested:
        config["tensor_parallel"] = {"tp_size": tp_requested}
    error = {"type": "ValidationError", "message": "1 validation error for TPTrainingConfig\ntp_size\n  Extra inputs "
                                                   "are not permitted"} if refused else None
    ranks = []
    for rank in range(world):
        m = Manifest(schema=MANIFEST_SCHEMA, run_id="handmade", status="failed" if refused else "complete",
                     rank=rank, local_rank=rank, world_size=world, host="h", pid=100 + rank, started=0.0, ended=1.0,
                     versions={"deepspeed": deepspeed, "torch": "2.x"},
                     deepspeed_calls=[DeepSpeedCall(api="deepspeed.initialize", config=config, error=error)],
                     tp_requested=[TPRequest("deepspeed.initialize", "tensor_parallel.tp_size", tp_requested)]
                     if tp_requested else [])
        if refused:
            m.exit_error = error
        else:
            m.inventory = dtensor_inventory(tp) if dtensor else inventory(world, tp, zero3)
            m.calls = [GenerationCall(index=1, api="chat", model_class="Toy", wall_s=sum(step_ms) / 1e3,
                                      new_tokens=len(step_ms), step_ms=list(step_ms),
                                      gathered_bytes=[gathered] * len(step_ms))]
            m.window = Window(mode="full", call=1, start=window_steps[0] if window_steps else 0,
                              steps=len(window_steps), recorded_steps=list(window_steps))
        write_json_atomic(manifest_path(run_dir, rank), to_json(m))
        ranks.append(RankStatus(rank=rank, status=m.status, manifest=f"rank{rank}.manifest.json", traces=[]))
    record = RunRecord(schema=RUN_SCHEMA, run_id="handmade", command=["x"], cwd="/", started=0.0, ended=1.0,
                       status="incomplete" if refused else "complete", exit_code=1 if refused else 0,
                       world_size=world, ranks=ranks, problems=["rank 0 failed"] if refused else [])
    write_json_atomic(os.path.join(run_dir, "run.json"), to_json(record))
    return run_dir
