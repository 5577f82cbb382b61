"""The parameter inventory: every weight's logical shape against what this rank really holds.

This is where "tp_size never sharded the model" becomes visible. ZeRO-3 keeps the logical shape in
`ds_shape` and holds 1/world of the elements in `ds_tensor`; DeepSpeed's AutoTP changes the logical
shape itself. A DTensor (torch-native TP, FSDP2, transformers' `tp_plan`) keeps the global shape in
`.shape` and the shard in `.to_local()`: its `Shard` placements say over which mesh dimensions it is
split. FSDP's sharding is ZeRO-3's partitioning (the weight is gathered whole for compute), not TP.
So the effective TP degree is measured from shapes and placements, never taken from a config.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from dstrace.runfolder.records import Inventory, Weight

# Floating-point buffers named in the manifest at most (a model has a handful: rotary frequencies, norms' stats).
MAX_BUFFERS = 512
# Attributes under which DeepSpeed's AutoTP layers keep their tensor-parallel group size.
_TP_SIZE_ATTRS = ("tp_world_size", "world_size")


def _module_split(module, logical_numel: int) -> float:
    """How many ways this module's weight is split by tensor parallelism.

    `nn.Linear`/`nn.Embedding` keep the unsplit sizes as attributes, so a weight smaller than
    those is split; DeepSpeed's AutoTP layers drop those attributes but keep their group size.
    """
    for attr in _TP_SIZE_ATTRS:
        size = getattr(module, attr, None)
        if isinstance(size, int) and size > 0 and hasattr(module, "mp_group"):
            return float(size)
    full = None
    if hasattr(module, "in_features") and hasattr(module, "out_features"):
        full = module.in_features * module.out_features
    elif hasattr(module, "num_embeddings") and hasattr(module, "embedding_dim"):
        full = module.num_embeddings * module.embedding_dim
    if full and logical_numel:
        return full / logical_numel
    return 1.0


def _fsdp_params(model) -> set[int]:
    """ids of the parameters FSDP2 (`fully_shard`) manages: their DTensor's first mesh dimension is FSDP's."""
    out: set[int] = set()
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        state = get_state()
        for group in getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]:
            for fsdp_param in getattr(group, "fsdp_params", None) or []:
                out.add(id(fsdp_param.sharded_param))
    return out


@dataclass
class DTensorSplit:
    """How a DTensor parameter is laid out: TP ways (Shard placements outside FSDP's dimension), FSDP ways."""
    tp: int
    fsdp: int
    placements: str


def dtensor_split(p, fsdp_managed: bool) -> DTensorSplit | None:
    """None for a plain tensor. Each `Shard` placement splits the weight over its mesh dimension; for an
    FSDP-managed parameter, mesh dimension 0 is FSDP's (the data-parallel shard, gathered for compute)."""
    placements = getattr(p, "placements", None)
    mesh = getattr(p, "device_mesh", None)
    if placements is None or mesh is None or not hasattr(p, "to_local"):
        return None
    names = getattr(mesh, "mesh_dim_names", None) or ()
    tp = fsdp = 1
    parts = []
    for dim, placement in enumerate(placements):
        size = int(mesh.size(dim))
        label = names[dim] if dim < len(names) else f"dim{dim}"
        parts.append(f"{placement}@{label}={size}")
        if type(placement).__name__ not in ("Shard", "_StridedShard"):
            continue
        if fsdp_managed and dim == 0:
            fsdp *= size
        else:
            tp *= size
    return DTensorSplit(tp=tp, fsdp=fsdp, placements=", ".join(parts))


def take_inventory(model, taken_at: str) -> Inventory:
    weights: list[Weight] = []
    classes: Counter = Counter()
    logical = local = local_bytes = logical_bytes = partitioned = fsdp_sharded = dtensors = 0
    seen: set[int] = set()
    fsdp = _fsdp_params(model)
    for module_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:  # tied weights count once
                continue
            seen.add(id(p))
            shape = list(getattr(p, "ds_shape", None) or p.shape)
            logical_numel = 1
            for d in shape:
                logical_numel *= int(d)
            shard = getattr(p, "ds_tensor", None)
            layout = dtensor_split(p, id(p) in fsdp)
            if shard is not None:
                partitioned += 1
                local_numel = int(shard.numel())
            elif layout is not None:
                dtensors += 1
                local_numel = int(p.to_local().numel())
                fsdp_sharded += layout.fsdp > 1
            else:
                local_numel = int(p.numel())
            item = p.element_size()
            if layout is not None:
                split = float(layout.tp)
            else:
                split = _module_split(module, logical_numel) if len(shape) == 2 else 1.0
            cls = type(module).__name__
            classes[cls] += 1
            weights.append(Weight(
                name=f"{module_name}.{pname}" if module_name else pname, shape=shape,
                local_numel=local_numel, dtype=str(p.dtype).replace("torch.", ""),
                module_class=cls, split=round(split, 3), placements=layout.placements if layout else None))
            logical += logical_numel
            local += local_numel
            local_bytes += local_numel * item
            logical_bytes += logical_numel * item
    buffers = {name: str(b.dtype).replace("torch.", "") for name, b in model.named_buffers()
               if b.is_floating_point()}
    return Inventory(
        buffer_dtypes=dict(list(buffers.items())[:MAX_BUFFERS]),
        taken_at=taken_at, model_class=type(model).__name__, weights=weights,
        logical_numel=logical, local_numel=local, local_bytes=local_bytes, logical_bytes=logical_bytes,
        zero3_partitioned=partitioned, module_classes=dict(classes), effective_tp=effective_tp(weights),
        fsdp_sharded=fsdp_sharded, dtensors=dtensors)


def effective_tp(weights: list[Weight]) -> int:
    """The split most of the model's 2-D weights show, weighted by size; 1 when nothing is split."""
    votes: Counter = Counter()
    for w in weights:
        if len(w.shape) == 2:
            numel = w.shape[0] * w.shape[1]
            votes[max(1, round(w.split))] += numel
    return votes.most_common(1)[0][0] if votes else 1
