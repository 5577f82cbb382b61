"""One recorded run as the numbers a comparison needs: pure functions over its manifests, run record
and analysis. Nothing here reads files."""
from __future__ import annotations

import statistics

from dstrace.analysis.results import Analysis, span_parts
from dstrace.comparison.model import RunFacts, RunRef
from dstrace.analysis.steps import step_time
from dstrace.comparison.stats import decode_gathered_bytes, median
from dstrace.runfolder.records import Inventory, Manifest, RunRecord, error_line


NOT_RECORDED = "no run.json and no manifest: not a recorded run"
NO_MANIFEST = "no rank wrote a manifest"


def outcome(manifests: dict[int, Manifest], record: RunRecord | None) -> tuple[str, str | None]:
    """complete, refused (a DeepSpeed entry point raised: the config was not accepted) or failed."""
    for _, m in sorted(manifests.items()):
        for call in m.deepspeed_calls:
            if call.error:
                return "refused", f"{call.api}: {error_line(call.error)}"
    for _, m in sorted(manifests.items()):
        if m.exit_error:
            return "failed", f"rank {m.rank}: {error_line(m.exit_error)}"
    if record is None and not manifests:
        return "failed", NOT_RECORDED
    if record is not None and record.exit_code not in (None, 0):
        return "failed", "; ".join(record.problems) or f"the command exited with code {record.exit_code}"
    if record is not None and record.status != "complete":
        return "incomplete", "; ".join(record.problems) or f"run status {record.status}"
    if not manifests:
        return "failed", NO_MANIFEST
    return "complete", None


def used_deepspeed(manifests: dict[int, Manifest]) -> bool:
    """A DeepSpeed entry point was called, HF's DeepSpeed config was set, or weights are ZeRO-3 partitions: the
    manifests' DeepSpeed version is then the job's, not merely what the environment has installed."""
    return any(m.deepspeed_calls or m.hf_deepspeed_config is not None or m.zero3
               or (m.inventory is not None and m.inventory.zero3_partitioned) for m in manifests.values())


def held_fraction(inv: Inventory) -> float | None:
    """Elements this rank holds over the unsplit model's: ZeRO-3 1/world, AutoTP about 1/tp, both 1/(world x tp)."""
    full = 0.0
    for w in inv.weights:
        numel = 1
        for d in w.shape:
            numel *= int(d)
        # a DTensor's shape is already the global one (`Weight.placements`); an AutoTP layer's is its split part
        full += numel * (1.0 if w.placements else (w.split or 1.0))
    return inv.local_numel / full if full else None


def tp_requests(manifests: dict[int, Manifest]) -> list[str]:
    """Every TP size asked for, once per key and value, with the places that asked."""
    sources: dict[str, list[str]] = {}
    for _, m in sorted(manifests.items()):
        for t in m.tp_requested:
            where = sources.setdefault(f"{t.key}={t.value}", [])
            if t.source not in where:
                where.append(t.source)
    return [f"{k} ({', '.join(v)})" for k, v in sources.items()]


def _share(analysis: Analysis, part) -> float | None:
    """Median over ranks of part(rank summary) / span."""
    shares = [part(s) / s.span_us for s in analysis.ranks.values() if s.span_us > 0]
    return float(statistics.median(shares)) if shares else None


def _comm_share(analysis: Analysis) -> float | None:
    return _share(analysis, lambda s: s.busy_us.get("communication", 0.0))


WITHOUT_MANIFESTS = ("no dstrace manifests: ms per step covers only the profiled steps (profiler overhead "
                     "included); effective TP, weight shapes, model size, DeepSpeed version, the TP sizes "
                     "requested and whole-call step times are unknown")


def _from_traces(facts: RunFacts, analysis: Analysis) -> RunFacts:
    """What plain torch.profiler traces show: steps, collective bytes per step, transfer and wait."""
    if facts.reason in (NOT_RECORDED, NO_MANIFEST):  # plain torch.profiler traces: complete as traces
        facts.status, facts.reason = "complete", None
    facts.world_size = analysis.world_size
    if analysis.steps is not None:
        facts.ms_per_step = analysis.steps.ms_per_step
        facts.ms_per_step_covers = analysis.steps.ms_per_step_covers
        facts.decode_steps = analysis.steps.ms_per_step_samples
        facts.gathered_bytes_per_step = analysis.steps.gathered_bytes_median
    facts.notes.append(WITHOUT_MANIFESTS)
    return facts


def _collectives_per_step(analysis: Analysis) -> dict[str, float]:
    """Calls of each collective kind per traced decode step, median over ranks."""
    per_kind: dict[str, list[float]] = {}
    for r, s in analysis.ranks.items():
        steps = (analysis.steps.per_rank.get(r, {}).get("count") if analysis.steps else None) or 0
        if not steps:
            continue
        for kind, c in s.collectives.items():
            per_kind.setdefault(kind, []).append(c.count / steps)
    return {k: float(statistics.median(v)) for k, v in sorted(per_kind.items())}


def _exposed_shares(analysis: Analysis) -> dict[str, float]:
    """The span's exclusive parts (compute, transfer, wait for peers, other busy, idle), median over ranks."""
    per_part: dict[str, list[float]] = {}
    for s in analysis.ranks.values():
        if s.span_us > 0:
            for k, v in span_parts(s).items():
                per_part.setdefault(k, []).append(v / s.span_us)
    return {k: float(statistics.median(v)) for k, v in per_part.items()}


def run_facts(ref: RunRef, manifests: dict[int, Manifest], record: RunRecord | None,
              analysis: Analysis | None, warnings: list[str] | None = None) -> RunFacts:
    status, reason = outcome(manifests, record)
    facts = RunFacts(config=ref.config, repeat=ref.repeat, path=ref.path, status=status, reason=reason,
                     warnings=list(warnings or []))
    if analysis is not None:
        facts.comm_share = _comm_share(analysis)
        facts.transfer_share = _share(analysis, lambda s: s.comm_us - s.wait_us)
        facts.wait_share = _share(analysis, lambda s: s.wait_us)
        facts.exposed_shares = _exposed_shares(analysis)
        facts.collectives_per_step = _collectives_per_step(analysis)
        facts.findings = [f.id for f in analysis.findings]
    if not manifests:
        return _from_traces(facts, analysis) if analysis is not None and analysis.ranks else facts
    ranks = sorted(manifests)
    first = manifests[ranks[0]]
    facts.world_size = max(m.world_size for m in manifests.values())
    facts.deepspeed_version = first.versions.get("deepspeed") if used_deepspeed(manifests) else None
    facts.tp_requested = tp_requests(manifests)
    timing = step_time(manifests)
    if timing is not None:
        facts.ms_per_step, facts.decode_steps, facts.ms_per_step_covers = timing.ms, timing.samples, timing.covers
    elif analysis is not None and analysis.steps is not None:  # no generate() steps (training): the traced steps
        facts.ms_per_step = analysis.steps.ms_per_step
        facts.ms_per_step_covers = analysis.steps.ms_per_step_covers
        facts.decode_steps = analysis.steps.ms_per_step_samples
    facts.gathered_bytes_per_step = median(b for r in ranks for b in decode_gathered_bytes(manifests[r]))
    inventories = [manifests[r].inventory for r in ranks if manifests[r].inventory is not None]
    if inventories:
        inv = inventories[0]
        facts.effective_tp = inv.effective_tp
        facts.model_bytes = max(i.logical_bytes for i in inventories)
        facts.held_fraction = median(f for f in map(held_fraction, inventories) if f is not None)
        facts.weight_shapes = {w.name: list(w.shape) for w in inv.weights}
        facts.split_modules = sorted({w.module_class for w in inv.weights if (w.split or 1.0) > 1.0})
        if facts.world_size and facts.effective_tp and facts.world_size % facts.effective_tp == 0:
            facts.sequences = facts.world_size // facts.effective_tp
    return facts
