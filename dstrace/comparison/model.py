"""Typed results of a comparison: what `verdict` and the renderers read, and nothing else."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COMPARE_SCHEMA = "dstrace.compare/1"


@dataclass(frozen=True)
class RunRef:
    """One recorded run folder and the configuration and repeat it belongs to."""
    config: str
    repeat: str
    path: str


@dataclass
class Spread:
    """A per-run value over a configuration's repeats: the median of the runs and their range."""
    median: float
    low: float
    high: float
    runs: int


@dataclass
class RunFacts:
    """What one run says: its outcome, its speed and the structure that explains it."""
    config: str
    repeat: str
    path: str
    status: str  # complete | refused | failed (the command failed) | incomplete (exited 0, its record incomplete)
    reason: str | None = None  # the refusal or failure, one line
    world_size: int | None = None
    ms_per_step: float | None = None  # `analysis.steps.step_time`: median decode step, prefill and profiled steps left out
    ms_per_step_covers: str | None = None  # which steps ms_per_step is the median of, in words
    decode_steps: int = 0  # step samples behind ms_per_step (all ranks, all calls)
    sequences: int | None = None  # sequences generated at once: ranks / effective TP
    gathered_bytes_per_step: float | None = None  # ZeRO-3 all-gather per decode step per rank (median)
    model_bytes: int | None = None  # logical size of the model, as the inventory measured it
    effective_tp: int | None = None
    held_fraction: float | None = None  # weight elements a rank holds over the model's, median over ranks
    weight_shapes: dict[str, list[int]] = field(default_factory=dict)  # rank 0's weights as it sees them
    split_modules: list[str] = field(default_factory=list)  # module classes of weights split by TP
    deepspeed_version: str | None = None
    tp_requested: list[str] = field(default_factory=list)  # "key=value (source)"
    comm_share: float | None = None  # collective kernel time (wait included) over the traced span, median over ranks
    transfer_share: float | None = None  # collective time after every peer arrived over the span, median over ranks
    wait_share: float | None = None  # collective time spent waiting for the last peer over the span, median over ranks
    exposed_shares: dict[str, float] = field(default_factory=dict)  # the span's exclusive parts, median over ranks
    collectives_per_step: dict[str, float] = field(default_factory=dict)  # kind -> calls per traced step
    findings: list[str] = field(default_factory=list)  # analysis finding ids
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what this run cannot tell (e.g. no manifests)


@dataclass
class ConfigSummary:
    """One configuration over its repeats."""
    name: str
    runs: list[RunFacts]
    status: str  # complete | partial | refused | failed | incomplete
    reason: str | None
    ms_per_step: Spread | None
    tokens_per_s: Spread | None  # per sequence: 1000 / ms per step
    aggregate_tokens_per_s: Spread | None  # all sequences generated at once
    sequences: int | None
    gathered_bytes_per_step: float | None
    model_bytes: int | None
    effective_tp: int | None
    held_fraction: float | None
    comm_share: float | None
    collectives_per_step: dict[str, float]
    deepspeed_versions: list[str]
    tp_requested: list[str]
    findings: list[str]
    weight_shapes: dict[str, list[int]] = field(default_factory=dict)
    split_modules: list[str] = field(default_factory=list)
    transfer_share: float | None = None  # collective time after every peer arrived over the span (median of runs)
    wait_share: float | None = None  # collective time waiting for the last peer over the span (median of runs)
    ms_per_step_covers: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Explanation:
    """One reason the evidence shows, with the numbers it rests on."""
    id: str
    configs: list[str]
    summary: str
    evidence: dict[str, Any]
    remedy: str = ""  # what to do, with what this comparison measured for the alternatives


@dataclass
class Verdict:
    rule: str
    baseline: str | None
    indistinguishable: list[list[str]]  # pairs of configurations
    ratios: dict[str, dict[str, float | None]]  # config -> ms_per_step / tokens_per_s against the baseline
    explanations: list[Explanation]


@dataclass
class Comparison:
    configs: list[ConfigSummary]
    verdict: Verdict
    warnings: list[str] = field(default_factory=list)
    schema: str = COMPARE_SCHEMA
