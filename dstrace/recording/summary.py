"""Each rank's trace reduced to what cross-rank analysis needs, written beside the trace at its export.

Hundreds of ranks mean hundreds of traces of tens to hundreds of MB; the cross-rank questions (who
waited for whom, whose clock is off, how long a step takes) need only each collective's kind, group,
times and bytes, the step ranges, and a few totals. A rank reduces its own trace once, inside the job,
so `dstrace analyze` reads kilobytes per rank. Collectives are named and sized by the rules of
`dstrace.trace_names`, which the pandas analysis uses too (tests hold the two to the same numbers); this
module uses the standard library only, since the job's environment may lack pandas.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import re
from dataclasses import dataclass

from dstrace.runfolder.names import SUMMARY_SUFFIX
from dstrace.trace_names import (ACCELERATOR_CATEGORIES, ALLGATHER_RANGE, C10D_OP, CPU_NON_COMPUTE, DSTRACE_STEP,
                                 GLOO_OP, GPU_CATEGORIES, HTA_COMM_KERNEL, HTA_MEMORY_KERNEL, LAUNCH_CATEGORIES,
                                 collective_kernel_kind, dtype_bytes, kind_of, numel, p2p_side,
                                 parse_ranks)

SUMMARY_SCHEMA = "dstrace.summary/1"
# One row per collective, in this order (`collectives.columns` in the file says so too).
COLLECTIVE_COLUMNS = ("kind", "group", "seq", "ts", "dur", "host_ts", "in_bytes", "out_bytes", "bytes",
                      "group_size", "source", "p2p_role", "p2p_peer")


@dataclass
class Event:
    """A complete trace event, with the args the reduction reads."""
    name: str
    cat: str
    pid: object
    tid: object
    ts: float
    dur: float
    args: dict

    @property
    def end(self) -> float:
        return self.ts + self.dur


def summary_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"rank{rank}{SUMMARY_SUFFIX}")


def _number(value) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def complete_events(trace: dict) -> list[Event]:
    out = []
    for e in trace.get("traceEvents") or []:
        if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e:
            out.append(Event(str(e.get("name", "")), str(e.get("cat", "")), e.get("pid"), e.get("tid"),
                             float(e["ts"]), float(e.get("dur") or 0.0), e.get("args") or {}))
    return out


def _gpu_collectives(events: list[Event]) -> list[dict]:
    launch_ts = {}
    for e in events:
        corr = e.args.get("correlation")
        if e.cat in LAUNCH_CATEGORIES and corr is not None and corr not in launch_ts:
            launch_ts[corr] = e.ts
    rows = []
    for e in events:
        if e.cat not in GPU_CATEGORIES or collective_kernel_kind(e.name) is None:
            continue
        kind = collective_kernel_kind(e.name) or kind_of(str(e.args.get("Collective name") or ""))
        if kind is None:
            continue
        size = dtype_bytes(e.args.get("dtype"))
        in_n, out_n = _number(e.args.get("In msg nelems")), _number(e.args.get("Out msg nelems"))
        rows.append(_row(e, kind, launch_ts.get(e.args.get("correlation"), e.ts),
                         in_n * size if in_n is not None and size else None,
                         out_n * size if out_n is not None and size else None, "nccl kernel"))
    return rows


def _cpu_collectives(events: list[Event], world_size: int) -> list[dict]:
    """The CPU op that does each collective: gloo ops, else record_param_comms, else c10d ops."""
    gloo = [(e, kind_of(e.name.replace("gloo:", ""))) for e in events if GLOO_OP.match(e.name)]
    rpc = [(e, kind_of(str(e.args.get("Collective name")))) for e in events
           if e.name == "record_param_comms" and e.args.get("Collective name") is not None]
    c10d = [(e, kind_of(e.name.replace("c10d::", ""))) for e in events if C10D_OP.match(e.name)]
    chosen, source = next(((c, s) for c, s in ((gloo, "gloo op"), (rpc, "record_param_comms op"),
                                                (c10d, "c10d op")) if c), ([], ""))
    rows = []
    for e, kind in chosen:
        if kind is None:
            continue
        a = e.args
        n = _number(a.get("Group size")) or world_size
        in_n = _number(a.get("In msg nelems"))
        if in_n is not None:
            size = dtype_bytes(a.get("dtype"))
            out_n = _number(a.get("Out msg nelems"))
            in_b = in_n * size if size else None
            out_b = out_n * size if size and out_n is not None else None
        else:
            types, dims = a.get("Input type"), a.get("Input Dims")
            size = dtype_bytes(types[0]) if isinstance(types, list) and types else None
            elements = numel(dims[0]) if isinstance(dims, list) and dims else None
            in_b = elements * size if elements is not None and size else None
            out_b = None if in_b is None else (in_b * n if kind == "AllGather"
                                               else in_b / n if kind == "ReduceScatter" else in_b)
        rows.append(_row(e, kind, e.ts, in_b, out_b, source))
    return rows


def _row(e: Event, kind: str, host_ts: float, in_b: float | None, out_b: float | None, source: str) -> dict:
    group = e.args.get("Process Group Name")
    role, peer = p2p_side(kind, e.args.get("Collective name"), e.args.get("Src Rank"), e.args.get("Dst Rank"))
    return {"kind": kind, "group": group if isinstance(group, str) and group else "world", "p2p_role": role,
            "p2p_peer": peer,
            "group_ranks": parse_ranks(e.args.get("Process Group Ranks")),
            "group_size": _number(e.args.get("Group size")), "ts": e.ts, "dur": e.dur, "host_ts": host_ts,
            "in_bytes": in_b, "out_bytes": out_b, "bytes": int(max(in_b or 0, out_b or 0)), "source": source}


# ---- intervals ---------------------------------------------------------------------------------
def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def total(merged: list[tuple[float, float]]) -> float:
    return float(sum(hi - lo for lo, hi in merged))


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time covered by both of two merged interval lists."""
    i = j = 0
    out = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        out += max(hi - lo, 0.0)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _outermost(events: list[Event]) -> list[Event]:
    """Events not nested in an earlier event of the same thread."""
    out, last_end = [], {}
    for e in sorted(events, key=lambda e: (str(e.pid), str(e.tid), e.ts, -e.dur)):
        key = (e.pid, e.tid)
        if key not in last_end or e.ts >= last_end[key]:
            out.append(e)
        last_end[key] = max(last_end.get(key, e.end), e.end)
    return out


def busy(events: list[Event], collectives: list[dict], gpu: bool,
         window: tuple[float, float] | None) -> dict:
    """span, idle, busy time by kind and exposed communication, as `dstrace.analysis.utilization` has them."""
    if gpu:
        work = [("communication" if HTA_COMM_KERNEL.match(e.name) or collective_kernel_kind(e.name) else
                 "memory" if HTA_MEMORY_KERNEL.match(e.name) else "compute", e.ts, e.end)
                for e in events if e.cat in GPU_CATEGORIES]
    else:
        ops = [e for e in events if e.cat == "cpu_op" and not CPU_NON_COMPUTE.match(e.name)]
        work = [("compute", e.ts, e.end) for e in _outermost(ops)]
        work += [("communication", c["ts"], c["ts"] + c["dur"]) for c in collectives]
    kinds = ("compute", "communication", "memory")
    if not work:
        return {"span_us": 0.0, "idle_us": 0.0, "busy_us": {k: 0.0 for k in kinds}, "exposed_comm_us": 0.0}
    lo, hi = window or (min(w[1] for w in work), max(w[2] for w in work))
    clipped = [(k, min(max(a, lo), hi), min(max(b, lo), hi)) for k, a, b in work]
    unions = {k: merge([(a, b) for kk, a, b in clipped if kk == k]) for k in kinds}
    everything = merge([(a, b) for _, a, b in clipped])
    comm = unions["communication"]
    return {"span_us": hi - lo, "idle_us": hi - lo - total(everything),
            "busy_us": {k: total(u) for k, u in unions.items()},
            "exposed_comm_us": total(comm) - intersection(unions["compute"], comm)}


# ---- the summary -------------------------------------------------------------------------------
def range_label(name: str) -> str:
    """`dstrace/zero3.fetch LlamaDecoderLayer#12` -> `zero3.fetch LlamaDecoderLayer`; ids and sizes dropped."""
    label = re.sub(r"#\d+$", "", name.removeprefix("dstrace/"))
    return re.sub(r"\s*bytes=\d+", "", label)


def _steps(events: list[Event]) -> list[dict]:
    """dstrace/step#n host ranges with ms to the next step's start (the last: its own range) and bytes gathered."""
    first: dict[int, Event] = {}
    for e in sorted(events, key=lambda e: e.ts):
        m = DSTRACE_STEP.match(e.name)
        if m and e.cat in ("user_annotation", "cpu_op") and int(m.group(1)) not in first:
            first[int(m.group(1))] = e
    gathers = [(e.ts, int(ALLGATHER_RANGE.match(e.name).group(1))) for e in events
               if e.cat == "user_annotation" and ALLGATHER_RANGE.match(e.name)]
    ordered = sorted(first.items(), key=lambda kv: kv[1].ts)
    out = []
    for i, (step, e) in enumerate(ordered):
        nxt = ordered[i + 1][1].ts if i + 1 < len(ordered) else None
        out.append({"step": step, "ts": e.ts, "end": e.end, "ms": ((nxt if nxt is not None else e.end) - e.ts) / 1e3,
                    "gathered_bytes": sum(b for t, b in gathers if e.ts <= t < e.end) if gathers else None})
    return out


def _ranges(events: list[Event]) -> dict[str, dict]:
    totals: dict[str, dict] = {}
    for e in events:
        if e.cat == "user_annotation" and e.name.startswith("dstrace/"):
            t = totals.setdefault(range_label(e.name), {"count": 0, "total_us": 0.0})
            t["count"] += 1
            t["total_us"] += e.dur
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]["total_us"]))


def accelerator_events(events: list[Event]) -> dict[str, int]:
    """Events per category of an accelerator dstrace does not read (MTIA, HPU, MLU): `reduction.accelerator_events`."""
    counts: dict[str, int] = {}
    for e in events:
        if e.cat in ACCELERATOR_CATEGORIES:
            counts[e.cat] = counts.get(e.cat, 0) + 1
    return dict(sorted(counts.items()))


def summarize(trace: dict, rank: int, world_size: int, host: str | None, trace_file: str,
              run_id: str | None) -> dict:
    """The summary of one parsed trace (`dstrace.summary/1`, docs/recording.md)."""
    events = complete_events(trace)
    gpu = any(e.cat in GPU_CATEGORIES for e in events)
    colls = _gpu_collectives(events) if gpu else _cpu_collectives(events, world_size)
    colls.sort(key=lambda c: c["ts"])
    seq: dict[tuple[str, str], int] = {}
    groups: dict[str, list[int] | None] = {}
    for c in colls:
        key = (c["group"], c["kind"])
        c["seq"] = seq.get(key, 0)
        seq[key] = c["seq"] + 1
        if c["group_size"] is None:
            c["group_size"] = len(c["group_ranks"]) if c["group_ranks"] else world_size
        if groups.get(c["group"]) is None:
            groups[c["group"]] = c["group_ranks"]
    steps = _steps(events)
    window = (min(s["ts"] for s in steps), max(s["end"] for s in steps)) if steps and not gpu else None
    return {
        "schema": SUMMARY_SCHEMA, "run_id": run_id, "rank": rank, "world_size": world_size, "host": host,
        "trace_file": trace_file, "device": "gpu" if gpu else "cpu",
        "distributed": trace.get("distributedInfo") if isinstance(trace.get("distributedInfo"), dict) else None,
        "groups": groups,
        "collectives": {"columns": list(COLLECTIVE_COLUMNS),
                        "rows": [[c[k] for k in COLLECTIVE_COLUMNS] for c in colls]},
        "steps": steps,
        "ranges": _ranges(events),
        "utilization": busy(events, colls, gpu, window),
        "accelerator_events": accelerator_events(events),
    }


def read_trace(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return json.load(f)


def write_summary(run_dir: str, trace_file: str, rank: int, world_size: int, host: str | None,
                  run_id: str | None, source: str | None = None) -> str:
    """Reduce the trace just exported and write `rank<N>.summary.json.gz` under a temporary name, then rename.
    `source`: the trace's uncompressed JSON when it is still at hand (no unzipping), else the trace file."""
    trace = read_trace(source or os.path.join(run_dir, trace_file))
    payload = json.dumps(summarize(trace, rank, world_size, host, trace_file, run_id), separators=(",", ":"))
    del trace
    final = summary_path(run_dir, rank)
    tmp = f"{final}.{os.getpid()}.tmp"
    try:
        with gzip.open(tmp, "wt", compresslevel=6) as f:
            f.write(payload)
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return os.path.basename(final)


def read_summary(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA:
        raise ValueError(f"{os.path.basename(path)} is not a dstrace summary")
    return data
