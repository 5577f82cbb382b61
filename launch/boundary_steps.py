"""What the profiler's own steps cost, from recorded run folders: per run, the window call's step times by kind
(`dstrace.analysis.step_kinds`: as recorded, or inferred for a run recorded before kinds were), each as a ratio
to the call's median unprofiled decode step, and what the window's recorded steps show against them.

    python launch/boundary_steps.py runs/old-* runs/new-*      # one line per run, then the medians per label
    python launch/boundary_steps.py --json out.json runs/*

A run's label is its folder name up to the last `-` (`old-1`, `old-2` -> `old`).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dstrace.analysis.step_kinds import BOUNDARY_KINDS, PROFILED, UNPROFILED, step_kinds  # noqa: E402
from dstrace.runfolder.records import read_manifest  # noqa: E402


def run_figures(folder: str) -> list[dict]:
    """One dict per rank with a window in a generation call."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "rank*.manifest.json"))):
        m = read_manifest(path)
        w = m.window
        call = next((c for c in m.calls if w and c.index == w.call and not c.error), None)
        if call is None or not w.recorded_steps:
            continue
        kinds = step_kinds(m, call)
        unprofiled = [ms for i, (ms, k) in enumerate(zip(call.step_ms, kinds)) if i > 0 and k == UNPROFILED]
        if not unprofiled:
            continue
        base = statistics.median(unprofiled)
        recorded = [call.step_ms[i] for i in w.recorded_steps if i < len(call.step_ms)]
        fig = {"run": folder, "rank": m.rank, "unprofiled_ms": base,
               "recorded_steps": list(w.recorded_steps), "recorded_ms": statistics.median(recorded),
               "recorded_ratio": statistics.median(recorded) / base,
               "profiled_ratio": (statistics.median(p) / base if (p := [ms for i, (ms, k) in
                                  enumerate(zip(call.step_ms, kinds)) if i > 0 and k == PROFILED]) else None)}
        for kind in BOUNDARY_KINDS:
            steps = [i for i, k in enumerate(kinds) if k == kind]
            fig[kind] = {"steps": steps, "ms": [call.step_ms[i] for i in steps],
                         "ratio": [call.step_ms[i] / base for i in steps]}
        out.append(fig)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+")
    p.add_argument("--json", default=None, help="write every figure to this file")
    args = p.parse_args()
    figures = [f for folder in args.folders for f in run_figures(folder)]
    for f in figures:
        start, stop = f["profiler-start"], f["profiler-stop"]
        print(f"{f['run']} rank {f['rank']}: unprofiled {f['unprofiled_ms']:.1f} ms; recorded steps "
              f"{f['recorded_steps']} {f['recorded_ratio']:.2f}x; start step {start['steps']} "
              f"{[round(r, 2) for r in start['ratio']]}x; stop step {stop['steps']} "
              f"{[round(r, 2) for r in stop['ratio']]}x")
    labels: dict[str, list[dict]] = {}
    for f in figures:
        labels.setdefault(os.path.basename(f["run"].rstrip("/")).rsplit("-", 1)[0], []).append(f)
    for label, fs in sorted(labels.items()):
        def med(values):
            values = [v for v in values if v is not None]
            return f"{statistics.median(values):.2f}x" if values else "-"
        print(f"{label}: {len(fs)} rank-runs; recorded steps {med(f['recorded_ratio'] for f in fs)} the unprofiled "
              f"median; profiled steps {med(f['profiled_ratio'] for f in fs)}; start step "
              f"{med(r for f in fs for r in f['profiler-start']['ratio'])}; stop step "
              f"{med(r for f in fs for r in f['profiler-stop']['ratio'])}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
