"""The `dstrace.analysis/1` JSON document (docs/analysis-schema.md describes every key)."""
from __future__ import annotations

import dataclasses
import functools
import json
import math

from dstrace.analysis.results import Analysis

SCHEMA = "dstrace.analysis/1"


_PLAIN = (str, int, bool, type(None))


def json_safe(value):
    """JSON-safe: NaN/inf become null, numpy scalars plain numbers, tuple keys strings (the analysis's and the
    comparison's documents)."""
    if type(value) in _PLAIN:  # most of a 10,000-rank document: no further test
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _flat(record) -> dict:
    """`dataclasses.asdict` of a dataclass of plain values (CollectiveStats, ClockOffset), without its deep copy
    of each value: tens of thousands of them at 10,000 ranks."""
    return {name: getattr(record, name) for name in _field_names(type(record))}


@functools.cache
def _field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def to_dict(a: Analysis) -> dict:
    ranks = {}
    for r, s in sorted(a.ranks.items()):
        ranks[str(r)] = {
            "file": s.file, "read_from": s.read_from, "host": s.host, "span_us": s.span_us, "idle_us": s.idle_us,
            "busy_us": s.busy_us,
            "exposed_comm_us": s.exposed_comm_us, "comm_libraries_us": dict(sorted(s.comm_libraries_us.items())),
            "collectives": {k: _flat(c) for k, c in sorted(s.collectives.items())},
            "comm_us": s.comm_us, "wait_us": s.wait_us, "unsplit_us": s.unsplit_us,
            "waited_for_us": {str(p): w for p, w in sorted(s.waited_for.items())},
            "late_count": s.late_count, "caused_wait_us": s.caused_wait_us,
            "devices": s.devices, "hta": s.hta.to_json(), "host_during_gpu_idle": s.host_time,
        }
    steps = None
    if a.steps is not None:
        steps = dataclasses.asdict(a.steps)
        steps["per_rank"] = {str(r): v for r, v in a.steps.per_rank.items()}
    return json_safe({
        "schema": SCHEMA, "trace_dir": a.trace_dir, "run_id": a.run_id, "device": a.device,
        "world_size": a.world_size, "ranks_found": a.ranks_found, "missing_ranks": a.missing_ranks,
        "ranks": ranks, "steps": steps,
        "clock_alignment": {str(r): _flat(o) for r, o in sorted(a.clock.items())},
        "findings": [dataclasses.asdict(f) for f in a.findings],
        "warnings": a.warnings, "notes": a.notes, "skipped": a.skipped, "accelerators": a.accelerators,
    })


def render_json(a: Analysis) -> str:
    return json.dumps(to_dict(a), indent=2, allow_nan=False) + "\n"
