"""What every finding may read (`FindingInputs`), built once per analysis, and what the findings share:
the mechanisms the run's evidence shows, and the reading of the untrusted host-time maps."""
from __future__ import annotations

import json
from dataclasses import dataclass

from dstrace.analysis.loaded import LoadedRun
from dstrace.analysis.results import Finding, RankReport, StepSummary


@dataclass(frozen=True)
class Mechanisms:
    """What the run's evidence shows of the mechanisms a remedy names: a remedy is given only where its
    mechanism is in the manifests or the traces, never from the case dstrace was first built on."""
    zero3: bool  # ZeRO-3: partitioned weights or stage 3 in a manifest, or ZeRO-3's ranges in a trace
    decoding: bool  # generate()/chat() steps: dstrace's step ranges, or calls in the manifests
    gpu: bool  # collectives are GPU kernels (NCCL/RCCL), not gloo's CPU ops


@dataclass(frozen=True)
class FindingInputs:
    """The one argument of every finding's check: `check(inputs) -> Finding | None`."""
    run: LoadedRun
    ranks: dict[int, RankReport]  # the ranks whose span supports shares: a span too bare to split supports no finding
    steps: StepSummary | None
    device: str  # `LoadedRun.device`: "gpu", "cpu", "host-only" or "none"
    mechanisms: Mechanisms

    @classmethod
    def of(cls, run: LoadedRun, ranks: dict[int, RankReport], steps: StepSummary | None) -> FindingInputs:
        ranks = {r: s for r, s in ranks.items() if not s.sparse}
        return cls(run, ranks, steps, run.device, mechanisms(run, ranks, steps))


def finding(docs: dict[str, str], id_: str, ranks: list[int], summary: str, evidence: dict, cause: str,
            remedy: str) -> Finding:
    """A finding, pointing to where `docs` (its module's DOCS) says it is explained."""
    return Finding(id_, ranks, summary, evidence, cause=cause, remedy=remedy, docs=docs[id_])


def as_int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def items(host_time: dict, key: str) -> dict[str, float]:
    """One of `host.host_during_idle`'s name -> us maps, numbers only (a kept reduction is untrusted)."""
    found = host_time.get(key)
    return {str(k): float(v) for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)} \
        if isinstance(found, dict) else {}


def _zero_stage(config) -> int | None:
    """`zero_optimization.stage` of a DeepSpeed config as passed (a dict, or a file's {"path", "content"})."""
    if isinstance(config, dict) and "content" in config:
        config = config["content"]
        if isinstance(config, str):
            try:
                config = json.loads(config)
            except ValueError:
                return None
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    return as_int(zero.get("stage")) if isinstance(zero, dict) else None


def mechanisms(run: LoadedRun, ranks: dict[int, RankReport], steps: StepSummary | None) -> Mechanisms:
    manifests = run.manifests.values()
    zero3 = (any(m.inventory is not None and m.inventory.zero3_partitioned for m in manifests)
             or any(_zero_stage(c.config) == 3 for m in manifests for c in m.deepspeed_calls)
             or any(len(t.reduced.gathers) for t in run.traces.values())
             or any(k.startswith("zero3.") for s in ranks.values() for k in items(s.host_time, "in_dstrace_ranges")))
    decoding = bool(steps is not None and steps.decode and steps.count) or any(m.calls for m in manifests)
    return Mechanisms(zero3=zero3, decoding=decoding, gpu=run.device == "gpu")

