"""How long `dstrace analyze` takes on a run of many ranks read from their summaries (issue #8: 256 ranks
in under a minute). The run is the one tests/multinode/test_scale.py checks for correctness: 256 ranks on
32 hosts, 360 collectives each, clocks off by a known offset per host, one late rank.

    python bench/summaries_scale.py --world 256 --repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from tests.multinode import synthetic

    folder = tempfile.mkdtemp(prefix="dstrace-scale-")
    synthetic.write_run(folder, world=args.world, late_rank=min(77, args.world - 1))
    walls = []
    report = os.path.join(tempfile.mkdtemp(prefix="dstrace-scale-report-"), "report.json")  # a file, never a device
    for _ in range(args.repeats):
        for kept in os.listdir(folder):
            if kept.startswith(".dstrace-report."):
                os.unlink(os.path.join(folder, kept))  # time the analysis, not the kept report
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dstrace.cli", "analyze", folder, "--format", "json", "-o", report],
                       check=True, capture_output=True, cwd=REPO)
        walls.append(time.perf_counter() - t0)
    print(f"{args.world} ranks from summaries: median {statistics.median(walls):.2f} s "
          f"(min {min(walls):.2f}, max {max(walls):.2f}, {args.repeats} runs)")


if __name__ == "__main__":
    main()
