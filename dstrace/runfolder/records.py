"""The per-rank manifest and the run record (their schemas are these dataclasses): what a trace alone cannot
say about a rank.

Both are plain JSON written atomically, so a reader sees either the previous whole file or the new
whole file, never a torn one. Recording writes them; analysis reads them with `read_manifest`.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from dstrace.runfolder.files import write_text_atomic
from dstrace.runfolder.untrusted import read_bytes

MANIFEST_SCHEMA = "dstrace.manifest/1"
RUN_SCHEMA = "dstrace.run/1"
MAX_RECORD_BYTES = 64 << 20  # a manifest with a 70B model's inventory is about 2 MB
MAX_WORLD = 1 << 20
"""Ranks a run folder may hold, in any file (manifest, run record, trace, kept reduction): far above any job, far below
what exhausts memory (no `range(world)` of a hostile 10^9)."""


@dataclass
class Weight:
    """One parameter as this rank holds it. `shape` is the logical shape (`ds_shape` under ZeRO-3)."""
    name: str
    shape: list[int]
    local_numel: int
    dtype: str
    module_class: str
    split: float = 1.0  # logical elements of the unsplit weight over logical elements here (TP)
    placements: str | None = None  # a DTensor's placements over its mesh, e.g. "Shard(dim=0)@tp=2"


@dataclass
class Inventory:
    taken_at: str  # which hook took it: "deepspeed.initialize", "generate", ...
    model_class: str
    weights: list[Weight]
    logical_numel: int
    local_numel: int
    local_bytes: int
    logical_bytes: int
    zero3_partitioned: int  # weights carrying ds_shape/ds_tensor
    module_classes: dict[str, int]  # class name -> weights owned
    effective_tp: int  # measured from the weights' shapes, not from any config
    fsdp_sharded: int = 0  # weights FSDP holds sharded over data-parallel ranks (ZeRO-3's partitioning, torch's way)
    dtensors: int = 0  # weights that are DTensors (torch-native TP, FSDP2, transformers' tp_plan)
    buffer_dtypes: dict[str, str] = field(default_factory=dict)  # floating-point buffer -> dtype (rotary inv_freq...)


@dataclass
class TPRequest:
    """A tensor-parallel size asked for somewhere, and where."""
    source: str  # "deepspeed.initialize config", "HfDeepSpeedConfig", "init_inference", ...
    key: str  # "tensor_parallel.tp_size", "tensor_parallel.autotp_size", "init_inference(tensor_parallel.tp_size)"
    value: Any


@dataclass
class DeepSpeedCall:
    """One call of deepspeed.initialize / init_inference: its config exactly as passed and the outcome."""
    api: str
    config: Any  # dict as passed, or {"path": ..., "content": ...} for a file
    wall_s: float | None = None
    error: dict | None = None  # {"type", "message"} when DeepSpeed refused it
    overrides: dict | None = None  # `dstrace try --set`: {"applied": {path: value}, "config": as handed on} or {"not_applied": why}


@dataclass
class GenerationCall:
    """One top-level chat()/generate() call."""
    index: int
    api: str  # "chat" or "generate" (a generate inside chat belongs to the chat call)
    model_class: str
    wall_s: float | None = None
    input_tokens: int | None = None
    new_tokens: int | None = None
    step_ms: list[float] = field(default_factory=list)  # per forward; step 0 is the prefill
    gathered_bytes: list[int] = field(default_factory=list)  # ZeRO-3 all-gather bytes per forward
    error: str | None = None
    input_sha256: list[str] = field(default_factory=list)  # per generate() in the call: its input token ids hashed
    output_sha256: list[str] = field(default_factory=list)  # per generate() in the call: the token ids it returned
    step_kinds: list[str] = field(default_factory=list)  # per forward, one of STEP_KINDS (empty: recorded before)


STEP_KINDS = ("unprofiled", "profiler-warmup", "profiler-start", "profiled", "profiler-stop")
"""What the profiler did in a forward step: nothing; made ready (torch.profiler's warm-up: prepare_trace); started
recording (start_trace, in the step before the window); recorded it (a window step); stopped (stop_trace, in the
step after the window). Only `unprofiled` and `profiled` steps are times of the job's work; the other three carry
the profiler's own start and stop costs."""

GENERATE_TRIGGER = "generate step"
TIME_TRIGGER = "time"
ITERATION_TRIGGERS = ("optimizer.step", "deepspeed engine.step", "DistributedDataParallel.forward", "FSDP forward",
                      "profiler.step")
TRIGGERS = (GENERATE_TRIGGER, *ITERATION_TRIGGERS, TIME_TRIGGER)
"""What opens a profiler window (`Window.trigger`): the recording writes these names and the analysis reads them."""


@dataclass
class Window:
    mode: str  # "full" or "annotate"
    call: int
    start: int
    steps: int
    recorded_steps: list[int] = field(default_factory=list)
    trace_file: str | None = None
    trigger: str | None = None  # what opened it: "generate step", "optimizer.step", ..., "time" (TRIGGERS)
    after_s: float | None = None  # the time-based window falls due this long after recording started...
    seconds: float | None = None  # ...and lasts this long, when no iterative trigger came first
    iterations: dict[str, int] = field(default_factory=dict)  # iteration boundaries seen, per trigger
    stood_aside: str | None = None  # why dstrace gave way to the job's own torch.profiler, and where


@dataclass
class Manifest:
    schema: str
    run_id: str
    status: str  # running | complete | failed | interrupted | terminated
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    started: float
    ended: float | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    gpu: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    deepspeed_calls: list[DeepSpeedCall] = field(default_factory=list)
    hf_deepspeed_config: Any = None
    tp_requested: list[TPRequest] = field(default_factory=list)
    inventory: Inventory | None = None
    calls: list[GenerationCall] = field(default_factory=list)
    window: Window | None = None
    zero3: dict[str, int] = field(default_factory=dict)  # fetches, releases, allgathers, gathered_bytes
    peak_gpu_memory_bytes: int | None = None
    peak_host_rss_bytes: int | None = None
    hook_errors: list[str] = field(default_factory=list)
    exit_error: dict | None = None
    lost: list[str] = field(default_factory=list)  # files this rank recorded but could not write, and why
    config_overrides: dict[str, Any] = field(default_factory=dict)  # `dstrace try --set` paths the job was given
    hf_deepspeed_config_overrides: dict | None = None  # what the overrides did to HfDeepSpeedConfig's config
    device_memory_bytes: int | None = None  # the memory one rank's model lives in (its GPU's, else the host's)
    device_memory_kind: str | None = None  # "gpu" or "host" (then shared by the ranks on the host)


def why_no_trace(m: Manifest) -> str | None:
    """Why this rank left no trace, in the user's terms; None when it has one or should have had one.

    Said from what the rank recorded: the mode, and its calls and their forward steps against the window.
    """
    w = m.window
    if w is None or w.trace_file:
        return None
    if w.mode == "annotate":
        return "annotate mode records ranges and timings, no trace (use --mode full for one)"
    if m.status == "running":
        return ("the rank had not ended when its manifest was last written: it is still running, or it was "
                "killed before it could write its files")
    if w.stood_aside:
        return f"dstrace stood aside: {w.stood_aside}"
    if w.trigger is not None:  # the window opened: its trace was lost (`lost` says why) or never written
        return "the window opened but its trace was not written" + ("" if m.lost else " (the rank ended first)")
    wanted = f"the window (call {w.call}, steps {w.start}-{w.start + w.steps - 1}) was never reached"
    if not m.calls and w.after_s is None and w.mode == "full" and not w.iterations:
        return f"{wanted}: no chat()/generate() call ran"  # recorded by a dstrace that followed generate() only
    if not m.calls:
        if w.iterations:
            kind, seen = next(iter(w.iterations.items()))
            return (f"the window (iterations {w.start}-{w.start + w.steps - 1} of {kind}) was never reached: "
                    f"{seen} {kind} ran (choose --window-start 0..{max(seen - 2, 0)})")
        return (f"no chat()/generate() call, optimizer step, engine.step(), DDP/FSDP forward or profiler step ran and "
                f"the rank ended before the time-based window ({w.after_s:g} s after recording started)")
    if w.call > len(m.calls):
        return f"{wanted}: {len(m.calls)} call(s) ran; choose one with --window-call 1..{len(m.calls)}"
    steps = len(m.calls[w.call - 1].step_ms)
    if steps <= w.start:
        return (f"{wanted}: call {w.call} has {steps} forward step(s); the window starts at step {w.start} "
                f"(choose --window-start 0..{max(steps - 1, 0)})")
    return None


def error_line(error: dict | None, limit: int = 200) -> str:
    """An exception as one line: `Type: first lines of the message`, without pydantic's help links."""
    if not error:
        return ""
    lines = [x.strip() for x in str(error.get("message", "")).splitlines()
             if x.strip() and not x.strip().startswith("For further information")]
    text = f"{error.get('type', 'error')}: " + " / ".join(lines)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class RankStatus:
    rank: int
    status: str
    manifest: str | None
    traces: list[str]


@dataclass
class RunRecord:
    schema: str
    run_id: str
    command: list[str]
    cwd: str
    started: float
    status: str  # running | complete | incomplete
    ended: float | None = None
    exit_code: int | None = None
    world_size: int | None = None
    ranks: list[RankStatus] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what is worth knowing but loses nothing, e.g. no window


def write_json_atomic(path: str, payload: Any) -> None:
    """Readers never see half a file, and no link is followed (`atomic.write_text_atomic`)."""
    write_text_atomic(path, json.dumps(payload, indent=1, default=str))


def to_json(obj: Any) -> Any:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def read_json_object(path: str) -> dict:
    """A small JSON object from a run folder; ValueError for anything else (too large, not an object)."""
    try:
        data = json.loads(read_bytes(path, MAX_RECORD_BYTES))
    except RecursionError:
        raise ValueError(f"{path}: corrupt JSON (nested too deeply for a dstrace record)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def _read_record(path: str, cls, schema: str, what: str, data: dict | None = None):
    """The record's schema is its dataclasses: msgspec checks every field's type against them (in dstrace's
    environment only: the recording side, in the job, writes and never reads). `data`: the file's JSON when
    the caller has read it already."""
    import msgspec

    data = read_json_object(path) if data is None else data
    if data.get("schema") != schema:
        raise ValueError(f"{path} is not a dstrace {what} (schema {data.get('schema')!r})")
    try:
        record = msgspec.convert(data, type=cls)
    except msgspec.ValidationError as e:
        raise ValueError(f"{path}: {e}") from None
    problem = _out_of_range(record)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return record


def _out_of_range(record) -> str | None:
    """What the types allow but no run can hold: ranks and world sizes outside 0 <= rank < world <= MAX_WORLD."""
    worlds = [record.world_size] if record.world_size is not None else []
    if isinstance(record, Manifest):
        ranks = [record.rank, record.local_rank]
    else:
        ranks = [r.rank for r in record.ranks] + record.missing_ranks
    for world in worlds:
        if not 1 <= world <= MAX_WORLD:
            return f"world_size {world} is outside 1..{MAX_WORLD}"
    for rank in ranks:
        if not 0 <= rank < (worlds[0] if worlds else MAX_WORLD):
            return f"rank {rank} is outside 0..{(worlds[0] if worlds else MAX_WORLD) - 1}"
    return None


def read_manifest(path: str) -> Manifest:
    return _read_record(path, Manifest, MANIFEST_SCHEMA, "manifest")


def read_run(path: str) -> RunRecord:
    return _read_record(path, RunRecord, RUN_SCHEMA, "run record")


def read_node_record(path: str) -> dict:
    """A node record (`nodes/<node>.json`): a run record of one node's ranks, with `node`, `nnodes`, `host`."""
    data = read_json_object(path)
    _read_record(path, RunRecord, RUN_SCHEMA, "node record", data)
    for key, kind in (("nnodes", int), ("node", str), ("host", str)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise ValueError(f"{path}: {key} is {type(data[key]).__name__}, not {kind.__name__}")
    return data
