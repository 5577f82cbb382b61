"""Typed results of the analysis: what the renderers and the comparison read, and nothing else.

Per-event data stays in pandas DataFrames (one row per trace event); these dataclasses hold what
the analyses conclude from them, and `span_parts`/`shares` split a rank's span the one way every
report and comparison shows it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd


@dataclass
class HtaTemporal:
    """HTA's temporal breakdown of one rank's GPU time (its clock, its kernel span)."""
    idle_us: float
    compute_us: float
    non_compute_us: float
    span_us: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    communication_in_compute_us: dict[str, float] = field(default_factory=dict)  # `communication_in_compute`


@dataclass
class HtaKernel:
    """One of HTA's top kernels; `communication_library` names the library whose communication kernel HTA
    typed as something else (a DeepEP dispatch as COMPUTATION)."""
    name: str
    kernel_type: str
    total_us: float
    communication_library: str | None = None


@dataclass
class HtaBreakdown:
    """One rank's HTA breakdowns. A breakdown left out (HTA failed on it, or gave no rows) is None, with the
    problem met in `problems`; `comm_comp_overlap_pct` is NaN where HTA gives a breakdown but no number."""
    temporal: HtaTemporal | None = None
    kernel_types_us: dict[str, float] | None = None
    top_kernels: list[HtaKernel] | None = None
    comm_comp_overlap_pct: float | None = None
    idle_causes_us: dict[str, float] | None = None
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """The breakdowns given, as the report's JSON holds them (`docs/analysis-schema.md`: `hta`)."""
        out: dict = {}
        if self.temporal is not None:
            t = {k: v for k, v in vars(self.temporal).items() if k != "communication_in_compute_us"}
            out["temporal"] = {**t, **({"communication_in_compute_us": self.temporal.communication_in_compute_us}
                                       if self.temporal.communication_in_compute_us else {})}
        if self.kernel_types_us is not None:
            out["kernel_types_us"] = self.kernel_types_us
        if self.top_kernels is not None:
            out["top_kernels"] = [{k: v for k, v in vars(kernel).items() if k != "communication_library"
                                   or v is not None} for kernel in self.top_kernels]
        if self.comm_comp_overlap_pct is not None:
            value = self.comm_comp_overlap_pct
            out["comm_comp_overlap_pct"] = value if value == value else None
        if self.idle_causes_us is not None:
            out["idle_causes_us"] = self.idle_causes_us
        return out

    def stored(self) -> dict:
        """The form the reduction's files keep (cache, rank summaries): `to_json` and the problems."""
        return {"breakdowns": self.to_json(), "problems": list(self.problems)}

    @classmethod
    def from_stored(cls, stored) -> HtaBreakdown:
        """What `stored` gave, checked (the file is untrusted): TypeError when it is not what dstrace writes."""
        if not isinstance(stored, dict) or not isinstance(stored.get("breakdowns"), dict) \
                or not isinstance(stored.get("problems"), list) or not all(isinstance(p, str) for p in stored["problems"]):
            raise TypeError("HTA results that are not what dstrace writes")
        b = stored["breakdowns"]
        temporal = b.get("temporal")
        if temporal is not None:
            if not isinstance(temporal, dict):
                raise TypeError("HTA's temporal breakdown is not an object")
            temporal = HtaTemporal(**{k: _number(temporal.get(k)) for k in _TEMPORAL},
                                   communication_in_compute_us=_numbers(temporal.get("communication_in_compute_us", {})))
        kernels = b.get("top_kernels")
        if kernels is not None:
            if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
                raise TypeError("HTA's top kernels are not a list of objects")
            kernels = [HtaKernel(_text(k.get("name")), _text(k.get("kernel_type")), _number(k.get("total_us")),
                                 None if k.get("communication_library") is None else _text(k["communication_library"]))
                       for k in kernels]
        overlap = b.get("comm_comp_overlap_pct")
        if "comm_comp_overlap_pct" in b:
            overlap = float("nan") if overlap is None else _number(overlap)
        return cls(temporal=temporal, kernel_types_us=_numbers(b["kernel_types_us"]) if "kernel_types_us" in b else None,
                   top_kernels=kernels, comm_comp_overlap_pct=overlap,
                   idle_causes_us=_numbers(b["idle_causes_us"]) if "idle_causes_us" in b else None,
                   problems=list(stored["problems"]))


_TEMPORAL = ("idle_us", "compute_us", "non_compute_us", "span_us", "idle_pct", "compute_pct", "non_compute_pct")


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"HTA result {str(value)[:40]} is not a number")
    return value


def _text(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"HTA result {str(value)[:40]} is not text")
    return value


def _numbers(value) -> dict[str, float]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TypeError("HTA results that are not an object of numbers")
    return {k: _number(v) for k, v in value.items()}


@dataclass
class CollectiveStats:
    """One collective kind on one rank. Bandwidths follow nccl-tests (bytes / time, GB = 1e9 B)."""
    count: int
    bytes: int
    kernel_us: float
    wait_us: float
    transfer_us: float
    algbw_GBps: float
    busbw_GBps: float
    busbw_transfer_GBps: float | None  # bus bandwidth over transfer time only, peer wait excluded; None when
    # the split is withheld for every call of the kind
    group_size: int
    unsplit_us: float = 0.0  # time of calls whose wait/transfer split is withheld (`peer_wait.withhold`)


@dataclass
class ClockOffset:
    """A rank's clock relative to the reference rank, estimated from the ends of matched collectives."""
    offset_us: float  # subtract from this rank's timestamps to put them on the reference clock
    applied: bool
    residual_us: float | None  # median |end difference| to the reference after correction
    matched: int  # collectives shared with the rank the offset was estimated against
    via: int | None = None  # the rank it was estimated against (the reference, or a rank chained to it)
    call_median_us: float | None = None  # median duration of the calls the residual was measured on


@dataclass
class RankReport:
    rank: int
    file: str
    host: str | None
    span_us: float
    idle_us: float
    busy_us: dict[str, float]
    exposed_comm_us: float  # communication time not overlapped by compute
    collectives: dict[str, CollectiveStats]
    comm_us: float
    wait_us: float
    waited_for: dict[int, float]  # peer rank -> wait spent on it arriving last
    late_count: int  # matched collectives this rank arrived last to
    caused_wait_us: float  # peers' wait on collectives this rank arrived last to
    unsplit_us: float = 0.0  # collective time whose wait/transfer split is withheld (in comm_us, not in wait_us)
    devices: dict[str, dict[str, float]] = field(default_factory=dict)
    comm_libraries_us: dict[str, float] = field(default_factory=dict)  # communication time per library (GPU)
    hta: HtaBreakdown = field(default_factory=HtaBreakdown)  # none of HTA's breakdowns: a rank without GPU work
    host_time: dict[str, Any] = field(default_factory=dict)
    sparse: str | None = None  # why the span is too bare to split into shares (`pipeline.sparse_span`), else None
    read_from: str = "trace"  # or "kept reduction": the trace at `file` is not in the folder (`RankTrace.trace_absent`)


@dataclass
class StepSummary:
    count: int
    ms_median: float
    source: str
    per_rank: dict[int, dict[str, float]] = field(default_factory=dict)
    manifest_ms_median: float | None = None
    gathered_bytes_median: float | None = None
    gathered_source: str | None = None
    model_bytes: int | None = None
    ms_per_step: float | None = None  # `steps.step_time`: the one ms per decode step of the run
    ms_per_step_covers: str | None = None  # which steps that is, in words
    ms_per_step_samples: int = 0
    ms_per_step_per_rank: int = 0  # ...of which this many steps per rank (a step all ranks ran counts once)...
    ms_per_step_ranks: int = 0  # ...on this many ranks
    profiler_cost: dict | None = None  # `shift.profiler_cost`: profiled vs unprofiled steps of one level
    decode: bool = True  # the steps are generate() forwards dstrace saw (its step ranges or manifests), not
    # ProfilerStep iterations of any workload


@dataclass
class StepSeries:
    """One call's step times on one rank, as its manifest recorded them (step 0 is the prefill), for the
    HTML report's plot; `kinds` holds a kind per step when the manifest gives one."""
    rank: int
    call: int
    step_ms: list[float]
    profiled: list[int] = field(default_factory=list)  # the steps the profiler window recorded
    kinds: list[str] = field(default_factory=list)


@dataclass
class Finding:
    id: str
    ranks: list[int]
    summary: str
    evidence: dict[str, Any]
    cause: str = ""  # why it happened, from what the run recorded (versions, config as passed, measurements)
    remedy: str = ""  # what to do about it
    docs: str = ""  # where the finding is explained at length (a path in the dstrace repository)
    config_change: dict[str, Any] | None = None  # the remedy as DeepSpeed config paths, for `dstrace try --suggested`


@dataclass
class Analysis:
    """The whole diagnosis of one run folder."""
    trace_dir: str
    run_id: str | None
    device: str
    world_size: int
    ranks_found: list[int]
    missing_ranks: list[int]
    ranks: dict[int, RankReport]
    steps: StepSummary | None
    findings: list[Finding]
    clock: dict[int, ClockOffset]
    waits_over_time: pd.DataFrame  # one row per matched collective per rank: rank, kind, ts_ms, wait_us
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    accelerators: dict[str, dict] = field(default_factory=dict)  # LoadedRun.accelerators
    step_series: list[StepSeries] = field(default_factory=list)  # `pipeline.step_series`


SPAN_PARTS = ("compute", "transfer", "wait for peers", "split withheld", "other busy", "idle")
"""The parts of a rank's span, exclusive, in the order the tables and bars show them."""


def span_parts(s: RankReport) -> dict[str, float]:
    """A rank's span split into SPAN_PARTS (us): the exposed collective time splits into wait (first) and
    transfer, so that waiting never reads as communicating; the parts sum to the span."""
    exposed = max(s.exposed_comm_us, 0.0)
    wait = min(s.wait_us, exposed)
    withheld = min(s.unsplit_us, exposed - wait)
    compute = s.busy_us.get("compute", 0.0)
    other = max(s.span_us - s.idle_us - compute - exposed, 0.0)
    return {"compute": compute, "transfer": exposed - wait - withheld, "wait for peers": wait,
            "split withheld": withheld, "other busy": other, "idle": max(s.span_us - compute - exposed - other, 0.0)}


def shares(parts: dict[str, float]) -> dict[str, int]:
    """Whole percentages that add up to exactly 100 (largest remainder), so a table's shares do."""
    total = sum(parts.values())
    if total <= 0:
        return {k: 0 for k in parts}
    exact = {k: 100 * v / total for k, v in parts.items()}
    out = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - out[k], reverse=True)[: 100 - sum(out.values())]:
        out[k] += 1
    return out
