"""HTA alone on a run folder: `TraceAnalysis` plus the breakdowns `dstrace analyze` reports (temporal, kernel
type, communication-computation overlap, idle time), as a user of HTA would run them. The baseline of
bench/analysis.py.

    python bench/hta_alone.py traces/h200-zero3-tp2-ds0.16.1
"""
from __future__ import annotations

import contextlib
import glob
import io
import logging
import os
import re
import sys
import time
import warnings


def main(folder: str) -> None:
    logging.getLogger("hta").setLevel(logging.CRITICAL + 1)
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        from hta.trace_analysis import TraceAnalysis

        # HTA would take every *.json / *.gz of the folder for a trace, dstrace's manifests too: name the traces
        paths = sorted(glob.glob(os.path.join(folder, "*.pt.trace.json*")))
        files = {int(re.search(r"rank(\d+)", os.path.basename(p)).group(1)): p for p in paths}
        analyzer = TraceAnalysis(trace_files=files, trace_dir=folder)
        t_parse = time.perf_counter()
        analyzer.get_temporal_breakdown(visualize=False)
        analyzer.get_gpu_kernel_breakdown(visualize=False, num_kernels=5, include_memory_kernels=True)
        analyzer.get_comm_comp_overlap(visualize=False)
        for rank in analyzer.t.get_ranks():
            analyzer.get_idle_time_breakdown(ranks=[rank], visualize=False)
    t1 = time.perf_counter()
    print(f"hta: parse {t_parse - t0:.2f} s, breakdowns {t1 - t_parse:.2f} s, total {t1 - t0:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
