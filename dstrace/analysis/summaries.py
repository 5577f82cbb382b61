"""Read a run from its per-rank summaries (`rank<N>.summary.json.gz`) instead of its traces.

Each rank reduced its own trace when recording (`dstrace.recording.summary`); here those reductions
become the same collective and step frames `collectives.collective_events` and `steps.step_ranges`
build from traces, so matching, clock alignment and the wait split run the very same code. Memory and
time grow with the number of ranks and collectives, not with trace size; the full traces stay in the
folder, and the report names the trace file of each rank a finding points at.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pandas as pd

from dstrace.errors import UserError
from dstrace.recording.manifest import (MANIFEST_SUFFIX, RUN_FILE, TRACE_SUFFIXES, Manifest, RunRecord,
                                        read_manifest, read_run)
from dstrace.recording.summary import COLLECTIVE_COLUMNS, SUMMARY_SUFFIX, read_summary

SOURCES = ("auto", "traces", "summaries")
AUTO_MIN_RANKS = 16
"""From this many ranks up, `--source auto` reads summaries when every rank has one: parsing each
trace costs seconds and memory per rank, and HTA's per-rank breakdowns (which need the traces) matter
less than the cross-rank picture. Below it, the traces' fuller report is cheap enough."""
AUTO_MIN_TRACE_BYTES = 2 << 30
"""Or when the traces add up to more than 2 GiB, whatever the number of ranks."""

FRAME_COLUMNS = ["rank", "kind", "name", "ts", "dur", "end", "host_ts", "in_bytes", "out_bytes", "bytes",
                 "group_size", "group", "group_ranks", "source"]
STEP_COLUMNS = ["rank", "step", "ts", "end", "ms"]


@dataclass
class SummaryRun:
    """A run folder as its summaries, manifests and run record describe it. Duck-types the parts of
    `LoadedRun` that findings read (`device`, `manifests`, `ranks`)."""
    trace_dir: str
    summaries: dict[int, dict]
    world_size: int
    run_id: str | None = None
    manifests: dict[int, Manifest] = field(default_factory=dict)
    run_record: RunRecord | None = None
    warnings: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.summaries)

    @property
    def missing_ranks(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.summaries]

    @property
    def device(self) -> str:
        return "gpu" if any(s.get("device") == "gpu" for s in self.summaries.values()) else "cpu"

    @property
    def hosts(self) -> dict[int, str | None]:
        return {r: s.get("host") for r, s in self.summaries.items()}

    def trace_path(self, rank: int) -> str:
        """The full trace this rank's summary was reduced from."""
        return os.path.join(self.trace_dir, self.summaries[rank].get("trace_file") or "")


def _names(trace_dir: str) -> list[str]:
    if not os.path.isdir(trace_dir):
        raise UserError(f"{trace_dir} is not a folder; give the folder holding the per-rank traces")
    return sorted(os.listdir(trace_dir))


def choose_source(trace_dir: str, requested: str = "auto") -> str:
    """"summaries" or "traces": what `dstrace analyze --source` reads for this folder."""
    names = _names(trace_dir)
    summaries = [n for n in names if n.endswith(SUMMARY_SUFFIX)]
    traces = [n for n in names if n.endswith(TRACE_SUFFIXES)]
    if requested == "summaries":
        if not summaries:
            raise UserError(f"no rank summaries (*{SUMMARY_SUFFIX}) in {trace_dir}: recorded before dstrace wrote "
                            "them? analyze the traces with --source traces")
        return "summaries"
    if requested == "traces" or not summaries:
        return "traces"
    if not traces:
        return "summaries"
    every_rank = len(summaries) >= len(traces)
    size = sum(os.path.getsize(os.path.join(trace_dir, n)) for n in traces)
    return "summaries" if every_rank and (len(traces) >= AUTO_MIN_RANKS or size >= AUTO_MIN_TRACE_BYTES) else "traces"


def load_summaries(trace_dir: str) -> SummaryRun:
    """Read every rank's summary, the manifests and run.json; refuse a folder mixing runs."""
    trace_dir = os.path.abspath(trace_dir)
    warnings: list[str] = []
    skipped: list[dict[str, str]] = []
    summaries: dict[int, dict] = {}
    manifests: dict[int, Manifest] = {}
    run = None
    for name in _names(trace_dir):
        path = os.path.join(trace_dir, name)
        try:
            if name.endswith(SUMMARY_SUFFIX):
                s = read_summary(path)
                summaries[int(s["rank"])] = s
            elif name.endswith(MANIFEST_SUFFIX):
                m = read_manifest(path)
                manifests[m.rank] = m
            elif name == RUN_FILE:
                run = read_run(path)
        except (OSError, ValueError, TypeError, KeyError, EOFError) as exc:
            skipped.append({"path": path, "reason": str(exc)})
            warnings.append(f"skipped {name}: {exc}")
    if not summaries:
        raise UserError(f"no usable rank summary in {trace_dir}")
    run_ids = {s.get("run_id") for s in summaries.values()} | {m.run_id for m in manifests.values()}
    run_ids.discard(None)
    if len(run_ids) > 1:
        raise UserError(f"summaries and manifests of different runs are mixed in {trace_dir}: "
                        f"{', '.join(sorted(run_ids))}; put each run in its own folder")
    sizes = {int(s.get("world_size") or 0) for s in summaries.values()} | {m.world_size for m in manifests.values()}
    if run is not None and run.world_size:
        sizes.add(run.world_size)
    world = max(sizes | {max(summaries) + 1})
    loaded = SummaryRun(trace_dir=trace_dir, summaries=summaries, world_size=world,
                        run_id=next(iter(run_ids), run.run_id if run else None), manifests=manifests,
                        run_record=run, warnings=warnings, skipped=skipped)
    if loaded.missing_ranks:
        warnings.append(f"no summary for {len(loaded.missing_ranks)} rank(s) of world size {world} "
                        f"({_ranges_text(loaded.missing_ranks)}): waits are measured among the ranks found only")
    return loaded


def _ranges_text(ranks: list[int]) -> str:
    """0-3, 7, 9-12: hundreds of ranks stay one line."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)


def collective_frame(run: SummaryRun) -> pd.DataFrame:
    """All ranks' collectives with the columns of `collectives.collective_events`."""
    frames = []
    for rank, s in sorted(run.summaries.items()):
        block = s.get("collectives") or {}
        rows = block.get("rows") or []
        if not rows:
            continue
        df = pd.DataFrame(rows, columns=block.get("columns") or list(COLLECTIVE_COLUMNS))
        groups = s.get("groups") or {}
        everyone = tuple(range(run.world_size))
        df["group_ranks"] = [tuple(groups[g]) if groups.get(g) else everyone for g in df["group"]]
        df["rank"] = rank
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=FRAME_COLUMNS)
    df = pd.concat(frames, ignore_index=True)
    df["ts"] = df["ts"].astype(float)
    df["dur"] = df["dur"].astype(float)
    df["end"] = df["ts"] + df["dur"]
    df["host_ts"] = df["host_ts"].astype(float)
    df["name"] = df["kind"]
    df["bytes"] = df["bytes"].fillna(0).astype("int64")
    df["group_size"] = df["group_size"].astype("int64")
    return df.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)[FRAME_COLUMNS]


def step_frame(run: SummaryRun) -> pd.DataFrame:
    """rank, step, ts, end, ms: the columns of `steps.step_ranges`."""
    rows = [(rank, st["step"], st["ts"], st["end"], st["ms"])
            for rank, s in sorted(run.summaries.items()) for st in s.get("steps") or []]
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def gathered_per_step(run: SummaryRun, coll: pd.DataFrame) -> tuple[dict[tuple[int, int], int], str | None]:
    """Bytes gathered per (rank, step): the ranks' zero3.allgather ranges, else their AllGather collectives."""
    ranged = {(rank, st["step"]): st["gathered_bytes"] for rank, s in run.summaries.items()
              for st in s.get("steps") or [] if st.get("gathered_bytes") is not None}
    if ranged:
        return ranged, "dstrace/zero3.allgather ranges"
    ag = coll[coll["kind"] == "AllGather"] if len(coll) else coll
    if ag.empty:
        return {}, None
    out = {}
    for rank, s in run.summaries.items():
        mine = ag[ag["rank"] == rank]
        for st in s.get("steps") or []:
            inside = (mine["host_ts"] >= st["ts"]) & (mine["host_ts"] < st["end"])
            out[(rank, st["step"])] = int(mine.loc[inside, "bytes"].sum())
    return out, "AllGather collectives"
