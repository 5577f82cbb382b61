"""Findings about the collectives: transfer no compute hides, ranks waiting for a late peer (or for each other in
turn), and DDP's gradient all-reduce left after backward."""
from __future__ import annotations

from dstrace.analysis.findings.host import host_bound_ranks
from dstrace.analysis.findings.inputs import FindingInputs, finding
from dstrace.analysis.results import Finding, RankReport
from dstrace.units import gbps, ms, percent, percent_range, size

DOCS = {
    "communication-bound": "docs/analysis-schema.md#findings",
    "peer-wait": "docs/analysis-schema.md#cross-rank-alignment",
    "mutual-wait": "docs/analysis-schema.md#cross-rank-alignment",
    "ddp-allreduce-exposed": "docs/workloads.md#torch-ddp-training",
}
"""Where each finding of this module is explained at length (paths in the dstrace repository)."""

COMM_BOUND_EXPOSED_FRACTION = 0.30
"""Communication transfer not hidden behind compute above ~30% of the span is the largest single cost
worth attacking first (overlap, fewer/larger collectives, or not gathering at all); below it, compute
or idle time usually dominates. Peer wait is left out: that is `peer-wait`, a different remedy."""

PEER_WAIT_SHARE = 0.30
"""A collective kernel normally spends a few percent waiting for peers (launch skew). Above ~30% of a
rank's collective time the bandwidth it sees is mostly someone else's lateness, not the link."""

PEER_WAIT_MIN_SPAN_FRACTION = 0.05
"""Ignore waits under 5% of the rank's span: a large share of a tiny collective time changes nothing."""

STRAGGLER_SHARE = 2 / 3
"""A straggler is consistently late: it arrives last to at least twice as many of the waited-on
collectives as all other ranks together, or causes twice their peer wait. Either suffices: counts alone
are diluted by collectives whose wait is tiny either way, wait alone by one long wait (the first
collective of a window absorbing the ranks' different profiler start times). Below both, the last rank
changes from collective to collective (each rank's host falls behind in turn): jitter, which no single
rank explains."""

DDP_EXPOSED_FRACTION = 0.10
"""DDP launches each gradient bucket's all-reduce as soon as backward has produced it, so all but the last
bucket should hide behind the rest of backward; over ~10% of the iteration spent in all-reduce that no
compute overlaps, the overlap is not working (one bucket, a slow or late rank, or a link too slow)."""

DDP_TRIGGERS = ("DistributedDataParallel.forward",)
"""Iteration triggers whose presence in a rank's manifest says its model is wrapped in torch DDP."""


def _exposed_transfer(s: RankReport) -> float:
    """Exposed communication less the time spent waiting for peers, and less the time of calls whose split is
    withheld (any of it may be waiting): what is surely transfer, at most."""
    return max(s.exposed_comm_us - s.wait_us - s.unsplit_us, 0.0)


def _split_comm(s: RankReport) -> float:
    """Collective time whose wait/transfer split was measured."""
    return max(s.comm_us - s.unsplit_us, 0.0)


def communication_bound(inputs: FindingInputs) -> Finding | None:
    mech = inputs.mechanisms
    hit = {r: s for r, s in inputs.ranks.items()
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
            "hta_comm_comp_overlap_pct": s.hta.comm_comp_overlap_pct,
            "by_kind_us": {k: c.kernel_us for k, c in kinds},
        }
    fractions = [e["exposed_fraction"] for e in evidence.values()]
    top_kind = max(((k, c) for s in hit.values() for k, c in s.collectives.items()),
                   key=lambda kc: kc[1].kernel_us, default=(None, None))
    pct = percent_range(min(fractions), max(fractions))
    where = "GPU" if inputs.device == "gpu" else "host (CPU trace)"
    summary = (f"{pct} of {where} time is communication transfer not overlapped "
               "by compute (peer wait excluded)")
    cause = f"collectives move data while nothing else runs: {pct} of the span is transfer no compute overlaps"
    if top_kind[0]:
        k, c = top_kind
        sizes = f", {size(c.bytes)}, {gbps(c.busbw_GBps)} GB/s bus bandwidth" if c.bytes else ""
        if c.bytes and c.busbw_transfer_GBps is not None:
            sizes += f", {gbps(c.busbw_transfer_GBps)} GB/s excluding peer wait"
        summary += f"; mostly {k} ({c.count} calls, {ms(c.kernel_us)}{sizes})"
        cause += f", mostly {k} ({size(c.bytes)} in {c.count} calls)" if c.bytes else f", mostly {k}"
    fewer = ["fewer or larger collectives"]
    overlap = ["issue them before the compute that does not need their result"]
    if mech.zero3:
        fewer.append("no ZeRO-3 re-gathering the weights every forward where the model fits")
        overlap.append("ZeRO-3 `overlap_comm`, `stage3_prefetch_bucket_size`")
    if mech.decoding:
        fewer.append("AutoTP or a device_map, which move activations only; several prompts per forward to share "
                     "each transfer")
    remedy = f"move fewer bytes per step ({'; '.join(fewer)}), or overlap them with compute ({'; '.join(overlap)})"
    if mech.gpu:
        remedy += ("; check the link with nccl-tests when 'busbw w/o wait' is well below what the interconnect "
                   "should reach")
    return finding(DOCS, "communication-bound", sorted(hit), summary,
                   {"threshold_exposed_fraction": COMM_BOUND_EXPOSED_FRACTION, "ranks": evidence}, cause, remedy)


def waiting_for_peers(inputs: FindingInputs) -> Finding | None:
    """`peer-wait` when one rank is consistently late (a straggler), `mutual-wait` when every rank keeps
    the others waiting in turn (jitter): two causes of one measure with different remedies, so one check
    that states one or the other. Over the calls whose wait/transfer split holds only (`peer_wait.withhold`)."""
    ranks, mech = inputs.ranks, inputs.mechanisms
    hit = {r: s for r, s in ranks.items() if _split_comm(s) > 0 and s.span_us > 0
           and s.wait_us / _split_comm(s) >= PEER_WAIT_SHARE and s.wait_us >= PEER_WAIT_MIN_SPAN_FRACTION * s.span_us}
    if not hit:
        return None
    late = {r: {"late_count": s.late_count, "caused_wait_us": s.caused_wait_us}
            for r, s in ranks.items() if s.caused_wait_us > 0}
    caused_total = sum(v["caused_wait_us"] for v in late.values())
    late_total = sum(v["late_count"] for v in late.values())
    straggler = next((r for r, v in sorted(late.items())
                      if v["late_count"] >= STRAGGLER_SHARE * late_total
                      or v["caused_wait_us"] >= STRAGGLER_SHARE * caused_total), None)
    evidence = {
        "threshold_wait_share": PEER_WAIT_SHARE, "threshold_min_span_fraction": PEER_WAIT_MIN_SPAN_FRACTION,
        "threshold_straggler_share": STRAGGLER_SHARE,
        "waiting": {str(r): {"wait_us": s.wait_us, "comm_us": s.comm_us, "unsplit_us": s.unsplit_us,
                             "wait_share": s.wait_us / _split_comm(s), "span_us": s.span_us,
                             "waited_for_us": {str(p): w for p, w in s.waited_for.items()}}
                    for r, s in sorted(hit.items())},
        "late_ranks": {str(r): {**v, "caused_share": v["caused_wait_us"] / caused_total if caused_total else None,
                                "late_share": v["late_count"] / late_total if late_total else None}
                       for r, v in sorted(late.items())},
        "straggler": straggler,
    }
    host_bound = host_bound_ranks(inputs)

    def waits(r: int, s: RankReport) -> str:
        of = "its collective time" if not s.unsplit_us else "its collective time with a measured split"
        return f"rank {r} waits {ms(s.wait_us)} ({percent(s.wait_us / _split_comm(s))} of {of})"

    if straggler is None:
        shares = ", ".join(f"rank {r} {v['late_count']} ({percent(v['late_count'] / late_total)})"
                           for r, v in sorted(late.items())) if late_total else "none matched"
        summary = ("no rank is consistently late: " + "; ".join(waits(r, s) for r, s in sorted(hit.items()))
                   + f"; the last to arrive changes from collective to collective (arrived last: {shares})")
        everyone_host = set(hit) <= set(host_bound)
        origin = ("host-side delays on every rank: each is host-bound (GPU idle " + ", ".join(
            f"{percent(host_bound[r][0].idle_us / host_bound[r][0].span_us)} on rank {r}" for r in sorted(hit)) + ")"
                  if everyone_host else "launch delays that move from rank to rank")
        summary += f"; the waits come from {origin}"
        cause = ("a collective finishes only when its last rank has launched it, and each rank's host falls "
                 f"behind in turn, so every rank spends its collective kernels spinning for another: {origin}; "
                 "the link is not what is slow")
        where = ["see host-bound" if host_bound else "each rank's trace: what its host runs between collectives"]
        if mech.zero3:
            where.append("for ZeRO-3 that is its per-sub-module fetch and release hooks; fewer, larger all-gathers "
                         "via `stage3_prefetch_bucket_size`" + (", or no ZeRO-3 for inference" if mech.decoding else ""))
        remedy = (f"shorten the host work between collectives on every rank ({'; '.join(where)}), and read "
                  "bandwidth from 'busbw w/o wait': with the wait included it measures the hosts, not the link")
        return finding(DOCS, "mutual-wait", sorted(hit), summary, evidence, cause, remedy)

    waiting = {r: s for r, s in hit.items() if r != straggler} or hit
    parts = []
    for r, s in sorted(waiting.items()):
        peer = max(s.waited_for, key=s.waited_for.get) if s.waited_for else None
        parts.append(waits(r, s) + (f", mostly for rank {peer}" if peer is not None else ""))
    v = late[straggler]
    summary = "; ".join(parts) + (f"; rank {straggler} arrives last to {v['late_count']} of {late_total} waited-on "
                                  f"collectives ({percent(v['late_count'] / late_total)}) and causes "
                                  f"{percent(v['caused_wait_us'] / caused_total)} of all peer wait")
    slow = host_bound.get(straggler)
    why = (f"rank {straggler}'s host is late to launch them (its GPU idles "
           f"{percent(slow[0].idle_us / slow[0].span_us)} of the span waiting for the host, see host-bound)" if slow else
           f"rank {straggler} reaches them later than its peers")
    cause = ("a collective finishes only when its last rank has launched it; the others' kernels spin meanwhile, "
             f"and that spinning is counted as communication time: {why}")
    look = f"its trace{', its host-bound entry' if slow else ''}"
    uneven = ("uneven work per rank (different prompt lengths make synced_gpus run extra forwards)"
              if mech.decoding and mech.zero3 else "uneven work per rank")
    unknown = "" if slow else f"why rank {straggler} is late is not identified in the traces: "
    remedy = (f"{unknown}find what rank {straggler} does before its collectives ({look}): "
              f"{uneven}, a data-loading, logging or I/O stall, CPU affinity / NUMA placement, or a slower device; "
              "give ranks equal work")
    return finding(DOCS, "peer-wait", sorted(waiting), summary, evidence, cause, remedy)


def ddp_allreduce_exposed(inputs: FindingInputs) -> Finding | None:
    """DDP training: the gradient all-reduce buckets per iteration and how much of them backward hides."""
    run, ranks, steps = inputs.run, inputs.ranks, inputs.steps
    ddp = [r for r, m in run.manifests.items() if m.window and any(t in m.window.iterations for t in DDP_TRIGGERS)]
    per_rank = steps.per_rank if steps is not None and not steps.decode else {}
    hit, evidence = [], {}
    for r in sorted(ddp):
        s = ranks.get(r)
        allreduce = s.collectives.get("AllReduce") if s else None
        iterations = int(per_rank.get(r, {}).get("count", 0))
        if not allreduce or not iterations or s.span_us <= 0:
            continue
        exposed = min(s.exposed_comm_us, allreduce.kernel_us)
        evidence[str(r)] = {
            "iterations": iterations, "buckets_per_iteration": allreduce.count / iterations,
            "allreduce_bytes_per_iteration": allreduce.bytes / iterations,
            "allreduce_us_per_iteration": allreduce.kernel_us / iterations,
            "exposed_us_per_iteration": exposed / iterations, "wait_us_per_iteration": s.wait_us / iterations,
            "overlapped_fraction": 1 - exposed / allreduce.kernel_us if allreduce.kernel_us else None,
            "exposed_fraction": exposed / s.span_us}
        if exposed / s.span_us >= DDP_EXPOSED_FRACTION:
            hit.append(r)
    if not hit:
        return None
    worst = max(hit, key=lambda r: evidence[str(r)]["exposed_fraction"])
    e = evidence[str(worst)]
    allreduce = ranks[worst].collectives["AllReduce"]
    waits = min(allreduce.wait_us / allreduce.kernel_us, 1.0) if allreduce.kernel_us else 0.0
    summary = (f"DDP gradient all-reduce not hidden behind backward: {ms(e['exposed_us_per_iteration'])} per "
               f"iteration exposed on rank {worst} ({percent(e['exposed_fraction'])} of the profiled iterations), "
               f"{e['buckets_per_iteration']:.0f} bucket(s) of {size(e['allreduce_bytes_per_iteration'])} per "
               f"iteration, {percent(e['overlapped_fraction'] or 0)} of the all-reduce time overlapped by compute")
    peer = waiting_for_peers(inputs)
    see = " (see peer-wait)" if peer is not None and peer.id == "peer-wait" else ""
    cause = ("the all-reduce of the last bucket(s) runs after backward has finished, and the optimizer step waits "
             f"for it; {percent(waits)} of rank {worst}'s all-reduce time is waiting for a later peer{see}"
             if waits >= 0.5 else
             "the all-reduce of the last bucket(s) runs after backward has finished, and the optimizer step waits "
             "for it: transfer that no compute hides")
    remedy = ("smaller `bucket_cap_mb` so that more buckets start during backward (or `gradient_as_bucket_view=True`); "
              "equal work per rank when peers wait; gradient accumulation with `no_sync()` to all-reduce less often; "
              "a faster backend or link (NCCL over NVLink rather than gloo)")
    return finding(DOCS, "ddp-allreduce-exposed", hit, summary,
                   {"threshold_exposed_fraction": DDP_EXPOSED_FRACTION, "ranks": evidence}, cause, remedy)
