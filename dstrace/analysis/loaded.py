"""A run folder as read: one reduced trace per rank (`RankTrace`) and what the folder says of the run
(`LoadedRun`). What `loading` gives and the analysis of a run (`pipeline`) reads; its results are `results`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
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
    calls: pd.DataFrame = field(init=False, repr=False, compare=False)  # `run_calls`

    def __post_init__(self) -> None:
        self.calls = run_calls(self.traces, self.device == "gpu")

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


def run_calls(traces: dict[int, RankTrace], gpu: bool) -> pd.DataFrame:
    """The collectives of the ranks the analysis reads (in a GPU run those with GPU kernels) as one frame in rank
    order, with a `rank` column; each of these ranks' `reduced.collectives` becomes a view of its rows. So the
    run's calls are in memory once: the frame its ranks were read into (`kept.load_many`) is let go, rather
    than held beside a copy of every call (0.4 GB each at 10,000 ranks)."""
    kept = [(rank, t.reduced) for rank, t in sorted(traces.items()) if len(t.reduced.collectives) and t.has_gpu == gpu]
    if not kept:
        return pd.DataFrame()
    calls = pd.concat([r.collectives for _, r in kept], ignore_index=True)
    rows = [len(r.collectives) for _, r in kept]
    starts = np.cumsum([0] + rows)
    for (_, reduced), a, b in zip(kept, starts[:-1], starts[1:]):
        part = calls.iloc[a:b]
        part.index = pd.RangeIndex(b - a)
        reduced.collectives = part
    calls["rank"] = np.repeat([rank for rank, _ in kept], rows)
    return calls
