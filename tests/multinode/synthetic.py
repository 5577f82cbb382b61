"""A synthetic run of many ranks as rank summaries: known clock offsets per host, one late rank.

The shape of a ZeRO-3 + tensor-parallel decode: every layer of every step all-gathers its weights
over the world and all-reduces twice within its node's tensor-parallel group. Each host's clock is
off by a known amount; one rank arrives late to every world collective.
"""
from __future__ import annotations

import os
import random

import pandas as pd

from dstrace.analysis import collectives, reduction
from dstrace.analysis.summaries import summary_path, write_summary
from dstrace.runfolder.names import manifest_path
from dstrace.runfolder.records import MANIFEST_SCHEMA, Manifest, to_json, write_json_atomic

RANKS_PER_HOST = 8
STEP_US = 50_000.0
LATE_US = 300.0
TRANSFER_US = 80.0


def host_offset_us(host: int) -> float:
    return 0.0 if host == 0 else 1_000_000.0 * host + 137.0 * host


def write_run(out_dir: str, world: int = 256, steps: int = 3, layers: int = 40, late_rank: int = 77,
              run_id: str = "synthetic", seed: int = 0) -> dict[int, float]:
    """Write `world` summaries and manifests; return each rank's true clock offset (us)."""
    rng = random.Random(seed)
    offsets = {}
    groups = {"world": list(range(world))}
    for h in range(world // RANKS_PER_HOST):
        groups[f"tp{h}"] = list(range(h * RANKS_PER_HOST, (h + 1) * RANKS_PER_HOST))
    # the shared timeline: start of each collective on each rank, common end per collective
    timeline = []  # (step, group, kind, starts by rank, end)
    for step in range(2, 2 + steps):
        t = step * STEP_US
        for _ in range(layers):
            starts = {r: t + rng.uniform(0, 20) + (LATE_US if r == late_rank else 0.0) for r in range(world)}
            timeline.append((step, "world", "AllGather", starts, max(starts.values()) + TRANSFER_US))
            t = max(starts.values()) + TRANSFER_US + 30.0
            for kind_rep in range(2):
                for h in range(world // RANKS_PER_HOST):
                    members = groups[f"tp{h}"]
                    st = {r: t + rng.uniform(0, 10) for r in members}
                    timeline.append((step, f"tp{h}", "AllReduce", st, max(st.values()) + 20.0))
                t += 60.0
    for rank in range(world):
        host = rank // RANKS_PER_HOST
        off = host_offset_us(host)
        offsets[rank] = off
        rows = []
        for step, group, kind, starts, end in timeline:
            if rank not in starts:
                continue
            ts = starts[rank] + off
            e = end + off + rng.uniform(-2, 2)
            n = len(groups[group])
            size = 4 << 20 if kind == "AllGather" else 1 << 16
            rows.append([kind, kind, ts, e - ts, e, ts - 5.0, size // n if kind == "AllGather" else size, size,
                         float(n), group, str(groups[group]), "nccl kernel", None, None])
        steps_frame = pd.DataFrame([("dstrace/step ranges", s, s * STEP_US + off - 100.0, (s + 1) * STEP_US + off - 200.0,
                                     STEP_US / 1e3) for s in range(2, 2 + steps)], columns=reduction.STEP_COLUMNS)
        reduced = reduction.RankReduction(
            has_gpu=True, collectives=pd.DataFrame(rows, columns=collectives.RANK_COLUMNS), steps=steps_frame,
            gathers=pd.DataFrame({"ts": steps_frame["ts"], "bytes": layers * (4 << 20)}, columns=reduction.GATHER_COLUMNS),
            utilization={"span_us": steps * STEP_US, "idle_us": 0.2 * steps * STEP_US,
                         "busy_us": {"compute": 0.5 * steps * STEP_US, "communication": 0.3 * steps * STEP_US,
                                     "memory": 0.0},
                         "exposed_comm_us": 0.25 * steps * STEP_US})
        write_summary(summary_path(out_dir, rank), reduced, rank, world, f"node{host:03d}", run_id,
                      f"node{host:03d}_rank{rank}.1.pt.trace.json.gz", None)
        manifest = Manifest(schema=MANIFEST_SCHEMA, run_id=run_id, status="complete", rank=rank,
                            local_rank=rank % RANKS_PER_HOST, world_size=world, host=f"node{host:03d}", pid=1000 + rank,
                            started=0.0, ended=1.0)
        write_json_atomic(manifest_path(out_dir, rank), to_json(manifest))
    return offsets


if __name__ == "__main__":
    import sys

    os.makedirs(sys.argv[1], exist_ok=True)
    write_run(sys.argv[1])
