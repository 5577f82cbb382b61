"""Find the per-rank traces of a run folder, parse them, and refuse what cannot be analyzed.

Only this module reads files. It turns a folder into a `LoadedRun`: one `RankTrace` per rank (its
complete events as a DataFrame), the dstrace manifests when present, and warnings for what it skipped.
Input that cannot be analyzed at all raises `UserError` with one line saying what is wrong.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import sys
import zlib
from collections import defaultdict
from typing import Callable

import pandas as pd

from dstrace.errors import UserError
from dstrace.analysis.findings import error_line
from dstrace.analysis.model import LoadedRun, RankTrace
from dstrace.recording.manifest import (
    MANIFEST_SUFFIX, RUN_FILE, TRACE_SUFFIXES, Manifest, RunRecord, read_manifest, read_run,
)

GPU_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver"})

# Trace-event args copied into columns: (column, arg key). Everything else in args is dropped.
ARG_COLUMNS = (
    ("correlation", "correlation"),
    ("external_id", "External id"),
    ("stream", "stream"),
    ("device", "device"),
    ("coll_name", "Collective name"),
    ("in_nelems", "In msg nelems"),
    ("out_nelems", "Out msg nelems"),
    ("dtype", "dtype"),
    ("group_size", "Group size"),
    ("pg_name", "Process Group Name"),
    ("pg_ranks", "Process Group Ranks"),
    ("input_dims", "Input Dims"),
    ("input_type", "Input type"),
)
EVENT_COLUMNS = ["name", "cat", "pid", "tid", "ts", "dur", "end", "is_gpu"] + [c for c, _ in ARG_COLUMNS]
RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
HOST_IN_NAME = re.compile(r"^(?P<host>.+?)_rank\d+")

Progress = Callable[[str], None]


def stderr_progress(message: str) -> None:
    print(f"dstrace: {message}", file=sys.stderr, flush=True)


def find_trace_files(trace_dir: str) -> list[str]:
    """Trace candidates: `*.pt.trace.json[.gz]` if any, else every other `.json`/`.json.gz` file (maybe none)."""
    if not os.path.isdir(trace_dir):
        raise UserError(f"{trace_dir} is not a folder; give the folder holding the per-rank traces")
    names = sorted(os.listdir(trace_dir))
    traces = [n for n in names if n.endswith(TRACE_SUFFIXES)]
    if not traces:
        traces = [n for n in names if n.endswith((".json", ".json.gz"))
                  and not n.endswith(MANIFEST_SUFFIX) and n != RUN_FILE]
    return [os.path.join(trace_dir, n) for n in traces]


def read_trace_json(path: str) -> dict:
    """Parse one file; any damage becomes a ValueError whose message says what is wrong with it."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            with open(path, "rb") as f:
                raw = f.read()
        data = json.loads(raw)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"truncated or corrupt gzip ({exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"truncated or corrupt JSON ({exc})") from None
    except OSError as exc:
        raise ValueError(f"unreadable ({exc.strerror or exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError("not a torch.profiler trace (no traceEvents list)")
    return data


def dstrace_metadata(data: dict) -> dict | None:
    """The "dstrace" trace metadata: an object, or a JSON string when added with add_metadata_json."""
    value = data.get("dstrace")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def events_frame(trace_events: list[dict]) -> pd.DataFrame:
    """Complete ('X') events as a DataFrame, with the args the analyses use as columns."""
    rows = []
    for e in trace_events:
        if not isinstance(e, dict) or e.get("ph") != "X" or "ts" not in e:
            continue
        args = e.get("args") or {}
        row = [e.get("name", ""), e.get("cat", ""), e.get("pid"), e.get("tid"),
               float(e["ts"]), float(e.get("dur") or 0.0)]
        row.extend(args.get(key) for _, key in ARG_COLUMNS)
        rows.append(row)
    columns = ["name", "cat", "pid", "tid", "ts", "dur"] + [c for c, _ in ARG_COLUMNS]
    df = pd.DataFrame(rows, columns=columns)
    df["name"] = df["name"].astype(str)
    df["cat"] = df["cat"].astype(str)
    df["end"] = df["ts"] + df["dur"]
    df["is_gpu"] = df["cat"].isin(GPU_CATEGORIES)
    for col in ("stream", "device", "correlation"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df.loc[~df["is_gpu"], "stream"] = -1
    return df[EVENT_COLUMNS]


def _rank_of(path: str, data: dict, meta: dict | None) -> tuple[int | None, str | None]:
    """The rank a trace claims, and where that came from. distributedInfo wins, then dstrace, then the name."""
    dist = data.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        return dist["rank"], "distributedInfo"
    if meta and isinstance(meta.get("rank"), int):
        return meta["rank"], "dstrace metadata"
    m = RANK_IN_NAME.search(os.path.basename(path))
    if m:
        return int(m.group(1)), "file name"
    return None, None


def _host_of(path: str, data: dict) -> str | None:
    host = data.get("host_name")
    if isinstance(host, str) and host:
        return host
    m = HOST_IN_NAME.match(os.path.basename(path))
    return m.group("host") if m else None


def _world_of(data: dict, meta: dict | None) -> int | None:
    dist = data.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("world_size"), int):
        return dist["world_size"]
    if meta and isinstance(meta.get("world_size"), int):
        return meta["world_size"]
    return None


def _read_manifests(trace_dir: str, warnings: list[str]) -> tuple[dict[int, Manifest], RunRecord | None]:
    manifests: dict[int, Manifest] = {}
    for name in sorted(os.listdir(trace_dir)):
        if not name.endswith(MANIFEST_SUFFIX):
            continue
        try:
            m = read_manifest(os.path.join(trace_dir, name))
        except (ValueError, TypeError, OSError) as exc:
            warnings.append(f"skipped manifest {name}: {exc}")
            continue
        manifests[m.rank] = m
    run = None
    run_path = os.path.join(trace_dir, RUN_FILE)
    if os.path.exists(run_path):
        try:
            run = read_run(run_path)
        except (ValueError, TypeError, OSError) as exc:
            warnings.append(f"skipped {RUN_FILE}: {exc}")
    return manifests, run


def _fmt_ranks(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _choose_run(traces: dict[int, RankTrace], run: RunRecord | None, trace_dir: str,
                warnings: list[str], skipped: list[dict]) -> str | None:
    """One run per folder: traces of other runs are refused, or skipped when run.json says which is ours."""
    by_run: dict[str, list[int]] = defaultdict(list)
    for rank, t in traces.items():
        if t.run_id:
            by_run[t.run_id].append(rank)
    if len(by_run) <= 1:
        return next(iter(by_run), run.run_id if run else None)
    if run is not None and run.run_id in by_run:
        for other, ranks in by_run.items():
            if other == run.run_id:
                continue
            for rank in ranks:
                skipped.append({"path": traces[rank].path, "reason": f"belongs to run {other}, not {run.run_id}"})
                del traces[rank]
            warnings.append(f"skipped traces of another run {other} ({_fmt_ranks(ranks)}); {RUN_FILE} names run {run.run_id}")
        return run.run_id
    listing = "; ".join(f"run {rid} ({_fmt_ranks(r)})" for rid, r in sorted(by_run.items()))
    raise UserError(f"traces of different runs are mixed in {trace_dir}: {listing}; put each run in its own folder")


def _manifests_only(trace_dir: str, manifests: dict[int, Manifest], run: RunRecord | None,
                    warnings: list[str]) -> LoadedRun:
    """The ranks stopped before their profiling window: what the manifests say is all there is."""
    run_ids = {m.run_id for m in manifests.values()}
    if len(run_ids) > 1:
        raise UserError(f"manifests of different runs are mixed in {trace_dir}: {', '.join(sorted(run_ids))}")
    world = max([m.world_size for m in manifests.values()] + [run.world_size or 0 if run else 0])
    warnings.append(f"no traces in {trace_dir}: the ranks ended before their profiling window; "
                    "only the manifests are analyzed")
    return LoadedRun(trace_dir=trace_dir, traces={}, world_size=world, run_id=run_ids.pop(),
                     manifests=manifests, run_record=run, warnings=warnings)


def load_run(trace_dir: str, progress: Progress = stderr_progress) -> LoadedRun:
    """Read and validate a run folder. Raises UserError when nothing in it can be analyzed."""
    trace_dir = os.path.abspath(trace_dir)
    files = find_trace_files(trace_dir)
    warnings: list[str] = []
    skipped: list[dict[str, str]] = []
    manifests, run = _read_manifests(trace_dir, warnings)
    for rank, m in sorted(manifests.items()):
        if m.exit_error:
            warnings.append(f"rank {rank} ended with {error_line(m.exit_error)}")
    if not files:
        if not manifests:
            raise UserError(f"no trace files (*.pt.trace.json or *.pt.trace.json.gz) in {trace_dir}")
        return _manifests_only(trace_dir, manifests, run, warnings)

    parsed: list[tuple[str, dict, dict | None]] = []
    for i, path in enumerate(files, 1):
        progress(f"parsing trace {i} of {len(files)}: {os.path.basename(path)}")
        try:
            data = read_trace_json(path)
        except ValueError as exc:
            skipped.append({"path": path, "reason": str(exc)})
            warnings.append(f"skipped {os.path.basename(path)}: {exc}")
            continue
        parsed.append((path, data, dstrace_metadata(data)))
    if not parsed:
        reasons = "; ".join(f"{os.path.basename(s['path'])}: {s['reason']}" for s in skipped)
        raise UserError(f"no usable trace in {trace_dir} ({reasons})")

    claims: dict[int, list[str]] = defaultdict(list)
    traces: dict[int, RankTrace] = {}
    for path, data, meta in parsed:
        rank, source = _rank_of(path, data, meta)
        if rank is None and len(parsed) == 1:
            rank, source = 0, "single trace"
        if rank is None:
            skipped.append({"path": path, "reason": "no rank in it (no distributedInfo, no dstrace metadata, no rankN in the name)"})
            warnings.append(f"skipped {os.path.basename(path)}: cannot tell which rank wrote it")
            continue
        if meta and isinstance(meta.get("rank"), int) and meta["rank"] != rank:
            warnings.append(f"{os.path.basename(path)}: distributedInfo says rank {rank}, dstrace metadata says {meta['rank']}; using {rank}")
        claims[rank].append(path)
        traces[rank] = RankTrace(
            rank=rank, path=path, events=events_frame(data["traceEvents"]), world_size=_world_of(data, meta),
            host=_host_of(path, data), run_id=(meta or {}).get("run_id"),
            distributed=data.get("distributedInfo") if isinstance(data.get("distributedInfo"), dict) else None,
            dstrace=meta,
        )
    duplicated = {r: p for r, p in claims.items() if len(p) > 1}
    if duplicated:
        rank, paths = min(duplicated.items())
        names = " and ".join(os.path.basename(p) for p in paths)
        raise UserError(f"two traces claim rank {rank} in {trace_dir}: {names}; keep one trace per rank")
    if not traces:
        raise UserError(f"no trace in {trace_dir} says which rank wrote it; name them <host>_rank<N>.pt.trace.json.gz")

    run_id = _choose_run(traces, run, trace_dir, warnings, skipped)
    for rank, m in sorted(manifests.items()):
        if run_id and m.run_id != run_id:
            raise UserError(f"traces of different runs are mixed in {trace_dir}: rank{rank}{MANIFEST_SUFFIX} is from run "
                            f"{m.run_id} but the traces are from run {run_id}")
    if run_id is None and manifests:
        run_id = next(iter(manifests.values())).run_id

    sizes = {t.world_size for t in traces.values() if t.world_size} | {m.world_size for m in manifests.values()}
    if run is not None and run.world_size:
        sizes.add(run.world_size)
    world_size = max(sizes | {max(traces) + 1})
    if len(sizes) > 1:
        warnings.append(f"traces and manifests disagree on the world size ({sorted(sizes)}); using {world_size}")
    loaded = LoadedRun(trace_dir=trace_dir, traces=traces, world_size=world_size, run_id=run_id,
                       manifests=manifests, run_record=run, warnings=warnings, skipped=skipped)
    if loaded.missing_ranks:
        warnings.append(f"no trace for {_fmt_ranks(loaded.missing_ranks)} of world size {world_size}: "
                        "waits are measured among the ranks found only")
    return loaded
