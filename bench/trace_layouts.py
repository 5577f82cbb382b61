"""Peak memory of `dstrace analyze` per trace layout (issue #27): what one trace of N MB of JSON costs when
laid out as Kineto writes it, on one line, as very many tiny events, with huge args, or with long names.

    python bench/trace_layouts.py --mb 200 [--layouts kineto,minified,tiny,huge-args,long-names]

Each layout is written once to a temporary folder (one rank, gzip level 1), then analyzed from scratch
(no caches) under /usr/bin/time -v; the peak is the largest process's RSS, and the sum over the process
tree sampled every 100 ms (the helper process shares the decode). Prints one line per layout: JSON MB,
peak MB, peak / JSON.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD = ('{\n  "schemaVersion": 1,\n  "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1},\n'
        '  "traceEvents": [\n')


def _event(i: int, layout: str) -> dict:
    if layout == "tiny":
        return {"ph": "X", "ts": i, "dur": 1}
    name = f"aten::op_{i:012d}_" + "x" * 200 if layout == "long-names" else f"aten::op{i % 50}"
    args = {"External id": i, "Input Dims": [[4096, 4096]], "Record function id": i}
    if layout == "huge-args":
        args["Concrete Inputs"] = [os.urandom(1000).hex()]  # incompressible: not refused for inflating
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 4242, "tid": 4242, "ts": 1.0e12 + i * 2.0,
            "dur": 1.5, "args": args}


def write_trace(path: str, layout: str, mb: int) -> int:
    """A trace of about `mb` MB of JSON; Kineto's layout (`  {` ... `  },` per event) unless `minified`."""
    want, size, i = mb * 1_000_000, 0, 0
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(HEAD.encode())
        while size < want:
            block = []
            for _ in range(10_000):
                event = _event(i, "kineto" if layout == "minified" else layout)
                text = json.dumps(event, separators=(",", ":")) if layout == "minified" else \
                    "  " + json.dumps(event, indent=None).replace("{", "{\n    ", 1)[:-1] + "\n  }"
                block.append(text)
                i += 1
            piece = (",\n" if size else "") + ",\n".join(block)
            f.write(piece.encode())
            size += len(piece)
        f.write(b"\n  ]\n}\n")
    return size + len(HEAD) + 6


def peak_of(cmd: list[str]) -> tuple[int, int, float]:
    """(largest single process RSS, largest sum over the process tree) in bytes, and the wall time."""
    proc = psutil.Popen(["/usr/bin/time", "-v", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tree_peak = [0]

    def sample():
        while proc.poll() is None:
            try:
                procs = [proc] + proc.children(recursive=True)
                tree_peak[0] = max(tree_peak[0], sum(p.memory_info().rss for p in procs if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    t.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    t.join()
    single = next(int(line.split()[-1]) * 1024 for line in err.decode().splitlines() if "Maximum resident" in line)
    if proc.returncode != 0:
        print(err.decode()[-1500:], file=sys.stderr)
    return single, tree_peak[0], wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--layouts", default="kineto,minified,tiny,huge-args,long-names")
    args = ap.parse_args()
    for layout in args.layouts.split(","):
        folder = tempfile.mkdtemp(prefix=f"dstrace-layout-{layout}-")
        path = os.path.join(folder, "host_rank0.1.pt.trace.json.gz")
        size = write_trace(path, layout, args.mb)
        out = os.path.join(folder, "report.json")
        single, tree, wall = peak_of([sys.executable, "-m", "dstrace.cli", "analyze", folder, "--format", "json",
                                      "-o", out])
        print(f"{layout}: {size / 1e6:.0f} MB of JSON, peak {single / 1e6:.0f} MB (largest process), "
              f"{tree / 1e6:.0f} MB (process tree), {tree / size:.2f}x the JSON, {wall:.1f} s", flush=True)
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


if __name__ == "__main__":
    main()
