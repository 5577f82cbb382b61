"""Where one trace's first analysis spends its time: each stage timed (wall) in one process, in the order
`dstrace analyze` runs them, the decode by one process and by two. Not a timed test: run it on a quiet machine.

    python bench/analysis_stages.py /tmp/dsb/synth1/synth_rank0.1800000000000.pt.trace.json.gz --repeats 3
"""
from __future__ import annotations

import argparse
import statistics
import time

T0 = time.perf_counter()
from dstrace.analysis import hta_breakdown, loading, parallel, reduction, tracefile  # noqa: E402
import dstrace.analysis.render  # noqa: E402,F401 - imported by every `dstrace analyze`

IMPORTS_S = time.perf_counter() - T0


def stages(path: str) -> dict[str, float]:
    out = {}

    def timed(name, fn):
        t = time.perf_counter()
        result = fn()
        out[name] = time.perf_counter() - t
        return result

    timed("decode, 1 process", lambda: tracefile.read_trace(path, 1))
    meta, columns = timed("decode, 2 processes", lambda: tracefile.read_trace(path, 2))
    timed("HTA breakdowns", lambda: hta_breakdown.rank_breakdowns(path, meta, columns).result())
    events = timed("events frame", lambda: loading.events_frame(columns))
    timed("reduction", lambda: reduction.reduce_rank(events, 1))
    with parallel.helpers(1) as helping:  # as `dstrace analyze` parses a trace alone
        timed("all of it with a helper (decode, HTA, reduction)",
              lambda: loading.decode_rank(path, 1, helper=helping[0] if helping else None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    runs = [stages(args.trace) for _ in range(args.repeats)]
    print(f"{'imports (dstrace, pandas, numpy, msgspec)':45s} {IMPORTS_S:6.2f} s (once)")
    for name in runs[0]:
        values = [r[name] for r in runs]
        print(f"{name:45s} {statistics.median(values):6.2f} s (median; {min(values):.2f}-{max(values):.2f})")
    print("The first run of HTA breakdowns includes importing HTA.")


if __name__ == "__main__":
    main()
