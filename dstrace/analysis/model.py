"""Typed results of the analysis: what the renderers read, and nothing else.

Per-event data stays in pandas DataFrames (one row per trace event); these dataclasses hold what
the analyses conclude from them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from dstrace.runfolder.records import Manifest, RunRecord
from dstrace.trace_names import ACCELERATOR_CATEGORIES

if TYPE_CHECKING:
    from dstrace.analysis.reduction import RankReduction


@dataclass
class RankTrace:
    """One rank's parsed trace: its reduction (what the analysis reads), its events when asked for (the
    timeline), and what its metadata says."""
    rank: int
    path: str
    reduced: RankReduction
    events: pd.DataFrame | None = None  # loaded only by `load_run(..., events=True)`
    world_size: int | None = None
    host: str | None = None
    run_id: str | None = None
    distributed: dict | None = None  # the trace's distributedInfo, when torch.distributed was up
    dstrace: dict | None = None  # the trace's "dstrace" metadata written by `dstrace record`
    trace_absent: bool = False  # its trace is not in the folder: the rank is its kept reduction (`kept`)

    @property
    def has_gpu(self) -> bool:
        return self.reduced.has_gpu


@dataclass
class LoadedRun:
    """Everything read from a run folder, validated: one reduced trace (or kept reduction) per rank, manifests
    when present."""
    trace_dir: str
    traces: dict[int, RankTrace]
    world_size: int
    run_id: str | None = None
    manifests: dict[int, Manifest] = field(default_factory=dict)
    run_record: RunRecord | None = None
    warnings: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"path", "reason"}

    @property
    def ranks(self) -> list[int]:
        """The ranks whose files were found: traces, or the manifests when no rank left a trace."""
        return sorted(self.traces or self.manifests)

    @property
    def missing_ranks(self) -> list[int]:
        found = set(self.ranks)
        return [r for r in range(self.world_size) if r not in found]

    @property
    def device(self) -> str:
        """"gpu" when any rank has GPU kernels; "host-only" when none has, but a trace holds the activity of an
        accelerator dstrace does not read (MTIA, HPU), or the host side of a GPU job whose GPU activity is not in
        the traces (`gpu_job_untraced`): its host side is all that is analyzed; "cpu" when
        there are only CPU events (the analysis then reads CPU-side collectives); "none" when no trace was
        recorded (manifests only)."""
        if not self.traces:
            return "none"
        if any(t.has_gpu for t in self.traces.values()):
            return "gpu"
        return "host-only" if self.accelerators or self.gpu_job_untraced else "cpu"

    @property
    def gpu_job_untraced(self) -> bool:
        """Whether a rank without GPU activity shows a GPU job on its host: CUDA runtime calls, CUPTI profiler
        ranges or c10d's nccl:* ranges (a GPU job profiled without its GPU activity, not a CPU-only one)."""
        return any(not t.has_gpu and (t.reduced.gpu_host_events or t.reduced.nccl_host_calls)
                   for t in self.traces.values())

    @property
    def accelerators(self) -> dict[str, dict]:
        """Accelerators whose device timeline dstrace does not read, by name (trace_names.ACCELERATOR_CATEGORIES):
        the ranks whose traces hold their events, and the events per category over those ranks."""
        out: dict[str, dict] = {}
        for rank, t in sorted(self.traces.items()):
            for cat, n in (t.reduced.accelerator_events or {}).items():
                entry = out.setdefault(ACCELERATOR_CATEGORIES.get(cat, cat), {"ranks": [], "events": {}})
                if rank not in entry["ranks"]:
                    entry["ranks"].append(rank)
                entry["events"][cat] = entry["events"].get(cat, 0) + int(n)
        return out


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
class RankSummary:
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
    hta: dict[str, Any] = field(default_factory=dict)
    host_time: dict[str, Any] = field(default_factory=dict)
    sparse: str | None = None  # why the span is too bare to split into shares (`pipeline.sparse_span`), else None


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
    ranks: dict[int, RankSummary]
    steps: StepSummary | None
    findings: list[Finding]
    clock: dict[int, ClockOffset]
    waits_over_time: pd.DataFrame  # one row per matched collective per rank: rank, kind, ts_ms, wait_us
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    accelerators: dict[str, dict] = field(default_factory=dict)  # LoadedRun.accelerators
    step_series: list[StepSeries] = field(default_factory=list)  # `pipeline.step_series`
