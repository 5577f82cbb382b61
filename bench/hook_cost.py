"""What dstrace's ZeRO-3 hooks cost the host per call, and so per decode step, with nothing else in the way.

The end-to-end overhead benchmark (`record_overhead.py`) compares whole runs, and on a host-bound
ZeRO-3 decode the run-to-run spread is wider than the 3% to resolve. The hooks are the only code
annotate mode (and full mode outside its window) adds to a step: a wrapper around each of ZeRO-3's
`fetch_sub_module`, `release_sub_module` and `__all_gather_params`, which counts, sizes the gather and
opens a range only if something records it (an NVTX tool, or the profiler window); plus the step hooks,
once per forward. Their cost times how often a step calls them bounds what dstrace adds to a step,
whatever the noise; in place they cost several times more (`hooks_ab.py` measures that).

The wrappers are dstrace's own (`hooks.patch_param_coordinator`, under a real recording session)
around a coordinator whose three methods do nothing; timed against the same coordinator unwrapped,
alternating, `--repeats` times `--calls` calls each. Calls per step default to what the H200 ZeRO-3 run
recorded (`traces/h200-zero3-ds0.19.8/rank0.manifest.json`: 5929 fetches and releases and 4085
all-gathers over 16 forwards).

    python bench/hook_cost.py --json /tmp/hook_cost.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


class Coordinator:
    """The three methods dstrace wraps, doing nothing: what is left to time is the wrappers."""

    def fetch_sub_module(self, submodule, forward=True):
        return None

    def release_sub_module(self, submodule, forward=True):
        return None

    def _PartitionedParameterCoordinator__all_gather_params(self, params, forward, quantize):
        return None


class Status:
    NOT_AVAILABLE = "NOT_AVAILABLE"


class Param:
    """What the gather wrapper reads of a ZeRO-3 parameter to size the gather."""

    def __init__(self, numel: int):
        self.ds_numel = numel
        self.ds_status = Status.NOT_AVAILABLE

    def element_size(self) -> int:
        return 2


class Layer:
    ds_id = 12


def per_call_ns(fn, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--fetches-per-step", type=float, default=5929 / 16)
    ap.add_argument("--gathers-per-step", type=float, default=4085 / 16)
    ap.add_argument("--step-ms", type=float, default=235.5,
                    help="the step time to compare with (default: the H200 decode step with the hooks off, "
                         "median of analysis/overhead-h200x2-inprocess/hooks-ab-*-2.jsonl, bench/hooks_ab.py)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    from dstrace.recording import hooks, ranges, session
    from dstrace.recording.window import WindowOptions

    run_dir = tempfile.mkdtemp(prefix="dstrace-hook-cost-")
    os.environ.update({session.ENV_RUN_DIR: run_dir, session.ENV_RUN_ID: "hook-cost",
                       session.ENV_WINDOW: WindowOptions(mode="annotate").to_env()})
    if session.get() is None:
        raise SystemExit("no dstrace session could be started")

    class Hooked(Coordinator):
        pass

    hooks.patch_param_coordinator(types.SimpleNamespace(PartitionedParameterCoordinator=Hooked, ZeroParamStatus=Status))
    bare, hooked, layer = Coordinator(), Hooked(), Layer()
    params = [Param(1536 * 1536) for _ in range(4)]
    gather = "_PartitionedParameterCoordinator__all_gather_params"
    s = session.get()
    s.begin_call("generate", layer)

    def step() -> None:
        s.step_end(s.step_begin())

    cases = {
        "step": (lambda: None, step),
        "fetch": (lambda: bare.fetch_sub_module(layer), lambda: hooked.fetch_sub_module(layer)),
        "release": (lambda: bare.release_sub_module(layer), lambda: hooked.release_sub_module(layer)),
        "all-gather": (lambda: getattr(bare, gather)(params, True, False),
                       lambda: getattr(hooked, gather)(params, True, False)),
    }
    added: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(args.repeats):
        for name, (without, with_hooks) in cases.items():
            pair = [without, with_hooks] if i % 2 == 0 else [with_hooks, without]
            times = {id(fn): per_call_ns(fn, args.calls) for fn in pair}
            added[name].append(times[id(with_hooks)] - times[id(without)])
    per_call_us = {name: statistics.median(v) / 1e3 for name, v in added.items()}
    spread_us = {name: (min(v) / 1e3, max(v) / 1e3) for name, v in added.items()}
    per_step_ms = (per_call_us["step"] + args.fetches_per_step * (per_call_us["fetch"] + per_call_us["release"])
                   + args.gathers_per_step * per_call_us["all-gather"]) / 1e3
    out = {"machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
                      f"Python {platform.python_version()}",
           "nvtx": ranges.nvtx_available(), "ranges_opened": ranges.active, "calls": args.calls, "repeats": args.repeats,
           "added_us_per_call": per_call_us, "added_us_per_call_min_max": spread_us,
           "fetches_per_step": args.fetches_per_step, "gathers_per_step": args.gathers_per_step,
           "added_ms_per_step": per_step_ms, "step_ms": args.step_ms,
           "added_share_of_step": per_step_ms / args.step_ms}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    listening = "an NVTX tool listens: ranges opened" if ranges.active else "no NVTX tool: no ranges outside the window"
    print(f"nvtx {'importable' if out['nvtx'] else 'not importable'}, {listening}; {args.repeats} x {args.calls} calls")
    print("| hook | added us per call, median (min-max) | calls per step |")
    print("|---|---|---|")
    for name, us in per_call_us.items():
        lo, hi = spread_us[name]
        n = {"step": 1, "all-gather": args.gathers_per_step}.get(name, args.fetches_per_step)
        print(f"| {name} | {us:.2f} ({lo:.2f}-{hi:.2f}) | {n:.0f} |")
    print(f"\nadded per decode step: {per_step_ms:.2f} ms = {100 * out['added_share_of_step']:.2f}% of a "
          f"{args.step_ms:.1f} ms step")


if __name__ == "__main__":
    main()
