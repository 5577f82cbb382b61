"""A configuration over its repeats: the spread of its speed and the structure its runs agree on."""
from __future__ import annotations

from collections import Counter

from dstrace.comparison.model import ConfigSummary, RunFacts
from dstrace.comparison.stats import median, spread


def _status(runs: list[RunFacts]) -> str:
    kinds = Counter(r.status for r in runs)
    if kinds["complete"] == len(runs):
        return "complete"
    if kinds["complete"]:
        return "partial"
    if kinds["refused"] == len(runs):
        return "refused"
    return "incomplete" if kinds["incomplete"] == len(runs) else "failed"


def _common(values):
    """The value most runs show (the structure of one configuration does not change between repeats)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    counts = Counter(repr(v) for v in values)
    best = counts.most_common(1)[0][0]
    return next(v for v in values if repr(v) == best)


def summarize(name: str, runs: list[RunFacts]) -> ConfigSummary:
    ok = [r for r in runs if r.status == "complete"]
    ms = spread(r.ms_per_step for r in ok)
    per_seq = spread(1e3 / r.ms_per_step for r in ok if r.ms_per_step)
    aggregate = spread(r.sequences * 1e3 / r.ms_per_step for r in ok if r.ms_per_step and r.sequences)
    shown = ok or runs
    return ConfigSummary(
        name=name, runs=runs, status=_status(runs),
        reason=next((r.reason for r in runs if r.reason), None),
        ms_per_step=ms, tokens_per_s=per_seq, aggregate_tokens_per_s=aggregate,
        sequences=_common(r.sequences for r in shown),
        gathered_bytes_per_step=median(r.gathered_bytes_per_step for r in ok if r.gathered_bytes_per_step is not None),
        model_bytes=_common(r.model_bytes for r in shown),
        effective_tp=_common(r.effective_tp for r in shown),
        held_fraction=median(r.held_fraction for r in shown if r.held_fraction is not None),
        comm_share=median(r.comm_share for r in ok if r.comm_share is not None),
        collectives_per_step=_common(r.collectives_per_step or None for r in ok) or {},
        deepspeed_versions=sorted({r.deepspeed_version for r in runs if r.deepspeed_version}),
        tp_requested=_common(r.tp_requested for r in runs) or [],
        findings=sorted({f for r in runs for f in r.findings}),
        weight_shapes=_common(r.weight_shapes or None for r in shown) or {},
        split_modules=_common(r.split_modules or None for r in shown) or [],
        transfer_share=median(r.transfer_share for r in ok if r.transfer_share is not None),
        wait_share=median(r.wait_share for r in ok if r.wait_share is not None),
        ms_per_step_covers=_common(r.ms_per_step_covers for r in ok),
        notes=sorted({n for r in runs for n in r.notes}),
    )
