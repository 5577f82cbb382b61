"""Multi-rank twins of public single-rank traces, for the 8-rank cases whose own files the mirrors lack.

HTA's `vision_transformer` (8 ranks) and TraceLens's `mi300/llama_70b_fsdp` (8 ranks) are listed in their
repositories but their blobs are not in the mirrors this project reads, so no cut of them can be made. What
the corpus keeps instead is a cut of a real rank of an 8-rank (or larger) job, copied to 8 ranks with one rank
arriving late to every collective: the same kernels, names and args as the source, only the timing of one
rank changed, by a rule written here. The builder is deterministic (no randomness, gzip mtime 0).

  python -m tests.corpus.make_twins OUT   (from the checkout) writes OUT/<twin>/rank<r>.json.gz for every twin
"""
from __future__ import annotations

import copy
import gzip
import json
import os
import re
import sys
from dataclasses import dataclass

from tests.fixtures.paths import CORPUS

NCCL = re.compile(r"^nccl(?:Dev)?Kernel_")
DROPPED_CATEGORIES = frozenset({"python_function", "ac2g", "cpu_instant_event"})
"""Left out of the cut to keep it small: Python stack events, flow arrows and instants carry no device time."""


@dataclass(frozen=True)
class Twin:
    """A source trace (path under data/), how many ranks to make, which one is late and by what share of each
    collective kernel it arrives late (its kernel starts that share of the source kernel's duration later and
    ends at the same time; the others keep the source timing, so they wait for it)."""
    name: str
    source: str
    world: int
    late_rank: int
    late_share: float
    kernel: re.Pattern


TWINS = (
    Twin("hta_allreduce_2ranks", "hta/tests/data/nccl_parser_config/nccl_data.json.gz",
         world=2, late_rank=1, late_share=0.6, kernel=re.compile(r"^ncclKernel_(?:AllReduce|Broadcast)")),
    Twin("mi300_resnet_generic_8ranks", "tracelens/tests/traces/mi300/resnet_act_checkpoint.json.gz",
         world=8, late_rank=5, late_share=0.6, kernel=re.compile(r"^ncclDevKernel_Generic")),
    Twin("hta_all_to_all_8ranks", "hta/tests/data/trace_filter/sampled_rank-0.json.gz",
         world=8, late_rank=3, late_share=0.6, kernel=re.compile(r"^ncclKernel_SendRecv")),
)


def load(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def cut(trace: dict) -> dict:
    """The source without the event categories that only add size."""
    out = dict(trace)
    out["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") not in DROPPED_CATEGORIES]
    return out


def rank_trace(base: dict, twin: Twin, rank: int) -> dict:
    """`base` as rank `rank` of the twin: distributedInfo says so, and the late rank's collective kernels start
    `late_share` of their duration later."""
    trace = copy.deepcopy(base)
    info = dict(trace.get("distributedInfo") or {})
    info.update(rank=rank, world_size=twin.world)
    info.pop("pg_config", None)
    trace["distributedInfo"] = info
    if rank == twin.late_rank:
        for e in trace["traceEvents"]:
            if e.get("cat") == "kernel" and twin.kernel.match(e.get("name", "")) and e.get("dur"):
                shift = twin.late_share * e["dur"]
                e["ts"] += shift
                e["dur"] -= shift
    return trace


def build(twin: Twin, out_dir: str) -> list[str]:
    """Write the twin's rank files into out_dir/<name>/; returns their paths."""
    base = cut(load(os.path.join(CORPUS, twin.source)))
    folder = os.path.join(out_dir, twin.name)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for rank in range(twin.world):
        path = os.path.join(folder, f"rank{rank}.json.gz")
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as f:
            f.write(json.dumps(rank_trace(base, twin, rank), separators=(",", ":")).encode())
        paths.append(path)
    return paths


if __name__ == "__main__":
    for t in TWINS:
        print("\n".join(build(t, sys.argv[1])))
