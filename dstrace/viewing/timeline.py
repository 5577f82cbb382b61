"""All ranks on one clock: which events a merged timeline keeps, on which track, and which collectives link.

The merged timeline is what the Perfetto view writes, independent of the file format. Clock offsets
and the same-collective matching come from `dstrace.analysis.alignment`, exactly as `analyze` uses
them, so the timeline shows the waits the report states.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dstrace.analysis import alignment, collectives, steps as steps_mod
from dstrace.analysis.rank_collectives import launch_ts
from dstrace.trace_names import GPU_CATEGORIES
from dstrace.analysis.loaded import LoadedRun
from dstrace.analysis.results import ClockOffset
from dstrace.errors import UserError

STEP_WINDOW = re.compile(r"^(\d+)(?::(\d+))?$")
# Kept when CPU-op detail is dropped: the dstrace / user ranges and everything that ran on a GPU.
COARSE_CATEGORIES = frozenset({"user_annotation", "gpu_user_annotation"}) | GPU_CATEGORIES
PROFILER_SPAN = "Trace"  # Kineto's own "PyTorch Profiler (0)" marker, not an event of the program
PID_SPACE = 1 << 22  # Linux pids stay below this; ranks whose pids collide are moved up by a multiple


@dataclass
class Track:
    """One row under a rank: a host thread, a GPU stream, or a GPU stream's annotations."""
    uuid: int
    name: str
    order: int


@dataclass
class RankProcess:
    rank: int
    host: str | None
    pid: int
    uuid: int
    tracks: list[Track] = field(default_factory=list)
    clock_shift_us: float = 0.0

    @property
    def name(self) -> str:
        return f"rank {self.rank} ({self.host or 'unknown host'})"


@dataclass
class Timeline:
    """Slices (one DataFrame row each: track, name, cat, ts_ns, dur_ns, flow_out, flow_in, args) per rank."""
    processes: list[RankProcess]
    slices: pd.DataFrame
    flow_count: int
    clock: dict[int, ClockOffset]
    window: tuple[int, int] | None


def parse_step_window(text: str | None) -> tuple[int, int] | None:
    """`2:4` -> steps 2 to 4 inclusive; `3` -> step 3 only."""
    if text is None:
        return None
    m = STEP_WINDOW.match(text.strip())
    if not m:
        raise UserError(f"--steps takes FIRST:LAST or STEP (decode steps of dstrace/step#N ranges), not {text!r}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        raise UserError(f"--steps {text}: the last step comes before the first")
    return first, last


def _host_pid(events: pd.DataFrame) -> int | None:
    host = pd.to_numeric(events.loc[~events["cat"].isin(GPU_CATEGORIES | {"gpu_user_annotation"}), "pid"],
                         errors="coerce").dropna()
    return int(host.mode().iloc[0]) if len(host) else None


def _in_window(events: pd.DataFrame, steps: pd.DataFrame, rank: int, window: tuple[int, int]) -> np.ndarray:
    mine = steps[(steps["rank"] == rank) & steps["step"].between(*window)]
    if mine.empty:
        have = sorted(int(s) for s in steps.loc[steps["rank"] == rank, "step"])
        listing = f"steps {have[0]} to {have[-1]}" if have else "no dstrace/step#N ranges"
        raise UserError(f"--steps {window[0]}:{window[1]}: rank {rank} has {listing} in its trace")
    start, end = float(mine["ts"].min()), float(mine["end"].max())
    launched = launch_ts(events, events).where(events["is_gpu"], events["ts"])  # GPU work: when launched
    return np.where(events["is_gpu"], launched.between(start, end), (events["end"] > start) & (events["ts"] < end))


def _track_keys(events: pd.DataFrame, host_pid: int | None) -> tuple[list, dict]:
    """Per event its track key; GPU streams (pid = device, tid = stream) after the host threads."""
    keys, names = [], {}
    for cat, pid, tid in zip(events["cat"], events["pid"], events["tid"]):
        if cat in GPU_CATEGORIES:
            key = (1, str(pid), str(tid), 0)
            names.setdefault(key, f"GPU {pid} stream {tid}")
        elif cat == "gpu_user_annotation":
            key = (1, str(pid), str(tid), 1)
            names.setdefault(key, f"GPU {pid} stream {tid} annotations")
        else:
            key = (0, "", str(tid), 0)
            main = host_pid is not None and str(tid) == str(host_pid)
            names.setdefault(key, f"thread {tid}" + (" (main)" if main else ""))
        keys.append(key)
    return keys, names


def _numeric_first(text: str) -> tuple:
    return (0, int(text), "") if text.lstrip("-").isdigit() else (1, 0, text)


def _sort_key(key: tuple) -> tuple:
    kind, device, ident, sub = key
    return kind, _numeric_first(device), _numeric_first(ident), sub


def _collective_links(run: LoadedRun, steps: pd.DataFrame, policy: str):
    """Each rank's collectives matched across ranks (instance, wait, who arrived last), plus clock offsets."""
    raw = collectives.collective_events(run)
    hosts = {r: t.host for r, t in run.traces.items()}
    aligned, clock, _ = alignment.align(raw, steps, hosts, policy, alignment.host_only_reason(run))
    if aligned.empty:
        return pd.DataFrame(columns=["rank", "ts", "name", "instance", "kind", "bytes", "group", "wait_us",
                                     "transfer_us", "waited_for", "split", "aligned_ts"]), clock
    links = aligned[["rank", "name", "instance", "kind", "bytes", "group", "wait_us", "transfer_us", "waited_for",
                     "split"]].copy()
    links["ts"] = raw.loc[aligned.index, "ts"]  # the event's own (unshifted) ts, to find it in the rank's frame
    links["aligned_ts"] = aligned["ts"]
    return links, clock


def _flows(links: pd.DataFrame) -> pd.DataFrame:
    """One flow per (rank, instance) from every rank that arrived earlier to the rank that arrived last, for
    calls whose wait/transfer split holds (elsewhere who arrived last is not known).

    The arrow ends on the collective everyone waited for; its source starts no later than its target,
    which is the direction Perfetto draws flows in (ties go to the higher rank, written later).
    """
    rows = []
    flow_id = 0
    for _, g in links[links["split"].astype(bool)].groupby("instance"):
        if len(g) < 2:
            continue
        g = g.assign(ts_ns=np.round(g["aligned_ts"] * 1e3)).sort_values(["ts_ns", "rank"])
        last = g.iloc[-1]
        for _, early in g.iloc[:-1].iterrows():
            flow_id += 1
            rows.append((int(early["rank"]), early["ts"], early["name"], flow_id, "out"))
            rows.append((int(last["rank"]), last["ts"], last["name"], flow_id, "in"))
    return pd.DataFrame(rows, columns=["rank", "ts", "name", "flow", "end"])


def _collective_args(row) -> dict:
    args = {"collective": row["kind"], "group": row["group"], "bytes": int(row["bytes"]),
            "instance": int(row["instance"])}
    if row["split"]:
        args.update(wait_us=round(float(row["wait_us"]), 3), transfer_us=round(float(row["transfer_us"]), 3))
    if int(row["waited_for"]) >= 0:
        args["waited_for_rank"] = int(row["waited_for"])
    return args


def build_timeline(run: LoadedRun, window: tuple[int, int] | None = None, cpu_ops: bool = True,
                   clock_policy: str = "auto") -> Timeline:
    """Every rank's events on the reference rank's clock, restricted to a step window when asked."""
    steps, _ = steps_mod.step_ranges(run)
    if window is not None and steps.empty:
        raise UserError("--steps needs dstrace/step#N ranges (traces recorded by `dstrace record`); these traces have none")
    links, clock = _collective_links(run, steps, clock_policy)
    flows = _flows(links)
    processes, frames = [], []
    used_pids: set[int] = set()
    next_uuid = 1
    for rank, trace in sorted(run.traces.items()):
        ev = trace.events
        ev = ev[ev["cat"] != PROFILER_SPAN]
        if window is not None:
            ev = ev[_in_window(ev, steps, rank, window)]
        mine = links[links["rank"] == rank].drop_duplicates(["ts", "name"]).set_index(["ts", "name"])
        is_collective = pd.Series([k in mine.index for k in zip(ev["ts"], ev["name"])], index=ev.index, dtype=bool)
        if not cpu_ops:
            ev = ev[ev["cat"].isin(COARSE_CATEGORIES) | is_collective]
            is_collective = is_collective.loc[ev.index]
        host_pid = _host_pid(trace.events)
        pid = host_pid if host_pid is not None else rank + 1
        while pid in used_pids:
            pid += PID_SPACE
        used_pids.add(pid)
        offset = clock.get(rank)
        shift = offset.offset_us if offset is not None and offset.applied else 0.0
        proc = RankProcess(rank=rank, host=trace.host, pid=pid, uuid=next_uuid, clock_shift_us=shift)
        next_uuid += 1
        keys, names = _track_keys(ev, host_pid)
        uuids = {}
        for order, key in enumerate(sorted(names, key=_sort_key)):
            uuids[key] = next_uuid
            proc.tracks.append(Track(next_uuid, names[key], order))
            next_uuid += 1
        processes.append(proc)
        ts_ns, dur_ns = _nanoseconds(trace, ev["ts"].to_numpy() - shift, ev["dur"].to_numpy())
        df = pd.DataFrame({
            "rank": rank, "track": [uuids[k] for k in keys], "name": ev["name"].to_numpy(),
            "cat": ev["cat"].to_numpy(), "ts": ev["ts"].to_numpy(), "ts_ns": ts_ns, "dur_ns": dur_ns,
        }, index=ev.index)
        df["args"] = None
        df.loc[is_collective.to_numpy(), "args"] = pd.Series(
            [_collective_args(mine.loc[k]) for k in zip(ev.loc[is_collective, "ts"], ev.loc[is_collective, "name"])],
            index=df.index[is_collective.to_numpy()], dtype=object)
        frames.append(df)
    slices = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["rank", "track", "name", "cat", "ts", "ts_ns", "dur_ns", "args"])
    slices = _attach_flows(slices, flows)
    flow_count = sum(len(ids) for ids in slices["flow_out"])
    return Timeline(processes=processes, slices=slices.drop(columns=["ts"]), flow_count=flow_count, clock=clock,
                    window=window)


MAX_NS = (1 << 63) - 1
"""Perfetto's timestamps are unsigned nanoseconds; dstrace writes them from int64: 0 to 2^63 - 1 ns."""


def _nanoseconds(trace, ts_us: np.ndarray, dur_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and duration in integer nanoseconds (a duration at least 1 ns), or UserError for times that no
    nanosecond clock from 0 to 2^63 holds (negative, huge: not what a profiler wrote)."""
    start = np.round(ts_us * 1e3)
    dur = np.maximum(np.round(dur_us * 1e3), 1)
    if len(start) and not (start.min() >= 0 and (start + dur).max() <= MAX_NS):
        raise UserError(f"{os.path.basename(trace.path)} (rank {trace.rank}) has event times from {ts_us.min():.4g} to "
                        f"{(ts_us + dur_us).max():.4g} us, outside what a timeline holds (0 to {MAX_NS / 1e3:.4g} us, "
                        "after clock alignment): not times a profiler wrote; remove the trace or record it again")
    return start.astype("int64"), dur.astype("int64")


def _attach_flows(slices: pd.DataFrame, flows: pd.DataFrame) -> pd.DataFrame:
    """Flow ids on the slices they start and end on; flows with an end outside the kept events are dropped."""
    slices = slices.copy()
    slices["flow_out"] = [() for _ in range(len(slices))]
    slices["flow_in"] = [() for _ in range(len(slices))]
    if flows.empty or slices.empty:
        return slices
    located = flows.merge(slices.reset_index()[["index", "rank", "ts", "name"]].drop_duplicates(["rank", "ts", "name"]),
                          on=["rank", "ts", "name"], how="inner")
    complete = located.groupby("flow")["end"].nunique()
    located = located[located["flow"].isin(complete[complete == 2].index)]
    for end, column in (("out", "flow_out"), ("in", "flow_in")):
        ids = located[located["end"] == end].groupby("index")["flow"].apply(tuple)
        slices.loc[ids.index, column] = pd.Series(ids.to_numpy(), index=ids.index, dtype=object)
    return slices
