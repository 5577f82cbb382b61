"""Read a run from its per-rank summaries (`rank<N>.summary.json.gz`) instead of its traces.

Each rank reduced its own trace when recording (`dstrace.recording.summary`); here each summary becomes
the `reduction.RankReduction` its trace would give (less HTA's breakdowns and the host time during GPU
idle, which need the trace), so the analysis of the run is the very same code either way. Memory and
time grow with the number of ranks and collectives, not with trace size; the full traces stay in the
folder, and the report names the trace file of each rank a finding points at.
"""
from __future__ import annotations

import os

import pandas as pd

from dstrace.analysis import collectives, reduction, utilization
from dstrace.analysis.loading import read_manifests, settle_run
from dstrace.analysis.model import LoadedRun, RankTrace
from dstrace.analysis.options import AUTO_MIN_RANKS
from dstrace.analysis.reduction import RankReduction
from dstrace.errors import UserError
from dstrace.runfolder.names import TRACE_SUFFIXES
from dstrace.recording.summary import COLLECTIVE_COLUMNS, SUMMARY_SUFFIX, read_summary

AUTO_MIN_TRACE_BYTES = 2 << 30
"""Or when the traces add up to more than 2 GiB, whatever the number of ranks."""



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


def load_summaries(trace_dir: str) -> LoadedRun:
    """Read every rank's summary, the manifests and run.json into a `LoadedRun` whose ranks' reductions
    come from their summaries; refuse a folder mixing runs."""
    trace_dir = os.path.abspath(trace_dir)
    warnings: list[str] = []
    skipped: list[dict[str, str]] = []
    found: dict[int, tuple[dict, RankReduction]] = {}
    for name in _names(trace_dir):
        if not name.endswith(SUMMARY_SUFFIX):
            continue
        path = os.path.join(trace_dir, name)
        try:
            s = read_summary(path)
            found[int(s["rank"])] = s, summary_reduction(s)
        except (OSError, ValueError, TypeError, KeyError, EOFError, AttributeError) as exc:
            skipped.append({"path": path, "reason": str(exc)})
            warnings.append(f"skipped {name}: {exc}")
    manifests, run = read_manifests(trace_dir, warnings, skipped)
    if not found:
        raise UserError(f"no usable rank summary in {trace_dir}")
    ranks = {rank: RankTrace(rank=rank, path=os.path.join(trace_dir, s.get("trace_file") or ""),
                             reduced=reduced, world_size=s.get("world_size"), host=s.get("host"),
                             run_id=s.get("run_id"), distributed=s.get("distributed"))
             for rank, (s, reduced) in sorted(found.items())}
    return settle_run(trace_dir, ranks, manifests, run, warnings, skipped, source="summaries")


def summary_reduction(s: dict) -> RankReduction:
    """A rank's summary as the reduction its trace would give, less what needs the trace (HTA, host time).
    Steps carry their gathered bytes, so each becomes one gather range at the step's start."""
    block = s.get("collectives") or {}
    df = pd.DataFrame(block.get("rows") or [], columns=block.get("columns") or list(COLLECTIVE_COLUMNS))
    groups = s.get("groups") or {}
    ts, dur = df["ts"].astype(float), df["dur"].astype(float)
    coll = pd.DataFrame({
        "kind": df["kind"], "name": df["kind"], "ts": ts, "dur": dur, "end": ts + dur,
        "host_ts": df["host_ts"].astype(float), "in_bytes": df["in_bytes"], "out_bytes": df["out_bytes"],
        "group_size": df["group_size"], "pg_name": df["group"], "pg_ranks": [groups.get(g) for g in df["group"]],
        "source": df["source"], "p2p_role": df.get("p2p_role"), "p2p_peer": df.get("p2p_peer")},
        columns=collectives.RANK_COLUMNS)
    steps = s.get("steps") or []
    step_frame = pd.DataFrame([("dstrace/step ranges", st["step"], st["ts"], st["end"], st["ms"]) for st in steps],
                              columns=reduction.STEP_COLUMNS)
    gathers = pd.DataFrame([(st["ts"], st["gathered_bytes"]) for st in steps if st.get("gathered_bytes") is not None],
                           columns=reduction.GATHER_COLUMNS)
    return RankReduction(has_gpu=s.get("device") == "gpu", collectives=coll, steps=step_frame, gathers=gathers,
                         utilization=s.get("utilization") or utilization.idle_rank(),
                         accelerator_events=s.get("accelerator_events") or {})
