"""What `dstrace record` costs the job: ms per decode step with and without it, side by side in one session.

Runs the workload plain, under `dstrace record --mode annotate`, and under `dstrace record` (full: the
profiler over the default window, steps 2-4 of call 1), in alternating order (forward, then reversed),
`--repeats` times each. The workload must print JSON lines with `call` and `ms_per_token` (as
launch/zero3_chat.py does); it is run with two chat() calls so that call 2 lies wholly outside the window.

Ratios (median over repeats, with min-max), each against a measurement of the same thing:
  annotate / plain           ms_per_token of every call, annotate runs over plain runs
  full outside the window    ms_per_token of call 2 (no profiler at all), full over plain
  full, window call          ms_per_token of call 1 (holds the window; the trace is written after it returns)
  in-window steps            manifests' step_ms of window.recorded_steps, full over annotate (same steps)

On the GPU machine (python3 3.12, no network; DeepSpeed, HTA, nvtx... installed from the carried wheels):
    python3 bench/record_overhead.py --repeats 5 --out /tmp/overhead
On CPU, as a smoke test only (CPU numbers say nothing about GPU overhead):
    DS_ACCELERATOR=cpu python bench/record_overhead.py --repeats 1 --out /tmp/overhead \\
        --launcher "torchrun --standalone --nproc_per_node 2" --workload-args "--size tiny --max-new-tokens 8"

Each run is appended to OUT/runs.jsonl as soon as it ends, so a session stopped by a time limit keeps
every finished run; `--first-repeat` continues the numbering in a later session, and `--summarize
RUNS.jsonl...` turns the runs of one or more sessions into OUT/overhead.json (every run's numbers) and
OUT/overhead.md (the table), as a complete session does at its end.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("plain", "annotate", "full")


RESULT_LINE = re.compile(r'\{[^{}]*"ms_per_token"[^{}]*\}')


def workload_lines(stdout: str) -> list[dict]:
    """The workload's JSON results, also when two ranks' lines ran together on the shared stdout."""
    out = []
    for m in RESULT_LINE.finditer(stdout):
        try:
            out.append(json.loads(m.group(0)))
        except json.JSONDecodeError:
            continue
    return out


def manifest_steps(run_dir: str) -> list[dict]:
    """Per rank and call: decode step times (step 0, the prefill, left out) and which steps were profiled."""
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "rank*.manifest.json"))):
        with open(path) as f:
            m = json.load(f)
        window = m.get("window") or {}
        for call in m.get("calls", []):
            in_window = set(window.get("recorded_steps") or []) if call.get("index") == window.get("call") else set()
            steps = list(enumerate(call.get("step_ms") or []))[1:]
            out.append({"rank": m.get("rank"), "call": call.get("index"),
                        "window_ms": [ms for s, ms in steps if s in in_window],
                        "window_steps": sorted(in_window),
                        "other_ms": [ms for s, ms in steps if s not in in_window]})
    return out


def run_once(mode: str, args, out_dir: str, repeat: int) -> dict:
    workload = shlex.split(args.launcher) + [args.script] + shlex.split(args.workload_args) + ["--repeats", "2"]
    run_dir = os.path.join(out_dir, f"{mode}-{repeat}")
    dstrace = shlex.split(args.dstrace)
    if mode == "plain":
        cmd = workload
    elif mode == "annotate":
        cmd = dstrace + ["record", "--mode", "annotate", "-o", run_dir, "--force", "--"] + workload
    else:
        cmd = dstrace + ["record", "-o", run_dir, "--force", "--"] + workload
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    lines = workload_lines(proc.stdout)
    if not lines:
        raise SystemExit(f"{mode} run printed no ms_per_token lines: {' '.join(cmd)}\n{proc.stdout[-2000:]}")
    return {"mode": mode, "repeat": repeat, "wall_s": wall, "lines": lines,
            "steps": manifest_steps(run_dir) if mode != "plain" else []}


def median_of(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ratios(runs: list[dict]) -> dict:
    """Per repeat, each ratio of medians; then median and range over repeats."""
    per_repeat: dict[str, list[float]] = {"annotate / plain": [], "full outside the window (call 2)": [],
                                          "full, window call (call 1)": [], "in-window steps, full / annotate": []}
    by = {(r["mode"], r["repeat"]): r for r in runs}
    for repeat in sorted({r["repeat"] for r in runs}):
        plain, ann, full = (by.get((m, repeat)) for m in MODES)

        def tokens(run, call=None):
            return median_of([ln["ms_per_token"] for ln in run["lines"] if call is None or ln.get("call") == call])

        def add(name, a, b):
            if a and b:
                per_repeat[name].append(a / b)

        if plain and ann:
            add("annotate / plain", tokens(ann), tokens(plain))
        if plain and full:
            add("full outside the window (call 2)", tokens(full, 2), tokens(plain, 2))
            add("full, window call (call 1)", tokens(full, 1), tokens(plain, 1))
        if ann and full:
            window = [s for s in full["steps"] if s["window_ms"]]
            steps = {st for s in window for st in s["window_steps"]}
            full_ms = median_of([ms for s in window for ms in s["window_ms"]])
            ann_ms = []
            for s in ann["steps"]:
                if s["call"] in {w["call"] for w in window}:
                    all_ms = [None] + s["other_ms"]  # annotate records no window: other_ms are steps 1..n
                    ann_ms += [all_ms[i] for i in steps if i < len(all_ms) and all_ms[i] is not None]
            add("in-window steps, full / annotate", full_ms, median_of(ann_ms))
    return {k: described(v) for k, v in per_repeat.items()}


def interval90(values: list[float], draws: int = 10_000) -> list[float]:
    """A bootstrap 90% interval of the median (seeded: the same runs give the same interval): how well the
    repeats pin the ratio down, which a min-max alone does not say."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return [medians[int(0.05 * draws)], medians[int(0.95 * draws) - 1]]


def described(values: list[float]) -> dict | None:
    """Median, min, max, count and the bootstrap 90% interval of the median; None for no values."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "interval90": interval90(values)}


def per_mode(runs: list[dict]) -> dict:
    """ms/token per mode and call over all runs: median, min-max and count, beside the paired ratios."""
    out = {}
    for mode in MODES:
        for call in (1, 2):
            values = [statistics.mean(ln["ms_per_token"] for ln in r["lines"] if ln.get("call") == call)
                      for r in runs if r["mode"] == mode and any(ln.get("call") == call for ln in r["lines"])]
            if values:
                out[f"{mode}, call {call}"] = {"median": median_of(values), "min": min(values),
                                               "max": max(values), "n": len(values)}
    return out


def summarize(runs: list[dict], command: dict, out_dir: str) -> str:
    """Write overhead.json and overhead.md from finished runs; return the table."""
    result = {"command": command, "ratios": ratios(runs), "ms_per_token": per_mode(runs), "runs": runs}
    with open(os.path.join(out_dir, "overhead.json"), "w") as f:
        json.dump(result, f, indent=2)
    rows = ["| ratio (paired within a repeat) | median | min-max | repeats | bootstrap 90% interval of the median |",
            "|---|---|---|---|---|"]
    for name, r in result["ratios"].items():
        rows.append(f"| {name} | {r['median']:.3f} | {r['min']:.3f}-{r['max']:.3f} | {r['n']} | "
                    f"{r['interval90'][0]:.3f}-{r['interval90'][1]:.3f} |" if r else f"| {name} | n/a | | 0 | |")
    rows += ["", "| mode, call | ms/token median | min-max | runs |", "|---|---|---|---|"]
    for name, r in result["ms_per_token"].items():
        rows.append(f"| {name} | {r['median']:.1f} | {r['min']:.1f}-{r['max']:.1f} | {r['n']} |")
    table = "\n".join(rows) + "\n"
    with open(os.path.join(out_dir, "overhead.md"), "w") as f:
        f.write(table)
    return table


def read_runs(paths: list[str]) -> list[dict]:
    runs = []
    for path in paths:
        with open(path) as f:
            runs += [json.loads(line) for line in f if line.strip()]
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--first-repeat", type=int, default=0, help="number the repeats from here (a later session)")
    ap.add_argument("--out", default="/tmp/dstrace-overhead")
    ap.add_argument("--launcher", default="deepspeed --num_gpus 2")
    ap.add_argument("--script", default="launch/zero3_chat.py")
    ap.add_argument("--workload-args", default="--size qwen2-1.5b --load config --max-new-tokens 64")
    ap.add_argument("--dstrace", default=f"{sys.executable} -m dstrace.cli")
    ap.add_argument("--summarize", nargs="+", metavar="RUNS_JSONL",
                    help="run nothing: summarize the runs.jsonl of earlier sessions into OUT")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    command = {k: getattr(args, k) for k in ("launcher", "script", "workload_args", "repeats", "first_repeat")}
    if args.summarize:
        print(summarize(read_runs(args.summarize), command, args.out))
        return
    runs = []
    for i in range(args.first_repeat, args.first_repeat + args.repeats):
        for mode in (MODES if i % 2 == 0 else MODES[::-1]):
            run = run_once(mode, args, args.out, i)
            runs.append(run)
            with open(os.path.join(args.out, "runs.jsonl"), "a") as f:
                f.write(json.dumps(run) + "\n")
            print(f"repeat {i + 1} {mode:8s}: ms/token by call "
                  f"{[round(ln['ms_per_token'], 2) for ln in run['lines']]}, wall {run['wall_s']:.1f} s",
                  file=sys.stderr, flush=True)
    print(summarize(runs, command, args.out))


if __name__ == "__main__":
    main()
