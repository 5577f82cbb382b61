"""What looking for keys given twice inside events costs next to the decode, per piece of a trace in Kineto's
layout (tracefile cuts the event array into ~8 MB pieces): the piece's decode into columns (msgspec and
`_Builder.add`), `_event_keys_twice` on it, and for scale `bytes.count` of two keys (what the check did
before it looked at every key the decoder reads). Interleaved, CPU time of this process, min and median.
Not a timed test: the machine's other load moves the medians, the minimums less.

    python bench/synthetic_traces.py /tmp/dsb/synth1 --ranks 1 --mb 100
    python bench/duplicate_keys.py /tmp/dsb/synth1/synth_rank0.1800000000000.pt.trace.json.gz --rounds 40
"""
from __future__ import annotations

import argparse
import gzip
import statistics
import time

from dstrace.analysis import tracefile


def first_piece(path: str) -> bytes:
    """The event array's first piece as `_read_pieces` decodes it: `[` to its last event, made a `]`."""
    text = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    opener = text.find(b"[", text.find(tracefile.ARRAY_KEY))
    cut = text.rfind(tracefile.EVENT_SEPARATOR, opener, opener + tracefile.CHUNK_BYTES)
    if cut < 0:
        raise SystemExit(f"{path}: not in Kineto's layout (no event boundary in its first {tracefile.CHUNK_BYTES} bytes)")
    return text[opener:cut + 4] + b"]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    piece = first_piece(args.trace)
    events = len(tracefile.EVENTS.decode(piece))

    def decode():
        tracefile._Builder().add(tracefile.EVENTS.decode(piece))

    def keys_twice():
        tracefile._event_keys_twice(piece, events)

    def count_two_keys():
        [piece.count(key) for key in (b'"ts":', b'"dur":')]

    cases = {"decode": decode, "_event_keys_twice": keys_twice, "bytes.count x2": count_two_keys}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, run in cases.items():
            t = time.process_time()
            run()
            times[name].append(time.process_time() - t)
    print(f"piece: {len(piece) / 1e6:.1f} MB, {events} events; {args.rounds} rounds, CPU ms")
    for name, values in times.items():
        print(f"{name:18s} min {min(values) * 1e3:6.1f}  median {statistics.median(values) * 1e3:6.1f}")


if __name__ == "__main__":
    main()
