"""Findings: conclusions a DeepSpeed user can act on, each stated only when its evidence holds.

Every finding has a stable id (documented in docs/analysis-schema.md), the ranks it concerns, a
one-line summary with the numbers, and the evidence those numbers come from. Thresholds are named
constants; each says why it has the value it has.
"""
from __future__ import annotations

import re

from dstrace.analysis.host import host_wait_share
from dstrace.analysis.model import Finding, LoadedRun, RankSummary, StepSummary

COMM_BOUND_EXPOSED_FRACTION = 0.30
"""Communication transfer not hidden behind compute above ~30% of the span is the largest single cost
worth attacking first (overlap, fewer/larger collectives, or not gathering at all); below it, compute
or idle time usually dominates. Peer wait is left out: that is `peer-wait`, a different remedy."""

PEER_WAIT_SHARE = 0.30
"""A collective kernel normally spends a few percent waiting for peers (launch skew). Above ~30% of a
rank's collective time the bandwidth it sees is mostly someone else's lateness, not the link."""

PEER_WAIT_MIN_SPAN_FRACTION = 0.05
"""Ignore waits under 5% of the rank's span: a large share of a tiny collective time changes nothing."""

HOST_BOUND_IDLE_FRACTION = 0.30
"""An inference GPU idle for over ~30% of its span loses more than kernel tuning could win back."""

HOST_BOUND_HOST_WAIT_SHARE = 0.50
"""Call it host-bound only when most of that idle time is HTA's "host wait" (the next kernel was not
launched yet), as opposed to waiting on synchronisation or on other streams."""

ZERO3_MODEL_FRACTION = 0.5
"""The model size (`inventory.logical_bytes`) counts weights a decode forward never runs (the vision
tower of NVLM/InternVL-style models) and ZeRO-3 keeps small parameters persistent, so a step that
re-gathers the whole language model shows well under 100% (73% in the tiny CPU stand-in, ~88% for a
Llama-8B on H200). Above half the model moved every step, step time scales with model size, not tokens."""

TP_ERROR = re.compile(r"tensor_parallel|tp_size|autotp|TPTraining", re.IGNORECASE)
"""DeepSpeed's refusals name the key (`tensor_parallel.tp_size`), or only the nested model and field
(`1 validation error for TPTrainingConfig / tp_size`, seen with 0.19.8)."""


def error_line(error: dict | None, limit: int = 200) -> str:
    """An exception as one line: `Type: first lines of the message`, without pydantic's help links."""
    if not error:
        return ""
    lines = [x.strip() for x in str(error.get("message", "")).splitlines()
             if x.strip() and not x.strip().startswith("For further information")]
    text = f"{error.get('type', 'error')}: " + " / ".join(lines)
    return text if len(text) <= limit else text[: limit - 3] + "..."




def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _ms(us: float) -> str:
    return f"{us / 1e3:.1f} ms"


def _exposed_transfer(s: RankSummary) -> float:
    """Exposed communication less the time spent waiting for peers, and less the time of calls whose split is
    withheld (any of it may be waiting): what is surely transfer, at most."""
    return max(s.exposed_comm_us - s.wait_us - s.unsplit_us, 0.0)


def _split_comm(s: RankSummary) -> float:
    """Collective time whose wait/transfer split was measured."""
    return max(s.comm_us - s.unsplit_us, 0.0)


def communication_bound(ranks: dict[int, RankSummary], device: str) -> Finding | None:
    hit = {r: s for r, s in ranks.items()
           if s.span_us > 0 and _exposed_transfer(s) / s.span_us >= COMM_BOUND_EXPOSED_FRACTION}
    if not hit:
        return None
    evidence = {}
    for r, s in hit.items():
        kinds = sorted(s.collectives.items(), key=lambda kv: kv[1].kernel_us, reverse=True)
        evidence[str(r)] = {
            "span_us": s.span_us, "exposed_comm_us": s.exposed_comm_us, "wait_us": s.wait_us,
            "unsplit_us": s.unsplit_us, "exposed_transfer_us": _exposed_transfer(s),
            "exposed_fraction": _exposed_transfer(s) / s.span_us, "comm_us": s.busy_us.get("communication", 0.0),
            "hta_comm_comp_overlap_pct": s.hta.get("comm_comp_overlap_pct"),
            "by_kind_us": {k: c.kernel_us for k, c in kinds},
        }
    fractions = [e["exposed_fraction"] for e in evidence.values()]
    top_kind = max(((k, c) for s in hit.values() for k, c in s.collectives.items()),
                   key=lambda kc: kc[1].kernel_us, default=(None, None))
    lo, hi = min(fractions) * 100, max(fractions) * 100
    pct = f"{lo:.0f}%" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}%"
    where = "GPU" if device == "gpu" else "host (CPU trace)"
    summary = (f"{pct} of {where} time is communication transfer not overlapped "
               "by compute (peer wait excluded)")
    if top_kind[0]:
        k, c = top_kind
        sizes = f", {_gb(c.bytes)}, {c.busbw_GBps:.1f} GB/s bus bandwidth" if c.bytes else ""
        if c.bytes and c.busbw_transfer_GBps is not None:
            sizes += f", {c.busbw_transfer_GBps:.1f} GB/s excluding peer wait"
        summary += f"; mostly {k} ({c.count} calls, {_ms(c.kernel_us)}{sizes})"
    return Finding("communication-bound", sorted(hit), summary,
                   {"threshold_exposed_fraction": COMM_BOUND_EXPOSED_FRACTION, "ranks": evidence})


def peer_wait(ranks: dict[int, RankSummary]) -> Finding | None:
    """Over the calls whose wait/transfer split holds only (`alignment.withheld`)."""
    hit = {r: s for r, s in ranks.items() if _split_comm(s) > 0 and s.span_us > 0
           and s.wait_us / _split_comm(s) >= PEER_WAIT_SHARE and s.wait_us >= PEER_WAIT_MIN_SPAN_FRACTION * s.span_us}
    if not hit:
        return None
    late = {r: {"late_count": s.late_count, "caused_wait_us": s.caused_wait_us}
            for r, s in ranks.items() if s.caused_wait_us > 0}
    worst_late = max(late, key=lambda r: late[r]["caused_wait_us"]) if late else None
    parts = []
    for r, s in sorted(hit.items()):
        peer = max(s.waited_for, key=s.waited_for.get) if s.waited_for else None
        of = "its collective time" if not s.unsplit_us else "its collective time with a measured split"
        parts.append(f"rank {r} waits {_ms(s.wait_us)} ({s.wait_us / _split_comm(s):.0%} of {of})"
                     + (f", mostly for rank {peer}" if peer is not None else ""))
    summary = "; ".join(parts)
    if worst_late is not None:
        summary += f"; rank {worst_late} arrives last to {late[worst_late]['late_count']} collectives"
    evidence = {
        "threshold_wait_share": PEER_WAIT_SHARE, "threshold_min_span_fraction": PEER_WAIT_MIN_SPAN_FRACTION,
        "waiting": {str(r): {"wait_us": s.wait_us, "comm_us": s.comm_us, "unsplit_us": s.unsplit_us,
                             "wait_share": s.wait_us / _split_comm(s),
                             "span_us": s.span_us, "waited_for_us": {str(p): w for p, w in s.waited_for.items()}}
                    for r, s in sorted(hit.items())},
        "late_ranks": {str(r): v for r, v in sorted(late.items())},
    }
    return Finding("peer-wait", sorted(hit), summary, evidence)


def host_bound(ranks: dict[int, RankSummary], device: str) -> Finding | None:
    if device != "gpu":
        return None
    hit = {}
    for r, s in ranks.items():
        share = host_wait_share(s.hta)
        if s.span_us > 0 and share is not None and s.idle_us / s.span_us >= HOST_BOUND_IDLE_FRACTION \
                and share >= HOST_BOUND_HOST_WAIT_SHARE:
            hit[r] = (s, share)
    if not hit:
        return None
    evidence = {}
    for r, (s, share) in sorted(hit.items()):
        evidence[str(r)] = {"span_us": s.span_us, "gpu_idle_us": s.idle_us, "idle_fraction": s.idle_us / s.span_us,
                            "host_wait_share_of_idle": share, "hta_idle_causes_us": s.hta.get("idle_causes_us"),
                            "host_during_gpu_idle": s.host_time}
    r0, (s0, share0) = min(hit.items())
    which = f" on rank {r0}" if len(hit) > 1 else ""
    summary = (f"GPU idle {s0.idle_us / s0.span_us:.0%} of {_ms(s0.span_us)}{which}, "
               f"{share0:.0%} of it waiting for the host to launch the next kernel")
    where = s0.host_time.get("in_dstrace_ranges") or s0.host_time.get("top_cpu_ops") or {}
    if where:
        name, us = next(iter(where.items()))
        summary += f"; the host is mostly in {name} ({_ms(us)} of GPU idle)"
    return Finding("host-bound", sorted(hit), summary,
                   {"threshold_idle_fraction": HOST_BOUND_IDLE_FRACTION,
                    "threshold_host_wait_share": HOST_BOUND_HOST_WAIT_SHARE, "ranks": evidence})


def zero3_gathers_model(steps: StepSummary | None, ranks: list[int]) -> Finding | None:
    if steps is None or not steps.model_bytes or not steps.gathered_bytes_median:
        return None
    ratio = steps.gathered_bytes_median / steps.model_bytes
    if ratio < ZERO3_MODEL_FRACTION:
        return None
    per_rank = {str(r): e.get("gathered_bytes_median") for r, e in steps.per_rank.items()}
    concerned = [r for r, e in steps.per_rank.items()
                 if e.get("gathered_bytes_median", 0) >= ZERO3_MODEL_FRACTION * steps.model_bytes] or ranks
    step = "decode step" if steps.decode else "step"
    summary = (f"each {step} gathers {_gb(steps.gathered_bytes_median)} per rank, {ratio:.0%} of the model's "
               f"{_gb(steps.model_bytes)}: ZeRO-3 gathers the weights again on every forward "
               f"({steps.ms_median:.1f} ms per step)")
    return Finding("zero3-gathers-model-per-step", sorted(concerned), summary, {
        "gathered_bytes_median": steps.gathered_bytes_median, "gathered_source": steps.gathered_source,
        "model_bytes": steps.model_bytes, "ratio": ratio, "threshold_ratio": ZERO3_MODEL_FRACTION,
        "ms_per_step_median": steps.ms_median, "per_rank_gathered_bytes_median": per_rank})


def _as_int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def tp_not_applied(run: LoadedRun) -> Finding | None:
    hit, evidence = [], {}
    for r, m in sorted(run.manifests.items()):
        requested = [t for t in m.tp_requested if (_as_int(t.value) or 0) > 1]
        if requested and m.inventory is not None and m.inventory.effective_tp == 1:
            hit.append(r)
            evidence[str(r)] = {"requested": [{"source": t.source, "key": t.key, "value": t.value} for t in requested],
                                "effective_tp": m.inventory.effective_tp,
                                "zero3_partitioned_weights": m.inventory.zero3_partitioned,
                                "weights": len(m.inventory.weights)}
    if not hit:
        return None
    first = evidence[str(hit[0])]["requested"][0]
    summary = (f"tensor parallel size {first['value']} was requested ({first['source']}: "
               f"{first['key']}) but the weights keep their full shape (effective TP 1): nothing is split by TP")
    return Finding("tp-not-applied", hit, summary, {"ranks": evidence})


def tp_config_rejected(run: LoadedRun) -> Finding | None:
    hit, evidence = [], {}
    for r, m in sorted(run.manifests.items()):
        errors = [c for c in m.deepspeed_calls if c.error and TP_ERROR.search(f"{c.error.get('type', '')} {c.error.get('message', '')}")]
        if errors:
            hit.append(r)
            evidence[str(r)] = [{"api": c.api, "error": c.error} for c in errors]
    if not hit:
        return None
    call = evidence[str(hit[0])][0]
    summary = f"{call['api']} rejected the tensor_parallel config: {error_line(call['error'])}"
    return Finding("tp-config-rejected", hit, summary, {"ranks": evidence})


def all_findings(run: LoadedRun, ranks: dict[int, RankSummary], steps: StepSummary | None) -> list[Finding]:
    candidates = [
        tp_config_rejected(run), tp_not_applied(run), zero3_gathers_model(steps, run.ranks),
        communication_bound(ranks, run.device), peer_wait(ranks), host_bound(ranks, run.device),
    ]
    return [f for f in candidates if f is not None]
