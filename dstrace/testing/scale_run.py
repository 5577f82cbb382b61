"""A synthetic run of many ranks as kept reductions (no traces): known clock offsets per host, one late rank.

The shape of a ZeRO-3 + tensor-parallel decode: every layer of every step all-gathers its weights
over the world and all-reduces twice within its node's tensor-parallel group. Each host's clock is
off by a known amount; one rank arrives late to every world collective. The timeline is drawn for all
ranks at once (numpy), so 10,000 ranks take seconds to draw and the time goes to writing the files.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

from dstrace.analysis import rank_collectives, reduction
from dstrace.analysis.kept import FORMAT, KeptReduction
from dstrace.runfolder.names import manifest_path, reduction_name
from dstrace.runfolder.records import MANIFEST_SCHEMA, Manifest, to_json, write_json_atomic

RANKS_PER_HOST = 8
STEP_US = 50_000.0
LATE_US = 300.0
TRANSFER_US = 80.0
AG_BYTES = 4 << 20
AR_BYTES = 1 << 16


def host_offset_us(host: int) -> float:
    return 0.0 if host == 0 else 1_000_000.0 * host + 137.0 * host


def _timeline(world: int, steps: int, layers: int, late_rank: int, rng: np.random.Generator):
    """True-clock starts per (call, rank) and ends per (call, rank's group), in each rank's call order: per
    step and layer one world AllGather, then two AllReduces in each host's group."""
    hosts = world // RANKS_PER_HOST
    host_of = np.minimum(np.arange(world) // RANKS_PER_HOST, max(hosts - 1, 0))
    in_tp = np.arange(world) < hosts * RANKS_PER_HOST  # ranks past the last full host have no tp group
    calls = steps * layers * 3
    starts = np.empty((calls, world))
    ends = np.empty((calls, world))
    kinds = []
    late = np.zeros(world)
    if 0 <= late_rank < world:
        late[late_rank] = LATE_US
    c = 0
    for step in range(2, 2 + steps):
        t = step * STEP_US
        for _ in range(layers):
            st = t + rng.uniform(0, 20, world) + late
            starts[c], ends[c] = st, st.max() + TRANSFER_US
            kinds.append("AllGather")
            t = st.max() + TRANSFER_US + 30.0
            c += 1
            for _ in range(2):
                st = t + rng.uniform(0, 10, world)
                last = np.full(hosts, -np.inf)
                np.maximum.at(last, host_of[in_tp], st[in_tp])
                starts[c], ends[c] = st, np.where(in_tp, last[host_of] + 20.0, np.nan)
                kinds.append("AllReduce")
                t += 60.0
                c += 1
    return starts, ends, kinds, in_tp


def write_run(out_dir: str, world: int = 256, steps: int = 3, layers: int = 40, late_rank: int = 77,
              run_id: str = "synthetic", seed: int = 0, ranks=None) -> dict[int, float]:
    """Write `world` kept reductions and manifests (of `ranks` only, when given: the same run, written by several
    processes); return each rank's true clock offset (us)."""
    rng = np.random.default_rng(seed)
    starts, ends, kinds, in_tp = _timeline(world, steps, layers, late_rank, rng)
    jitter = rng.uniform(-2, 2, starts.shape)
    world_text = str(list(range(world)))
    kind = np.array(kinds)
    offsets = {}
    for rank in range(world) if ranks is None else ranks:
        host = rank // RANKS_PER_HOST
        off = offsets[rank] = host_offset_us(host)
        keep = (kind == "AllGather") | bool(in_tp[rank])
        k = kind[keep]
        ts = starts[keep, rank] + off
        end = ends[keep, rank] + off + jitter[keep, rank]
        ag = k == "AllGather"
        tp = list(range(host * RANKS_PER_HOST, (host + 1) * RANKS_PER_HOST))
        n = np.where(ag, world, RANKS_PER_HOST).astype(float)
        frame = pd.DataFrame({
            "kind": k, "name": k, "ts": ts, "dur": end - ts, "end": end, "host_ts": ts - 5.0,
            "in_bytes": np.where(ag, AG_BYTES // world, AR_BYTES), "out_bytes": np.where(ag, AG_BYTES, AR_BYTES),
            "group_size": n, "pg_name": np.where(ag, "world", f"tp{host}"),
            "pg_ranks": np.where(ag, np.array(world_text, dtype=object), str(tp)), "source": "nccl kernel", "p2p_role": None,
            "p2p_peer": None}, columns=rank_collectives.RANK_COLUMNS)
        steps_frame = pd.DataFrame([("dstrace/step ranges", s, s * STEP_US + off - 100.0,
                                     (s + 1) * STEP_US + off - 200.0, STEP_US / 1e3)
                                    for s in range(2, 2 + steps)], columns=reduction.STEP_COLUMNS)
        reduced = reduction.RankReduction(
            has_gpu=True, collectives=frame, steps=steps_frame,
            gathers=pd.DataFrame({"ts": steps_frame["ts"], "bytes": layers * AG_BYTES},
                                 columns=reduction.GATHER_COLUMNS),
            utilization={"span_us": steps * STEP_US, "idle_us": 0.2 * steps * STEP_US,
                         "busy_us": {"compute": 0.5 * steps * STEP_US, "communication": 0.3 * steps * STEP_US,
                                     "memory": 0.0},
                         "exposed_comm_us": 0.25 * steps * STEP_US})
        trace = f"node{host:03d}_rank{rank}.1.pt.trace.json.gz"  # not written: the run is its reductions
        meta = {"host_name": f"node{host:03d}", "dstrace": {"rank": rank, "world_size": world, "run_id": run_id}}
        KeptReduction(reduced, meta, trace, {"made_by": "dstrace.testing.scale_run", "format": FORMAT}).save(
            os.path.join(out_dir, reduction_name(trace)))
        manifest = Manifest(schema=MANIFEST_SCHEMA, run_id=run_id, status="complete", rank=rank,
                            local_rank=rank % RANKS_PER_HOST, world_size=world, host=f"node{host:03d}", pid=1000 + rank,
                            started=0.0, ended=1.0)
        write_json_atomic(manifest_path(out_dir, rank), to_json(manifest))
    return offsets
