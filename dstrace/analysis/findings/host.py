"""Findings about the host: a GPU idle because its host had not launched the next kernel yet (`host-bound`), and
the notes on idle time spent in host calls that wait for the device."""
from __future__ import annotations

import re

from dstrace.analysis.findings.inputs import FindingInputs, Mechanisms, finding, items
from dstrace.analysis.results import Finding, RankReport
from dstrace.units import ms, percent

DOCS = {"host-bound": "docs/analysis-schema.md#findings"}
"""Where the finding of this module is explained at length (a path in the dstrace repository)."""

HOST_BOUND_IDLE_FRACTION = 0.30
"""An inference GPU idle for over ~30% of its span loses more than kernel tuning could win back."""

HOST_BOUND_HOST_WAIT_SHARE = 0.50
"""Call it host-bound only when most of that idle time comes before the launch call of the kernel that ends
each gap (`host.host_wait`: the next kernel was not launched yet), as opposed to waiting on synchronisation
or on other streams."""

HOST_BOUND_MOSTLY_SHARE = 0.5
"""Say the host was "mostly in X" only when X overlaps at least half of the GPU's idle time; otherwise
name the top three with their shares, so no single item is blamed for time it does not hold."""


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


def host_wait_share(host_time: dict) -> float | None:
    """Share of the GPU's own idle time (`host_during_idle`) spent waiting for the host to launch the next
    kernel; None when the rank has no idle time or its reduction holds no such measure."""
    idle, wait = host_time.get("gpu_idle_us"), host_time.get("host_wait_us")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (idle, wait)) or not idle > 0:
        return None
    return min(max(wait / idle, 0.0), 1.0)


def host_bound_ranks(inputs: FindingInputs) -> dict[int, tuple[RankReport, float]]:
    """The GPU ranks idle at least HOST_BOUND_IDLE_FRACTION of their span, mostly waiting for their host: rank ->
    (its summary, its host wait share)."""
    if inputs.device != "gpu":
        return {}
    hit = {}
    for r, s in inputs.ranks.items():
        share = host_wait_share(s.host_time)
        if s.span_us > 0 and share is not None and s.idle_us / s.span_us >= HOST_BOUND_IDLE_FRACTION \
                and share >= HOST_BOUND_HOST_WAIT_SHARE:
            hit[r] = (s, share)
    return hit


def _matching(found: dict[str, float], pattern: re.Pattern) -> dict[str, float]:
    return {k: v for k, v in found.items() if pattern.search(k)}


def idle_causes(host_time: dict, mech: Mechanisms) -> dict[str, tuple[float, list[str]]]:
    """Each mechanism the trace shows during the GPU's idle time: cause -> (GPU idle time it accounts for, what
    shows it). Nested items (an aten::item and its cudaStreamSynchronize) are not added up: the larger counts."""
    ops, calls = items(host_time, "top_cpu_ops"), items(host_time, "runtime_calls")
    user, ranges = items(host_time, "user_ranges"), items(host_time, "in_dstrace_ranges")
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

    first_named = {f"first {k} call ({ms(first_extra[k])} more than its later calls)": v
                   for k, v in first_idle.items()}
    add("one-time initialisation", _matching(calls, INIT_CALLS), first_named)
    add("graph capture", items(host_time, "graph_capture"))
    add("input pipeline", _matching(user, INPUT_PIPELINE), _matching(ops, INPUT_PIPELINE))
    add("blocking copy", _matching(calls, SYNC_CALLS), _matching(ops, SYNC_OPS))
    add("kernel launch overhead", _matching(calls, LAUNCH_CALLS))
    hooks = host_time.get("zero3_hooks_us")
    if mech.zero3 and isinstance(hooks, (int, float)) and not isinstance(hooks, bool):
        add("ZeRO-3 hooks", {"all": float(hooks)}, labels=[k for k in ranges if k.startswith("zero3.")])
    return out


BLOCKED_IDLE_SHARE = 0.5
"""Name the host calls that wait for the device when they overlap over half of a rank's GPU idle time."""


def blocking_call_notes(inputs: FindingInputs) -> list[str]:
    """Per GPU rank idle for a large share of its span whose idle time lies mostly inside host calls that wait
    for the device (SYNC_CALLS), where host-bound does not read it (the kernel that ends each gap was launched
    already): name those calls. The host waited in them for a GPU that ran nothing; what the GPU waited on is
    not in the events."""
    if inputs.device != "gpu":
        return []
    out = []
    for r, s in sorted(inputs.ranks.items()):
        idle, share = s.host_time.get("gpu_idle_us"), host_wait_share(s.host_time)
        if share is None or share >= HOST_BOUND_HOST_WAIT_SHARE or not s.span_us > 0 \
                or s.idle_us / s.span_us < HOST_BOUND_IDLE_FRACTION:
            continue
        calls = _matching(items(s.host_time, "runtime_calls"), SYNC_CALLS)
        if not calls:
            continue
        name, us = max(calls.items(), key=lambda kv: kv[1])
        if us >= BLOCKED_IDLE_SHARE * idle:
            out.append(f"rank {r}: {ms(us)} of the GPU's {ms(idle)} idle time overlaps host {name} "
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


def host_bound(inputs: FindingInputs) -> Finding | None:
    hit = host_bound_ranks(inputs)
    if not hit:
        return None
    mech = inputs.mechanisms
    evidence = {}
    for r, (s, share) in sorted(hit.items()):
        evidence[str(r)] = {"span_us": s.span_us, "gpu_idle_us": s.idle_us, "idle_fraction": s.idle_us / s.span_us,
                            "host_wait_us": s.host_time.get("host_wait_us"), "host_wait_share_of_idle": share,
                            "hta_idle_causes_summed_over_streams_us": s.hta.idle_causes_us,
                            "host_during_gpu_idle": s.host_time,
                            "causes_us": {k: v[0] for k, v in idle_causes(s.host_time, mech).items()}}
    order = sorted(hit, key=lambda r: (-hit[r][0].idle_us / hit[r][0].span_us, r))
    worst, (s0, share0) = order[0], hit[order[0]]
    others = "".join(f", {percent(hit[r][0].idle_us / hit[r][0].span_us)} on rank {r}" for r in order[1:])
    summary = (f"GPU idle {percent(s0.idle_us / s0.span_us)} of {ms(s0.span_us)} on rank {worst}{others}; "
               f"{percent(share0)} of rank {worst}'s GPU idle time is waiting for the host to launch the next kernel")
    where = items(s0.host_time, "in_dstrace_ranges") or items(s0.host_time, "top_cpu_ops")
    idle = s0.host_time.get("gpu_idle_us") or s0.idle_us
    top = list(where.items())[:3]
    if top and idle > 0:
        name, us = top[0]
        if us / idle >= HOST_BOUND_MOSTLY_SHARE:
            place = f"mostly in {name} ({ms(us)}, {percent(us / idle)} of its GPU idle time)"
        else:
            place = "in " + ", ".join(f"{n} {percent(u / idle)}" for n, u in top) + " of its GPU idle time"
        summary += f"; the host is {place}"
    else:
        place = ""
    causes = idle_causes(s0.host_time, mech)
    cause_name, (cause_us, shown) = max(causes.items(), key=lambda kv: kv[1][0], default=(None, (0.0, [])))
    names = " ".join(n for n, _ in top)
    if cause_name is None or not idle > 0 or cause_us / idle < HOST_BOUND_MOSTLY_SHARE:
        zero3 = causes.get("ZeRO-3 hooks") if "zero3." in names else None  # the largest host item: its hooks
        cause_name, (cause_us, shown) = ("ZeRO-3 hooks", zero3) if zero3 else (None, (0.0, []))
        shown = shown or ([f"{n} {percent(u / idle)}" for n, u in top] if idle > 0 else [])
    if cause_name is None and mech.decoding:
        cause = ("each decode step's kernels finish before the host has launched the next one, so the GPU waits for "
                 "the host" + (f"; on rank {worst} the host is {place}" if place else ""))
        remedy = ("cut per-kernel host overhead: more tokens per forward (batch prompts), CUDA graphs "
                  "(`torch.compile(mode=\"reduce-overhead\")`, a static KV cache)")
        remedy += _cudnn_note(names)
    else:
        what = (f"{cause_name} overlaps {percent(min(cause_us / idle, 1.0))} of its GPU idle time "
                f"({', '.join(shown[:3])})" if cause_name else "what the host does then is not identified")
        how = ("kernels launched while a stream captures a CUDA graph are recorded into it, not run, so the GPU "
               "waits until the capture ends" if cause_name == "graph capture" else
               "each kernel finishes before the host has launched the next one, so the GPU waits for the host")
        cause = f"{how}; on rank {worst} {what}" + (f"; the host is {place}" if place else "")
        remedy = _host_bound_remedy(cause_name, shown, mech, names, worst)
    return finding(DOCS, "host-bound", order, summary,
                   {"threshold_idle_fraction": HOST_BOUND_IDLE_FRACTION,
                    "threshold_host_wait_share": HOST_BOUND_HOST_WAIT_SHARE,
                    "threshold_mostly_share": HOST_BOUND_MOSTLY_SHARE, "worst_rank": worst, "ranks": evidence},
                   cause, remedy)

