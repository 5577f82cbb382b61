"""Inflate every trace of a run folder and decode it with `orjson.loads` into Python objects, one after the
other, and nothing more: the reference time of issue #18 ("the first analysis takes at most 0.6x the time
of inflating a trace and decoding it with orjson.loads"). orjson is the fastest dict-building JSON parser
for Python; it is a benchmark dependency only (`pip install orjson`).

    python bench/json_floor.py /tmp/dsb/synth1
"""
from __future__ import annotations

import glob
import gzip
import os
import sys
import time

import orjson


def main(folder: str) -> None:
    t0 = time.perf_counter()
    inflate = decode = 0.0
    for path in sorted(glob.glob(os.path.join(folder, "*.pt.trace.json*"))):
        t = time.perf_counter()
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
            text = f.read()
        inflate += time.perf_counter() - t
        t = time.perf_counter()
        events = orjson.loads(text)
        decode += time.perf_counter() - t
        del events, text
    print(f"json floor: inflate {inflate:.2f} s, orjson.loads {decode:.2f} s, total {time.perf_counter() - t0:.2f} s",
          file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
