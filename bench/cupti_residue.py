"""What a finished profiler window leaves behind in the process: host time per kernel launch before and
after dstrace's window, with and without `TEARDOWN_CUPTI=1`.

Full mode outside its window adds the ZeRO-3 hooks (`hooks_ab.py` measures them) and whatever the
profiler session left attached. Kineto keeps CUPTI's callbacks subscribed after a session unless
`TEARDOWN_CUPTI=1`, and each later kernel launch pays for them (pytorch/pytorch#144455; the 1.29x seen
in full mode outside the window before dstrace set the variable, docs/performance.md). Whole-run
comparisons cannot resolve a few percent on the H200 machine, and that state cannot be switched off and
on again inside one process; but the cost it adds is per launch, and a launch loop times steadily.

Each child process times `--launches` small kernel launches (`torch.add` on a 1-element CUDA tensor, one
synchronize at the end) `--repeats` times, runs dstrace's `ProfilerWindow` over a few launches (start,
stop, export, as a rank does), and times the launches again. Conditions, in alternating order over
`--rounds`, each in a fresh process: `control` (no window), `window` (TEARDOWN_CUPTI=1, as `dstrace
record` sets it), `window-no-teardown` (TEARDOWN_CUPTI=0). Reported: us per launch before and after,
and the after / before ratio per condition, whose median over processes against the control's is the
window's residue per launch. `--summarize` pools the processes of several calls' `--json` files.

    python3 bench/cupti_residue.py --rounds 3 --json /tmp/cupti.json
    python bench/cupti_residue.py --summarize cupti1.json cupti2.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CONDITIONS = {"control": None, "window": "1", "window-no-teardown": "0"}


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def launch_us(x, launches: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    sync()
    return (time.perf_counter() - t0) * 1e6 / launches


def child(condition: str, launches: int, repeats: int) -> dict:
    """One process: launches timed, the window (unless control), launches timed again."""
    import torch

    sys.path.insert(0, REPO)
    from dstrace.recording.window import ProfilerWindow, WindowOptions

    x = torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke test only
    launch_us(x, launches)  # warm-up: the allocator, the kernel's first load
    before = [launch_us(x, launches) for _ in range(repeats)]
    if condition != "control":
        window = ProfilerWindow(WindowOptions(mode="full", call=1, start=0, steps=2), lambda: {"bench": condition})
        for step in range(2):
            window.before_step(1, step)
            for _ in range(1000):
                x.add_(1)
            sync()
            window.after_step(1, step)
        with tempfile.TemporaryDirectory() as d:
            window.export(d, "bench")
    after = [launch_us(x, launches) for _ in range(repeats)]
    return {"condition": condition, "teardown_cupti": os.environ.get("TEARDOWN_CUPTI"), "before_us": before,
            "after_us": after, "ratio": statistics.median(after) / statistics.median(before)}


def run_child(condition: str, args) -> dict:
    env = dict(os.environ)
    env.pop("TEARDOWN_CUPTI", None)
    if CONDITIONS[condition] is not None:
        env["TEARDOWN_CUPTI"] = CONDITIONS[condition]
    cmd = [sys.executable, os.path.abspath(__file__), "--child", condition,
           "--launches", str(args.launches), "--repeats", str(args.repeats)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{condition} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def summarize(results: list[dict]) -> dict:
    """Per condition: the after / before ratios over processes (median, range, bootstrap 90% interval), the
    median us per launch before the window, and the median over the control's (what the window leaves
    behind per launch)."""
    from record_overhead import described

    out = {}
    for condition in CONDITIONS:
        mine = [r for r in results if r["condition"] == condition]
        if mine:
            out[condition] = {**described([r["ratio"] for r in mine]),
                              "before_us_median": statistics.median(u for r in mine for u in r["before_us"])}
    if "control" in out:
        for r in out.values():
            r["over control"] = r["median"] / out["control"]["median"]
    return out


def render(summary: dict) -> str:
    return "\n".join(
        f"{c:19s} after / before: median {r['median']:.4f} (min {r['min']:.4f}, max {r['max']:.4f}; bootstrap 90% "
        f"interval {r['interval90'][0]:.4f}-{r['interval90'][1]:.4f}; {r['n']} processes), over control "
        f"{r.get('over control', float('nan')):.4f}; {r['before_us_median']:.2f} us per launch before"
        for c, r in summary.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--child", choices=sorted(CONDITIONS), help=argparse.SUPPRESS)
    ap.add_argument("--summarize", nargs="+", metavar="JSON", help="run nothing: pool the processes of earlier --json files")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.launches, args.repeats)), flush=True)
        return
    results = []
    if args.summarize:
        for path in args.summarize:
            with open(path) as f:
                results += json.load(f)["processes"]
    names = list(CONDITIONS)
    for i in range(0 if args.summarize else args.rounds):
        for condition in (names if i % 2 == 0 else names[::-1]):
            r = run_child(condition, args)
            results.append(r)
            print(f"round {i + 1} {condition:19s} us per launch: before {statistics.median(r['before_us']):.2f}, "
                  f"after {statistics.median(r['after_us']):.2f}, after / before {r['ratio']:.4f}", flush=True)
    summary = summarize(results)
    print(render(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "summary": summary, "processes": results}, f, indent=2)


if __name__ == "__main__":
    main()
