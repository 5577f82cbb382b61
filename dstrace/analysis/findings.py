"""Findings: conclusions a DeepSpeed user can act on, each stated only when its evidence holds.

Every finding has a stable id (documented in docs/analysis-schema.md), the ranks it concerns, a
one-line summary with the numbers, the evidence those numbers come from, its cause and its remedy
(built from what the run recorded: versions, the config as passed, the measurements). Thresholds are named
constants; each says why it has the value it has.
"""
from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from dataclasses import dataclass

from dstrace.analysis.host import host_wait_share
from dstrace.analysis.loaded import LoadedRun
from dstrace.analysis.results import Finding, RankReport as RankSummary, StepSummary
from dstrace.analysis.shift import (
    SHIFT_RATIO, UNREPRESENTATIVE_RATIO, Shift, apart, call_shifts, level_ms, median_or_none, profiler_cost,
    window_place, window_steps,
)
from dstrace.analysis.step_compare import compare_steps
from dstrace.analysis.steps import MANIFEST_COVERS, cost_json, decode_step_ms
from dstrace.errors import UserError

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
"""Call it host-bound only when most of that idle time comes before the launch call of the kernel that ends
each gap (`host.host_wait`: the next kernel was not launched yet), as opposed to waiting on synchronisation
or on other streams."""

ZERO3_MODEL_FRACTION = 0.5
"""The model size (`inventory.logical_bytes`) counts weights a decode forward never runs (the vision
tower of NVLM/InternVL-style models) and ZeRO-3 keeps small parameters persistent, so a step that
re-gathers the whole language model shows well under 100% (73% in the tiny CPU stand-in, ~88% for a
Llama-8B on H200). Above half the model moved every step, step time scales with model size, not tokens."""

DDP_EXPOSED_FRACTION = 0.10
"""DDP launches each gradient bucket's all-reduce as soon as backward has produced it, so all but the last
bucket should hide behind the rest of backward; over ~10% of the iteration spent in all-reduce that no
compute overlaps, the overlap is not working (one bucket, a slow or late rank, or a link too slow)."""

DDP_TRIGGERS = ("DistributedDataParallel.forward",)
"""Iteration triggers whose presence in a rank's manifest says its model is wrapped in torch DDP."""

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


HOST_BOUND_MOSTLY_SHARE = 0.5
"""Say the host was "mostly in X" only when X overlaps at least half of the GPU's idle time; otherwise
name the top three with their shares, so no single item is blamed for time it does not hold."""

STRAGGLER_SHARE = 2 / 3
"""A straggler is consistently late: it arrives last to at least twice as many of the waited-on
collectives as all other ranks together, or causes twice their peer wait. Either suffices: counts alone
are diluted by collectives whose wait is tiny either way, wait alone by one long wait (the first
collective of a window absorbing the ranks' different profiler start times). Below both, the last rank
changes from collective to collective (each rank's host falls behind in turn): jitter, which no single
rank explains."""

AUTOTP_FIXED = (0, 16, 4)
"""DeepSpeed 0.16.0-0.16.3 have no `tensor_parallel` key in the training config (the block is accepted
and ignored); from 0.16.4 it parses into `TPTrainingConfig`, which refuses `tp_size`."""

SPLIT_REMEDY = ("to split the computation, use `deepspeed.init_inference(model, "
                "tensor_parallel={\"tp_size\": N})` (AutoTP: each rank holds ~1/N of every Linear and all-reduces "
                "activations; all ranks of a TP group must get the same input), a HF `device_map` in one process "
                "(layers spread over the GPUs), or transformers' `from_pretrained(..., tp_plan=\"auto\")` under "
                "torchrun; `dstrace compare` of these configurations measures each")

DOCS = {
    "tp-config-rejected": "docs/root-cause.md#1-the-mechanism",
    "tp-not-applied": "docs/root-cause.md#1-the-mechanism",
    "zero3-gathers-model-per-step": "docs/root-cause.md#1-the-mechanism",
    "communication-bound": "docs/analysis-schema.md#findings",
    "peer-wait": "docs/analysis-schema.md#cross-rank-alignment",
    "mutual-wait": "docs/analysis-schema.md#cross-rank-alignment",
    "host-bound": "docs/analysis-schema.md#findings",
    "step-time-shift": "docs/analysis-schema.md#step-time-shift",
    "window-not-representative": "docs/analysis-schema.md#step-time-shift",
    "ddp-allreduce-exposed": "docs/workloads.md#torch-ddp-training",
    "fsdp-gathers-model-per-step": "docs/workloads.md#fsdp2-training",
}
"""Where each finding is explained at length (paths in the dstrace repository)."""


def _finding(id_: str, ranks: list[int], summary: str, evidence: dict, cause: str, remedy: str) -> Finding:
    return Finding(id_, ranks, summary, evidence, cause=cause, remedy=remedy, docs=DOCS[id_])


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _ms(us: float) -> str:
    return f"{us / 1e3:.1f} ms"


def _version(run: LoadedRun, package: str) -> str | None:
    found = sorted({m.versions.get(package) for m in run.manifests.values() if m.versions.get(package)})
    return ", ".join(found) if found else None


def _release(version: str | None) -> tuple[int, ...] | None:
    """`0.16.1+abc` -> (0, 16, 1); None when it does not start with numbers."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return tuple(int(x) for x in m.groups()) if m else None


def _exposed_transfer(s: RankSummary) -> float:
    """Exposed communication less the time spent waiting for peers, and less the time of calls whose split is
    withheld (any of it may be waiting): what is surely transfer, at most."""
    return max(s.exposed_comm_us - s.wait_us - s.unsplit_us, 0.0)


def _split_comm(s: RankSummary) -> float:
    """Collective time whose wait/transfer split was measured."""
    return max(s.comm_us - s.unsplit_us, 0.0)


@dataclass(frozen=True)
class Mechanisms:
    """What the run's evidence shows of the mechanisms a remedy names: a remedy is given only where its
    mechanism is in the manifests or the traces, never from the case dstrace was first built on."""
    zero3: bool  # ZeRO-3: partitioned weights or stage 3 in a manifest, or ZeRO-3's ranges in a trace
    decoding: bool  # generate()/chat() steps: dstrace's step ranges, or calls in the manifests
    gpu: bool  # collectives are GPU kernels (NCCL/RCCL), not gloo's CPU ops


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
    return _as_int(zero.get("stage")) if isinstance(zero, dict) else None


def mechanisms(run: LoadedRun, ranks: dict[int, RankSummary], steps: StepSummary | None) -> Mechanisms:
    manifests = run.manifests.values()
    zero3 = (any(m.inventory is not None and m.inventory.zero3_partitioned for m in manifests)
             or any(_zero_stage(c.config) == 3 for m in manifests for c in m.deepspeed_calls)
             or any(len(t.reduced.gathers) for t in run.traces.values())
             or any(k.startswith("zero3.") for s in ranks.values() for k in _items(s.host_time, "in_dstrace_ranges")))
    decoding = bool(steps is not None and steps.decode and steps.count) or any(m.calls for m in manifests)
    return Mechanisms(zero3=zero3, decoding=decoding, gpu=run.device == "gpu")


def communication_bound(ranks: dict[int, RankSummary], device: str, mech: Mechanisms) -> Finding | None:
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
            "hta_comm_comp_overlap_pct": s.hta.comm_comp_overlap_pct,
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
    cause = f"collectives move data while nothing else runs: {pct} of the span is transfer no compute overlaps"
    if top_kind[0]:
        k, c = top_kind
        sizes = f", {_gb(c.bytes)}, {c.busbw_GBps:.1f} GB/s bus bandwidth" if c.bytes else ""
        if c.bytes and c.busbw_transfer_GBps is not None:
            sizes += f", {c.busbw_transfer_GBps:.1f} GB/s excluding peer wait"
        summary += f"; mostly {k} ({c.count} calls, {_ms(c.kernel_us)}{sizes})"
        cause += f", mostly {k} ({_gb(c.bytes)} in {c.count} calls)" if c.bytes else f", mostly {k}"
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
    return _finding("communication-bound", sorted(hit), summary,
                    {"threshold_exposed_fraction": COMM_BOUND_EXPOSED_FRACTION, "ranks": evidence}, cause, remedy)


def _host_bound_ranks(ranks: dict[int, RankSummary], device: str) -> dict[int, tuple[RankSummary, float]]:
    if device != "gpu":
        return {}
    hit = {}
    for r, s in ranks.items():
        share = host_wait_share(s.host_time)
        if s.span_us > 0 and share is not None and s.idle_us / s.span_us >= HOST_BOUND_IDLE_FRACTION \
                and share >= HOST_BOUND_HOST_WAIT_SHARE:
            hit[r] = (s, share)
    return hit


def peer_wait(ranks: dict[int, RankSummary], device: str = "gpu", mech: Mechanisms | None = None) -> Finding | None:
    """`peer-wait` when one rank is consistently late (a straggler), `mutual-wait` when every rank keeps
    the others waiting in turn (jitter): two causes with different remedies. Over the calls whose
    wait/transfer split holds only (`peer_wait.withhold`)."""
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
    host_bound = _host_bound_ranks(ranks, device)
    mech = mech or Mechanisms(zero3=False, decoding=False, gpu=device == "gpu")

    def waits(r: int, s: RankSummary) -> str:
        of = "its collective time" if not s.unsplit_us else "its collective time with a measured split"
        return f"rank {r} waits {_ms(s.wait_us)} ({s.wait_us / _split_comm(s):.0%} of {of})"

    if straggler is None:
        shares = ", ".join(f"rank {r} {v['late_count']} ({v['late_count'] / late_total:.0%})"
                           for r, v in sorted(late.items())) if late_total else "none matched"
        summary = ("no rank is consistently late: " + "; ".join(waits(r, s) for r, s in sorted(hit.items()))
                   + f"; the last to arrive changes from collective to collective (arrived last: {shares})")
        everyone_host = set(hit) <= set(host_bound)
        origin = ("host-side delays on every rank: each is host-bound (GPU idle " + ", ".join(
            f"{host_bound[r][0].idle_us / host_bound[r][0].span_us:.0%} on rank {r}" for r in sorted(hit)) + ")"
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
        return _finding("mutual-wait", sorted(hit), summary, evidence, cause, remedy)

    waiting = {r: s for r, s in hit.items() if r != straggler} or hit
    parts = []
    for r, s in sorted(waiting.items()):
        peer = max(s.waited_for, key=s.waited_for.get) if s.waited_for else None
        parts.append(waits(r, s) + (f", mostly for rank {peer}" if peer is not None else ""))
    v = late[straggler]
    summary = "; ".join(parts) + (f"; rank {straggler} arrives last to {v['late_count']} of {late_total} waited-on "
                                  f"collectives ({v['late_count'] / late_total:.0%}) and causes "
                                  f"{v['caused_wait_us'] / caused_total:.0%} of all peer wait")
    slow = host_bound.get(straggler)
    why = (f"rank {straggler}'s host is late to launch them (its GPU idles {slow[0].idle_us / slow[0].span_us:.0%} "
           "of the span waiting for the host, see host-bound)" if slow else
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
    return _finding("peer-wait", sorted(waiting), summary, evidence, cause, remedy)


INIT_CALLS = re.compile(r"^(?:cudaFree|cuModuleLoad|cuModuleGetFunction|cuLibraryLoad|cuLibraryGetModule|"
                        r"cudaGetDeviceProperties|cudaFuncGetAttributes|hipFree|hipModuleLoad|cudnnCreate|cublasCreate|"
                        r"cudaGraphInstantiate|hipGraphInstantiate)")
"""Runtime calls that do one-time set-up: freeing the caching allocator's blocks, loading a kernel module,
creating a library handle, instantiating a captured graph. In a profiled window they are initialisation, not the steady state."""
SYNC_CALLS = re.compile(r"^(?:cudaMemcpy|cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|"
                        r"hipMemcpy|hipMemcpyWithStream|hipStreamSynchronize|hipDeviceSynchronize|hipEventSynchronize|cuMemcpyDtoH.*|"
                        r"cuCtxSynchronize)$")
"""Runtime calls that block the host until the device is done (cudaMemcpy is synchronous; the Async form is not)."""
SYNC_OPS = re.compile(r"^aten::(?:item|_local_scalar_dense|cpu)$")
"""CPU ops that read a device value on the host: each waits for the device to finish first."""
INPUT_PIPELINE = re.compile(r"DataLoader", re.IGNORECASE)
"""torch.profiler names each batch fetch `enumerate(DataLoader)#_...DataLoaderIter.__next__`."""
LAUNCH_CALLS = re.compile(r"^(?:cudaLaunchKernel|cuLaunchKernel|cudaLaunchKernelExC|hipLaunchKernel|"
                          r"hipExtModuleLaunchKernel|cudaLaunchCooperativeKernel)")
"""Kernel launches: when they hold most of the idle time, the GPU waits on launch overhead itself."""


def _items(host_time: dict, key: str) -> dict[str, float]:
    """One of `host.host_during_idle`'s name -> us maps, numbers only (a summary file is untrusted)."""
    items = host_time.get(key)
    return {str(k): float(v) for k, v in items.items() if isinstance(v, (int, float)) and not isinstance(v, bool)} \
        if isinstance(items, dict) else {}


def _matching(items: dict[str, float], pattern: re.Pattern) -> dict[str, float]:
    return {k: v for k, v in items.items() if pattern.search(k)}


def idle_causes(host_time: dict, mech: Mechanisms) -> dict[str, tuple[float, list[str]]]:
    """Each mechanism the trace shows during the GPU's idle time: cause -> (GPU idle time it accounts for, what
    shows it). Nested items (an aten::item and its cudaStreamSynchronize) are not added up: the larger counts."""
    ops, calls = _items(host_time, "top_cpu_ops"), _items(host_time, "runtime_calls")
    user, ranges = _items(host_time, "user_ranges"), _items(host_time, "in_dstrace_ranges")
    first = host_time.get("first_calls") if isinstance(host_time.get("first_calls"), dict) else {}
    first_idle = {str(k): float(v.get("idle_us")) for k, v in first.items()
                  if isinstance(v, dict) and isinstance(v.get("idle_us"), (int, float))}
    first_extra = {k: float(e) if isinstance(e := first[k].get("extra_us"), (int, float)) else 0.0 for k in first_idle}
    out: dict[str, tuple[float, list[str]]] = {}

    def add(cause: str, *groups: dict[str, float], labels: list[str] | None = None) -> None:
        us = max((sum(g.values()) for g in groups), default=0.0)
        if us > 0:  # what shows it, the most idle time first
            ranked = sorted(((v, k) for g in groups for k, v in g.items()), key=lambda vk: -vk[0])
            out[cause] = (us, labels or list(dict.fromkeys(k for _, k in ranked)))

    first_named = {f"first {k} call ({first_extra[k] / 1e3:.1f} ms more than its later calls)": v
                   for k, v in first_idle.items()}
    add("one-time initialisation", _matching(calls, INIT_CALLS), first_named)
    add("graph capture", _items(host_time, "graph_capture"))
    add("input pipeline", _matching(user, INPUT_PIPELINE), _matching(ops, INPUT_PIPELINE))
    add("blocking copy", _matching(calls, SYNC_CALLS), _matching(ops, SYNC_OPS))
    add("kernel launch overhead", _matching(calls, LAUNCH_CALLS))
    hooks = host_time.get("zero3_hooks_us")
    if mech.zero3 and isinstance(hooks, (int, float)) and not isinstance(hooks, bool):
        add("ZeRO-3 hooks", {"all": float(hooks)}, labels=[k for k in ranges if k.startswith("zero3.")])
    return out


BLOCKED_IDLE_SHARE = 0.5
"""Name the host calls that wait for the device when they overlap over half of a rank's GPU idle time."""


def blocking_call_notes(ranks: dict[int, RankSummary], device: str) -> list[str]:
    """Per GPU rank idle for a large share of its span whose idle time lies mostly inside host calls that wait
    for the device (SYNC_CALLS), where host-bound does not read it (the kernel that ends each gap was launched
    already): name those calls. The host waited in them for a GPU that ran nothing; what the GPU waited on is
    not in the events."""
    if device != "gpu":
        return []
    out = []
    for r, s in sorted(ranks.items()):
        idle, share = s.host_time.get("gpu_idle_us"), host_wait_share(s.host_time)
        if share is None or share >= HOST_BOUND_HOST_WAIT_SHARE or not s.span_us > 0 \
                or s.idle_us / s.span_us < HOST_BOUND_IDLE_FRACTION:
            continue
        calls = _matching(_items(s.host_time, "runtime_calls"), SYNC_CALLS)
        if not calls:
            continue
        name, us = max(calls.items(), key=lambda kv: kv[1])
        if us >= BLOCKED_IDLE_SHARE * idle:
            out.append(f"rank {r}: {us / 1e3:.1f} ms of the GPU's {idle / 1e3:.1f} ms idle time overlaps host {name} "
                       "calls, which return only once the device is done: the host waited there while the GPU ran "
                       "nothing, and the next kernel was already launched, so the host did not hold the GPU up. "
                       f"What the GPU waited on is not identified: open the trace at the {name} call")
    return out


def _cudnn_note(names: str) -> str:
    if "scaled_dot_product_attention" not in names and "cudnn_attention" not in names:
        return ""
    return ("; attention's host time grows when cuDNN plans each new sequence length (measured on H200, "
            "docs/analysis-schema.md#step-time-shift): warm up over the lengths you time, or try `torch.backends.cuda.enable_cudnn_sdp(False)`")


def _host_bound_remedy(cause: str | None, evidence: list[str], mech: Mechanisms, names: str, worst: int) -> str:
    shown = ", ".join(evidence[:3])
    if cause == "one-time initialisation":
        return (f"warm up before the window: the idle is one-time work ({shown}), not the steady state; run a step "
                "of the same shapes before profiling (`dstrace record --window-start N` with N past the first steps)")
    if cause == "graph capture":
        return (f"the window holds CUDA graph capture ({shown}), one-time set-up, not the steady state: profile "
                "the graph's replays (start the window after the capture)")
    if cause == "input pipeline":
        return (f"the GPU waits for the next batch ({shown}): more DataLoader workers (`num_workers`), "
                "`pin_memory=True`, `prefetch_factor`, or lighter per-sample work")
    if cause == "blocking copy":
        return (f"a blocking copy or synchronisation ({shown}) makes the host wait for the device, and nothing is "
                "queued behind it: keep the value on the device, copy with `non_blocking=True` to or from pinned "
                "memory, or read it once every few steps (`.item()`, `.cpu()` and printing a tensor synchronise)")
    if cause == "ZeRO-3 hooks":
        return ("the host time is ZeRO-3's per-sub-module fetch/release hooks, run for every sub-module on every "
                "step" + ("; without ZeRO-3 for inference (AutoTP, device_map) they are gone" if mech.decoding else "")
                + "; with it, fewer larger fetches (`stage3_prefetch_bucket_size`, "
                  "`stage3_param_persistence_threshold` to keep small weights resident) cut their number")
    if cause == "kernel launch overhead":
        remedy = (f"kernel launches ({shown}) hold the GPU's idle time: fewer, larger kernels (`torch.compile` "
                  "fuses them) or CUDA graphs (`torch.compile(mode=\"reduce-overhead\")`)")
        if mech.decoding:
            remedy += "; more tokens per forward (batch prompts), a static KV cache for CUDA graphs"
        remedy += _cudnn_note(names)
        return remedy
    return (f"cause not identified: no host activity in rank {worst}'s trace accounts for most of the GPU's idle "
            f"time{f' (largest: {shown})' if shown else ''}; open its trace (`dstrace view`) and read what the host "
            "runs between the end of each idle gap's last kernel and the launch of the next")


def host_bound(ranks: dict[int, RankSummary], device: str, mech: Mechanisms | None = None) -> Finding | None:
    hit = _host_bound_ranks(ranks, device)
    if not hit:
        return None
    mech = mech or Mechanisms(zero3=False, decoding=False, gpu=device == "gpu")
    evidence = {}
    for r, (s, share) in sorted(hit.items()):
        evidence[str(r)] = {"span_us": s.span_us, "gpu_idle_us": s.idle_us, "idle_fraction": s.idle_us / s.span_us,
                            "host_wait_us": s.host_time.get("host_wait_us"), "host_wait_share_of_idle": share,
                            "hta_idle_causes_summed_over_streams_us": s.hta.idle_causes_us,
                            "host_during_gpu_idle": s.host_time,
                            "causes_us": {k: v[0] for k, v in idle_causes(s.host_time, mech).items()}}
    order = sorted(hit, key=lambda r: (-hit[r][0].idle_us / hit[r][0].span_us, r))
    worst, (s0, share0) = order[0], hit[order[0]]
    others = "".join(f", {hit[r][0].idle_us / hit[r][0].span_us:.0%} on rank {r}" for r in order[1:])
    summary = (f"GPU idle {s0.idle_us / s0.span_us:.0%} of {_ms(s0.span_us)} on rank {worst}{others}; "
               f"{share0:.0%} of rank {worst}'s GPU idle time is waiting for the host to launch the next kernel")
    where = _items(s0.host_time, "in_dstrace_ranges") or _items(s0.host_time, "top_cpu_ops")
    idle = s0.host_time.get("gpu_idle_us") or s0.idle_us
    top = list(where.items())[:3]
    if top and idle > 0:
        name, us = top[0]
        if us / idle >= HOST_BOUND_MOSTLY_SHARE:
            place = f"mostly in {name} ({_ms(us)}, {us / idle:.0%} of its GPU idle time)"
        else:
            place = "in " + ", ".join(f"{n} {u / idle:.0%}" for n, u in top) + " of its GPU idle time"
        summary += f"; the host is {place}"
    else:
        place = ""
    causes = idle_causes(s0.host_time, mech)
    cause_name, (cause_us, shown) = max(causes.items(), key=lambda kv: kv[1][0], default=(None, (0.0, [])))
    names = " ".join(n for n, _ in top)
    if cause_name is None or not idle > 0 or cause_us / idle < HOST_BOUND_MOSTLY_SHARE:
        zero3 = causes.get("ZeRO-3 hooks") if "zero3." in names else None  # the largest host item: its hooks
        cause_name, (cause_us, shown) = ("ZeRO-3 hooks", zero3) if zero3 else (None, (0.0, []))
        shown = shown or ([f"{n} {u / idle:.0%}" for n, u in top] if idle > 0 else [])
    if cause_name is None and mech.decoding:
        cause = ("each decode step's kernels finish before the host has launched the next one, so the GPU waits for "
                 "the host" + (f"; on rank {worst} the host is {place}" if place else ""))
        remedy = ("cut per-kernel host overhead: more tokens per forward (batch prompts), CUDA graphs "
                  "(`torch.compile(mode=\"reduce-overhead\")`, a static KV cache)")
        remedy += _cudnn_note(names)
    else:
        what = (f"{cause_name} overlaps {min(cause_us / idle, 1.0):.0%} of its GPU idle time ({', '.join(shown[:3])})"
                if cause_name else "what the host does then is not identified")
        how = ("kernels launched while a stream captures a CUDA graph are recorded into it, not run, so the GPU "
               "waits until the capture ends" if cause_name == "graph capture" else
               "each kernel finishes before the host has launched the next one, so the GPU waits for the host")
        cause = f"{how}; on rank {worst} {what}" + (f"; the host is {place}" if place else "")
        remedy = _host_bound_remedy(cause_name, shown, mech, names, worst)
    return _finding("host-bound", order, summary,
                    {"threshold_idle_fraction": HOST_BOUND_IDLE_FRACTION,
                     "threshold_host_wait_share": HOST_BOUND_HOST_WAIT_SHARE,
                     "threshold_mostly_share": HOST_BOUND_MOSTLY_SHARE, "worst_rank": worst, "ranks": evidence},
                    cause, remedy)


def _gather_per_step(ranks: dict[int, RankSummary], steps: StepSummary) -> dict[str, float] | None:
    """Median over ranks of the traced AllGather transfer and peer wait per traced step."""
    transfer, wait = [], []
    for r, s in ranks.items():
        ag = s.collectives.get("AllGather")
        count = steps.per_rank.get(r, {}).get("count")
        if ag and count:
            transfer.append(ag.transfer_us / count)
            wait.append(ag.wait_us / count)
    if not transfer:
        return None
    return {"transfer_us": statistics.median(transfer), "wait_us": statistics.median(wait)}


def zero3_gathers_model(steps: StepSummary | None, ranks: list[int],
                        summaries: dict[int, RankSummary] | None = None, world_size: int | None = None) -> Finding | None:
    if steps is None or not steps.model_bytes or not steps.gathered_bytes_median:
        return None
    ratio = steps.gathered_bytes_median / steps.model_bytes
    if ratio < ZERO3_MODEL_FRACTION:
        return None
    per_rank = {str(r): e.get("gathered_bytes_median") for r, e in steps.per_rank.items()}
    concerned = [r for r, e in steps.per_rank.items()
                 if e.get("gathered_bytes_median", 0) >= ZERO3_MODEL_FRACTION * steps.model_bytes] or ranks
    step_ms = steps.ms_per_step if steps.ms_per_step is not None else steps.ms_median
    step = "decode step" if steps.decode else "step"
    summary = (f"each {step} gathers {_gb(steps.gathered_bytes_median)} per rank, {ratio:.0%} of the model's "
               f"{_gb(steps.model_bytes)}: ZeRO-3 gathers the weights again on every forward "
               f"({step_ms:.1f} ms per decode step)")
    link = _gather_per_step(summaries or {}, steps)
    world = f"1/{world_size}" if world_size else "a share"
    cause = (f"ZeRO-3 partitions parameter storage, not the computation: each rank stores {world} of every weight "
             "but runs the whole model, all-gathering each sub-module's weights before its forward and freeing "
             "them after; generate() runs one forward per token (and transformers sets synced_gpus=True under "
             f"ZeRO-3), so {_gb(steps.gathered_bytes_median)} reach every rank for every token")
    if link:
        cause += (f"; in the profiled steps the all-gathers took {_ms(link['transfer_us'])} of transfer and "
                  f"{_ms(link['wait_us'])} of waiting for peers per step (median over ranks)")
    remedy = ("if the model fits without partitioning, do not use ZeRO-3 for inference; " + SPLIT_REMEDY
              + "; if ZeRO-3 must stay (model too large), serve several prompts per forward so each gather "
                "serves more tokens, and raise `stage3_param_persistence_threshold` to keep more weights resident")
    finding = _finding("zero3-gathers-model-per-step", sorted(concerned), summary, {
        "gathered_bytes_median": steps.gathered_bytes_median, "gathered_source": steps.gathered_source,
        "model_bytes": steps.model_bytes, "ratio": ratio, "threshold_ratio": ZERO3_MODEL_FRACTION,
        "ms_per_step_median": step_ms, "per_rank_gathered_bytes_median": per_rank,
        "allgather_per_traced_step_us": link}, cause, remedy)
    finding.config_change = {"zero_optimization.stage": 0}  # "do not use ZeRO-3 for inference"
    return finding


def _fsdp_run(run: LoadedRun) -> bool:
    """Weights FSDP shards (DTensors over FSDP's mesh dimension) and none ZeRO-3 partitions."""
    invs = [m.inventory for m in run.manifests.values() if m.inventory is not None]
    return any(i.fsdp_sharded for i in invs) and not any(i.zero3_partitioned for i in invs)


def fsdp_gathers_model(run: LoadedRun, steps: StepSummary | None,
                       summaries: dict[int, RankSummary]) -> Finding | None:
    """FSDP's form of ZeRO-3's cost: every sharded unit all-gathered before its forward and again for backward."""
    if steps is None or not steps.model_bytes or not steps.gathered_bytes_median:
        return None
    ratio = steps.gathered_bytes_median / steps.model_bytes
    if ratio < ZERO3_MODEL_FRACTION:
        return None
    concerned = [r for r, e in steps.per_rank.items()
                 if e.get("gathered_bytes_median", 0) >= ZERO3_MODEL_FRACTION * steps.model_bytes] or run.ranks
    count = {str(r): s.collectives["AllGather"].count / steps.per_rank[r]["count"] for r, s in summaries.items()
             if "AllGather" in s.collectives and steps.per_rank.get(r, {}).get("count")}
    per_step = statistics.median(count.values()) if count else None
    sharded = max(m.inventory.fsdp_sharded for m in run.manifests.values() if m.inventory is not None)
    step_ms = steps.ms_per_step if steps.ms_per_step is not None else steps.ms_median
    summary = (f"each step all-gathers {_gb(steps.gathered_bytes_median)} per rank, {ratio:.0%} of the model's "
               f"{_gb(steps.model_bytes)}" + (f", in {per_step:.0f} all-gathers" if per_step else "")
               + f": FSDP gathers every sharded unit's weights for its forward and again for its backward "
               f"({step_ms:.1f} ms per step)")
    cause = (f"FSDP shards {sharded} weights over the data-parallel ranks (ZeRO-3's partitioning): each "
             "`fully_shard` unit all-gathers its weights before its forward, frees them after "
             "(reshard_after_forward=True) and all-gathers them again before its backward, then reduce-scatters "
             f"its gradients; {ratio:.1f}x the model moves to every rank per step")
    link = _gather_per_step(summaries, steps)
    if link:
        cause += (f"; the all-gathers took {_ms(link['transfer_us'])} of transfer and {_ms(link['wait_us'])} of "
                  "waiting for peers per step (median over ranks)")
    remedy = ("if the model and its optimizer state fit on one device, DDP moves only gradients (one all-reduce "
              "per bucket); otherwise keep the gathered weights of the last units for backward "
              "(`reshard_after_forward=False` on them), shard over a smaller group (HSDP: a 2-D mesh) or raise the "
              "batch per step so each gather serves more samples; check that FSDP2's prefetching overlaps the "
              "gathers with compute")
    return _finding("fsdp-gathers-model-per-step", sorted(concerned), summary, {
        "gathered_bytes_median": steps.gathered_bytes_median, "gathered_source": steps.gathered_source,
        "model_bytes": steps.model_bytes, "ratio": ratio, "threshold_ratio": ZERO3_MODEL_FRACTION,
        "allgathers_per_step": count, "fsdp_sharded_weights": sharded, "ms_per_step_median": step_ms,
        "allgather_per_traced_step_us": link}, cause, remedy)


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
    version = _version(run, "deepspeed")
    release = _release(version)
    keys = sorted({e["key"] for v in evidence.values() for e in v["requested"]})
    if release and release < AUTOTP_FIXED and any(k.startswith("tensor_parallel.") for k in keys):
        cause = (f"the installed DeepSpeed {version} has no `tensor_parallel` key in its config: it accepted the "
                 "block and ignored it, so every tp_size runs the same program")
    else:
        cause = (f"the requested size ({', '.join(keys)}) reached no code that splits weights"
                 + (f" (DeepSpeed {version})" if version else ""))
    partitioned = evidence[str(hit[0])]["zero3_partitioned_weights"]
    if partitioned:
        cause += (f"; ZeRO-3 partitions parameter storage ({partitioned} weights), not the computation: every "
                  "rank still runs the whole model and gathers it every step")
    return _finding("tp-not-applied", hit, summary, {"ranks": evidence, "deepspeed": version},
                    cause, SPLIT_REMEDY[0].upper() + SPLIT_REMEDY[1:])


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
    version = _version(run, "deepspeed")
    release = _release(version)
    passed = next((c.config for c in run.manifests[hit[0]].deepspeed_calls if c.api == call["api"]), None)
    block = passed.get("tensor_parallel") if isinstance(passed, dict) else None
    cause = (f"DeepSpeed {version or '(version not recorded)'}"
             + (" parses the `tensor_parallel` block into its AutoTP training config (TPTrainingConfig), which "
                "forbids keys it does not know" if release and release >= AUTOTP_FIXED else " refused the block")
             + (f"; passed: \"tensor_parallel\": {json.dumps(block)}" if block is not None else "")
             + "; that block configures AutoTP for training (`autotp_size`), not inference")
    remedy = (SPLIT_REMEDY[0].upper() + SPLIT_REMEDY[1:] + "; to keep ZeRO-3 and split weights for training, "
              "`\"tensor_parallel\": {\"autotp_size\": N}` (accepted with ZeRO-3 from DeepSpeed 0.19.4); "
              "otherwise remove the block")
    finding = _finding("tp-config-rejected", hit, summary, {"ranks": evidence, "deepspeed": version}, cause, remedy)
    sizes = [_as_int(t.value) for t in run.manifests[hit[0]].tp_requested if (_as_int(t.value) or 0) > 1]
    if sizes:  # the remedy's `"tensor_parallel": {"autotp_size": N}`, the block replaced whole
        finding.config_change = {"tensor_parallel": {"autotp_size": sizes[0]}}
    return finding


def _steps_label(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def _work_growth(run: LoadedRun, ranks: list[int], shift: Shift, steps: list[int]) -> dict | None:
    """The traced work per step of the window's profiled steps before and after the shift (`step_compare`,
    median over ranks): the three items that changed most, in us per step."""
    before, after = [s for s in steps if s < shift.start], [s for s in steps if s >= shift.start]
    if not before or not after:
        return None
    try:
        c = compare_steps(run, (before[0], before[-1]), (after[0], after[-1]),
                          ranks[0] if len(ranks) == 1 else None, top=3)
    except UserError:
        return None
    return {i.name: {"before_us": i.steps_ms * 1e3, "after_us": i.against_ms * 1e3, "kind": i.kind}
            for i in c.items} or None


def _levels_text(sh: Shift) -> str:
    """Each kind of step's two levels, like with like: `unprofiled steps 1 vs 6-31: 36.0 -> 58.0 ms`."""
    parts = []
    for kind, lv in sh.levels.items():
        if lv.before_ms is not None and lv.after_ms is not None:
            parts.append(f"{kind} steps {_list_label(lv.before_steps)} vs {_list_label(lv.after_steps)}: "
                         f"{lv.before_ms:.1f} -> {lv.after_ms:.1f} ms ({lv.after_ms / lv.before_ms:.2f}x)")
        elif lv.after_ms is not None:
            parts.append(f"{kind} steps after it ({_list_label(lv.after_steps)}) {lv.after_ms:.1f} ms, none before")
        else:
            parts.append(f"{kind} steps before it ({_list_label(lv.before_steps)}) {lv.before_ms:.1f} ms, none after")
    return "; ".join(parts)


def _list_label(steps: list[int]) -> str:
    """Steps as runs: [1, 2, 3, 6] -> `1-3, 6`."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def step_time_shift(run: LoadedRun) -> Finding | None:
    """A call whose decode steps change level for good, like compared with like (manifests' per-step times and
    kinds; see shift.py), placed at the first step of the new level."""
    per_call: dict[int, list[tuple[int, Shift]]] = {}
    for r, m in sorted(run.manifests.items()):
        for sh in call_shifts(m):
            per_call.setdefault(sh.call, []).append((r, sh))
    if not per_call:
        return None
    parts, calls, causes = [], {}, []
    remedies = []
    for call, found in sorted(per_call.items()):
        ranks = [r for r, _ in found]
        start = int(statistics.median(sh.start for _, sh in found))
        first_sh = found[0][1]
        kind = first_sh.kind
        before = statistics.median(sh.levels[kind].before_ms for _, sh in found if kind in sh.levels
                                   and sh.levels[kind].before_ms is not None)
        after = statistics.median(sh.levels[kind].after_ms for _, sh in found if kind in sh.levels
                                  and sh.levels[kind].after_ms is not None)
        first, last = first_sh.first_before, first_sh.last_after
        place = window_place(run.manifests[ranks[0]], first_sh)
        text = (f"call {call}: from step {start} on, steps take {after / before:.2f}x as long "
                f"({_levels_text(first_sh)}; the profiler's start and stop steps left out), "
                f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}")
        steps_txt = _steps_label(place.steps[0], place.steps[-1]) if place.steps else ""
        growth = None
        if place.where == "straddles":
            growth = _work_growth(run, ranks, first_sh, place.steps)
            text += f"; the profiled window ({steps_txt}) straddles the change"
            if growth:
                text += (": per step " + ", ".join(f"{n} {g['before_us'] / 1e3:.1f} -> {g['after_us'] / 1e3:.1f} ms"
                                                   for n, g in growth.items())
                         + f" (`dstrace analyze --steps {place.steps[0]}:{start - 1} --against "
                           f"{start}:{place.steps[-1]}` lists more)")
        elif place.where in ("before", "after"):
            in_slow = (place.where == "after") == (after > before)
            text += (f"; the profiled window ({steps_txt}) lies only in the {'slower' if in_slow else 'faster'} level: "
                     "its trace cannot show what changed")
        elif place.where == "other call":
            text += f"; the profiled window is in call {place.call}: the trace shows neither level of this call"
        parts.append(text)
        calls[str(call)] = {"ranks": ranks, "start": start, "first_step": first, "last_step": last,
                            "kind": kind, "before_ms": before, "after_ms": after, "ratio": after / before,
                            "levels": {k: {"before_ms": lv.before_ms, "after_ms": lv.after_ms,
                                           "before_steps": lv.before_steps, "after_steps": lv.after_steps}
                                       for k, lv in first_sh.levels.items()},
                            "window": {"where": place.where, "call": place.call, "steps": place.steps},
                            "work_growth_us": growth}
        if growth:
            grew = max(growth.items(), key=lambda kv: kv[1]["after_us"] - kv[1]["before_us"])
            causes.append(f"in call {call}, {grew[0]} grew from {grew[1]['before_us'] / 1e3:.1f} to "
                          f"{grew[1]['after_us'] / 1e3:.1f} ms per step across the change")
            if "attention" in grew[0]:
                causes.append("attention's host time growing at new sequence lengths is cuDNN building a plan for "
                              "each length it has not seen (measured on H200 with device_map)")
        elif place.where != "straddles":
            remedies.append(f"to see what changes in call {call}, profile across step {start}: "
                            f"`dstrace record --window-call {call} --window-start {max(start - 1, 1)} --window-steps 3`")
    summary = "; ".join(parts)
    cause = ("the steps of one call are not alike: the step time changed level and stayed there"
             + ("; " + "; ".join(causes) if causes else
                "; what changed is not in the traces (the profiled window does not cover the change)"))
    remedy = ("compare configurations on the same level: time more calls and steps, warm up with a call as long "
              "as the timed one, and report both levels rather than a whole-call average"
              + ("; " + "; ".join(remedies) if remedies else ""))
    ranks = sorted({r for found in per_call.values() for r, _ in found})
    return _finding("step-time-shift", ranks, summary, {"threshold_ratio": SHIFT_RATIO, "calls": calls}, cause, remedy)


def window_not_representative(run: LoadedRun, steps: StepSummary | None) -> Finding | None:
    """The profiled window lies at another level than the run's typical decode step: its call's unprofiled steps
    at the window's side of any shift run at another speed. The profiler's own cost (profiled vs unprofiled steps
    of one level, `shift.profiler_cost`) is not such a difference: it is quoted apart, as the Steps line does."""
    if steps is None or steps.ms_per_step is None or steps.ms_per_step_covers != MANIFEST_COVERS:
        return None
    level = level_ms(run.manifests)
    if level is None:
        return None
    samples, level_label = level
    level_value, level_count = float(statistics.median(samples)), len(samples)
    ratio = level_value / steps.ms_per_step
    if 1 / UNREPRESENTATIVE_RATIO < ratio < UNREPRESENTATIVE_RATIO:
        return None
    others = Counter(ms for m in run.manifests.values() for ms in decode_step_ms(m))
    others.subtract(Counter(samples))
    rest = list(others.elements())
    if not rest or not apart(samples, rest):
        return None  # the run's other steps overlap the window's level: one level, however its median falls
    profiled = {}
    for r, m in sorted(run.manifests.items()):
        call, shown = window_steps(m)
        times = next((c.step_ms for c in m.calls if c.index == call), [])
        profiled[r] = [times[s] for s in shown]
    window_ms = median_or_none([v for vs in profiled.values() for v in vs])
    w = next(m.window for m in run.manifests.values() if m.window and m.window.recorded_steps)
    shown = sorted({s for r, m in run.manifests.items() for s in window_steps(m)[1]})
    where = f"call {w.call}, {_steps_label(shown[0], shown[-1])}"
    cost = profiler_cost(run.manifests)
    summary = (f"the profiled window ({where}) lies at another level than the run's typical step: its call's "
               f"unprofiled steps at that level ({level_label}, {level_count} steps) take {level_value:.1f} ms, "
               f"{ratio:.2f}x the run's {steps.ms_per_step:.1f} ms per decode step; the trace shows a "
               f"{'slower' if ratio > 1 else 'faster'} moment than the typical step"
               + (f"; apart from that, {cost.line()}" if cost else ""))
    shifts = [sh for m in run.manifests.values() for sh in call_shifts(m) if sh.call == w.call]
    cause = ("the window's level differs from the run's typical one"
             + (f": call {w.call} changes level at step {shifts[0].start} and the window lies on one side "
                "(see step-time-shift)" if shifts else f": call {w.call} runs at another speed than the other calls")
             + "; the traced shares (idle, wait, host time) describe that level, not the run's typical step")
    if shifts:
        later = shifts[0].start + 1 if level_label.startswith("before") else max(shifts[0].start - 3, 2)
        remedy = (f"profile steps of the level you care about (e.g. `dstrace record --window-call {w.call} "
                  f"--window-start {later}`), ")
    else:
        typical = min((c for m in run.manifests.values() for c in m.calls if c.index != w.call and not c.error),
                      key=lambda c: abs(statistics.median(c.step_ms[1:] or c.step_ms) - steps.ms_per_step),
                      default=None)
        remedy = (f"profile a call at the typical level (e.g. `dstrace record --window-call {typical.index}`), "
                  if typical else "profile a call at the typical level, ")
    remedy += "and take step times from the manifests (`ms per decode step`, the profiler's steps left out)"
    return _finding("window-not-representative", sorted(r for r, v in profiled.items() if v), summary,
                    {"threshold_ratio": UNREPRESENTATIVE_RATIO, "level_ms": level_value, "level": level_label,
                     "level_steps": level_count, "window_ms_median": window_ms, "ms_per_step": steps.ms_per_step,
                     "ratio": ratio, "profiler_cost": cost_json(cost),
                     "profiled_step_ms": {str(r): v for r, v in profiled.items()}}, cause, remedy)


def ddp_allreduce_exposed(run: LoadedRun, ranks: dict[int, RankSummary], steps: StepSummary | None,
                          peer_finding: bool = False) -> Finding | None:
    """DDP training: the gradient all-reduce buckets per iteration and how much of them backward hides."""
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
    summary = (f"DDP gradient all-reduce not hidden behind backward: {_ms(e['exposed_us_per_iteration'])} per "
               f"iteration exposed on rank {worst} ({e['exposed_fraction'] * 100:.0f}% of the profiled iterations), "
               f"{e['buckets_per_iteration']:.0f} bucket(s) of {_gb(e['allreduce_bytes_per_iteration'])} per iteration, "
               f"{(e['overlapped_fraction'] or 0) * 100:.0f}% of the all-reduce time overlapped by compute")
    see = " (see peer-wait)" if peer_finding else ""
    cause = ("the all-reduce of the last bucket(s) runs after backward has finished, and the optimizer step waits "
             f"for it; {waits * 100:.0f}% of rank {worst}'s all-reduce time is waiting for a later peer{see}"
             if waits >= 0.5 else
             "the all-reduce of the last bucket(s) runs after backward has finished, and the optimizer step waits "
             "for it: transfer that no compute hides")
    remedy = ("smaller `bucket_cap_mb` so that more buckets start during backward (or `gradient_as_bucket_view=True`); "
              "equal work per rank when peers wait; gradient accumulation with `no_sync()` to all-reduce less often; "
              "a faster backend or link (NCCL over NVLink rather than gloo)")
    return _finding("ddp-allreduce-exposed", hit, summary,
                    {"threshold_exposed_fraction": DDP_EXPOSED_FRACTION, "ranks": evidence}, cause, remedy)


def all_findings(run: LoadedRun, ranks: dict[int, RankSummary], steps: StepSummary | None) -> list[Finding]:
    ranks = {r: s for r, s in ranks.items() if not s.sparse}  # a bare span's shares support no finding
    mech = mechanisms(run, ranks, steps)
    waiting = peer_wait(ranks, run.device, mech)
    candidates = [
        ddp_allreduce_exposed(run, ranks, steps, peer_finding=waiting is not None and waiting.id == "peer-wait"),
        tp_config_rejected(run), tp_not_applied(run),
        fsdp_gathers_model(run, steps, ranks) if _fsdp_run(run) else zero3_gathers_model(steps, run.ranks, ranks,
                                                                                          run.world_size),
        communication_bound(ranks, run.device, mech), waiting, host_bound(ranks, run.device, mech),
        step_time_shift(run), window_not_representative(run, steps),
    ]
    return [f for f in candidates if f is not None]
