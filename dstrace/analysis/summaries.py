"""Rank summaries (`rank<N>.summary.json.gz`): each rank's reduction, written by `dstrace record`, read
instead of the traces.

A summary is the rank's `reduction.RankReduction` (what the run's analysis reads of a rank, HTA's
breakdowns included) with who wrote it, in the form of the cache (`cache.pack`): kilobytes to
megabytes per rank instead of tens to hundreds of MB of trace. `dstrace record` writes it once the
command has ended, in dstrace's own environment, from the traces its ranks wrote, with the one decoder
and reduction that `dstrace analyze` uses (`loading.decode_rank`), so `--source summaries` and
`--source traces` give the same report. Memory and time then grow with the number of ranks and
collectives, not with trace size; the full traces stay in the folder, and the report names the trace
file of each rank a finding points at. A summary is untrusted input like any file of a run folder:
read within bounds (`untrusted`), checked, and skipped with a warning when it does not hold.
"""
from __future__ import annotations

import functools
import gzip
import json
import os

import numpy as np
import pandas as pd

from dstrace.analysis import cache, collectives, reduction
from dstrace.runfolder import untrusted
from dstrace.runfolder.files import atomic_file
from dstrace.analysis.loading import MAX_WORLD_SIZE, folder_names, read_manifests, settle_run
from dstrace.analysis.model import LoadedRun, RankTrace
from dstrace.analysis.options import AUTO_MIN_RANKS
from dstrace.analysis.reduction import RankReduction
from dstrace.errors import UserError
from dstrace.runfolder.names import SUMMARY_SUFFIX, TRACE_SUFFIXES

SUMMARY_SCHEMA = "dstrace.summary/2"
AUTO_MIN_TRACE_BYTES = 2 << 30
"""Or when the traces add up to more than 2 GiB, whatever the number of ranks."""
MAX_SUMMARY_BYTES = 64 << 20
"""JSON one summary may hold: a rank's reduction is kilobytes to a few MB. Decoding holds about 4x the JSON at
its peak (numbers become Python objects before arrays), so a summary may cost at most ~300 MB; beyond the
limit it is refused while it inflates, before its JSON is held."""
NUMERIC = {"collectives": ("ts", "dur", "end", "host_ts", "in_bytes", "out_bytes"),
           "steps": ("step", "ts", "end", "ms"), "gathers": ("ts", "bytes")}
COLUMNS = {"collectives": collectives.RANK_COLUMNS, "steps": reduction.STEP_COLUMNS, "gathers": reduction.GATHER_COLUMNS}


def summary_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"rank{rank}{SUMMARY_SUFFIX}")


def write_summary(path: str, reduced: RankReduction, rank: int, world_size: int | None, host: str | None,
                  run_id: str | None, trace_file: str, distributed: dict | None) -> None:
    """Write a rank's summary, gzipped, under a temporary name, then renamed."""
    arrays, head = cache.pack(reduced)
    payload = {"schema": SUMMARY_SCHEMA, "run_id": run_id, "rank": rank, "world_size": world_size, "host": host,
               "trace_file": trace_file, "distributed": distributed, "reduction": head,
               "arrays": {k: {"dtype": v.dtype.str, "values": v.tolist()} for k, v in arrays.items()}}
    with atomic_file(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=6) as z:
        z.write(json.dumps(payload, separators=(",", ":")).encode())  # dumps: the C encoder; dump streams in Python


def write_run_summaries(run_dir: str, traces: dict[int, str], world_size: int,
                        progress=lambda message: None) -> list[str]:
    """Reduce each rank's trace (rank -> file name in `run_dir`) and write its summary beside it: what `dstrace
    record` does once the command has ended. The reductions are those `dstrace analyze` makes (and keeps in
    its caches, so the first analysis reads no trace). Returns one line per rank left without a summary."""
    from dstrace.analysis.loading import Parsed, dstrace_metadata, host_of, parse_traces

    paths = {rank: os.path.join(run_dir, name) for rank, name in sorted(traces.items())}
    parsed = parse_traces(list(paths.values()), progress, world_hint=world_size)
    problems = []
    for rank, path in paths.items():
        result = parsed[path]
        if not isinstance(result, Parsed):
            problems.append(f"rank {rank}: no summary: {result}")
            continue
        meta = result.meta
        ours = dstrace_metadata(meta) or {}
        dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None
        try:
            write_summary(summary_path(run_dir, rank), result.reduced, rank, world_size or None, host_of(path, meta),
                          ours.get("run_id"), os.path.basename(path), dist)
        except OSError as exc:
            problems.append(f"rank {rank}: no summary: {exc.strerror or exc}")
    return problems


def read_summary(path: str) -> tuple[dict, RankReduction]:
    """A summary's identity (rank, world_size, host, run_id, trace_file, distributed) and reduction. Raises
    ValueError saying what is wrong with the file."""
    data, arrays = _read_arrays(path)
    try:
        reduced = cache.unpack(arrays, data["reduction"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ValueError(f"not a summary dstrace wrote ({type(exc).__name__}: {exc})") from None
    return _identity(data, reduced), reduced


def _read_arrays(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """A summary's JSON and its arrays, before they become frames. Raises ValueError saying what is wrong."""
    try:
        text = b"".join(untrusted.json_chunks(path, limit=MAX_SUMMARY_BYTES))
    except untrusted.TooLarge:
        raise ValueError(f"holds more than {MAX_SUMMARY_BYTES >> 20} MiB of JSON, more than a rank summary dstrace "
                         "writes (kilobytes to a few MB): remove it, or analyze the traces with --source traces") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"truncated or corrupt JSON ({exc})") from None
    except RecursionError:
        raise ValueError("corrupt JSON (nested too deeply for a summary)") from None
    if not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA:
        raise ValueError(f"not a {SUMMARY_SCHEMA} summary (written by another dstrace version? "
                         "analyze the traces with --source traces)")
    try:
        arrays = {k: np.array(v["values"], dtype=np.dtype(v["dtype"])) for k, v in data.pop("arrays").items()}
        if any(a.dtype == object or a.ndim != 1 for a in arrays.values()):
            raise ValueError("an array that is not a column")
        frames = data["reduction"]["frames"]
        for name in cache.FRAMES:  # what unpack_many reads of the head, checked before it groups by it
            spec = frames[name]
            if not (isinstance(spec["rows"], int) and all(isinstance(c, list) and len(c) == 3
                                                          and all(isinstance(x, str) for x in c)
                                                          and c[1] in ("num", "str", "json")
                                                          for c in spec["columns"])):
                raise ValueError(f"the layout of {name} is not one dstrace writes")
            for _, _, dtype in spec["columns"]:
                _dtype(dtype)
        if not isinstance(data["reduction"]["reduced"], dict):
            raise ValueError("no reduction")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a summary dstrace wrote ({type(exc).__name__}: {exc})") from None
    return data, arrays


@functools.lru_cache(maxsize=64)
def _dtype(name: str):
    """pandas' dtype of that name (TypeError when none): a summary names a few, 24 columns per rank."""
    return pd.api.types.pandas_dtype(name)


def _identity(data: dict, reduced: RankReduction | None, frames_checked: bool = False) -> dict:
    """Who wrote the summary, once its content is checked (`_check`). Raises ValueError."""
    problem = _check(data, reduced, frames_checked)
    if problem:
        raise ValueError(f"not a summary dstrace wrote ({problem})")
    return {k: data.get(k) for k in ("rank", "world_size", "host", "run_id", "trace_file", "distributed")}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(column) -> bool:
    """Numbers, or numbers and gaps (a size the trace did not give)."""
    return column.dtype.kind in "biuf" or all(v is None or v != v or _number(v) for v in column)


def _frame_problem(name: str, columns: list[str], column) -> str | None:
    """What is wrong with frame `name` of these columns (`column(c)`: its values), or None."""
    if columns != list(COLUMNS[name]):
        return f"{name} has columns {columns}"
    if not all(_numbers(column(c)) for c in NUMERIC[name]):
        return f"{name} holds times or sizes that are not numbers"
    return None


def _columns_problem(data: dict, columns: dict | None) -> str | None:
    """`_check`'s frame checks on a summary's decoded columns (`cache.columns_of`), before they are batched."""
    if columns is None:
        return "a frame is incomplete"
    for name in COLUMNS:
        names = [c for c, _, _ in data["reduction"]["frames"][name]["columns"]]
        problem = _frame_problem(name, names, lambda c: columns[name][names.index(c)])
        if problem:
            return problem
    return None


def _check(data: dict, reduced: RankReduction | None, frames_checked: bool = False) -> str | None:
    """What is wrong with a summary's content for the analysis to read it, or None (`frames_checked`: its
    frames were checked as columns, `_columns_problem`)."""
    if reduced is None:
        return "a frame is incomplete"
    if not (isinstance(data.get("rank"), int) and 0 <= data["rank"] < MAX_WORLD_SIZE):
        return f"rank {str(data.get('rank'))[:40]} is not a rank"
    if data.get("world_size") is not None and not (isinstance(data["world_size"], int)
                                                   and 1 <= data["world_size"] <= MAX_WORLD_SIZE):
        return f"world_size {str(data.get('world_size'))[:40]} is not a world size"
    for key in ("host", "run_id", "trace_file"):
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"{key} is not text"
    for name, columns in COLUMNS.items() if not frames_checked else ():
        frame = getattr(reduced, name)
        problem = _frame_problem(name, list(frame.columns), lambda c: frame[c])
        if problem:
            return problem
    u = reduced.utilization
    if not (isinstance(reduced.has_gpu, bool) and isinstance(u, dict)
            and all(_number(u.get(k)) for k in ("span_us", "idle_us", "exposed_comm_us"))
            and isinstance(u.get("busy_us"), dict) and all(_number(v) for v in u["busy_us"].values())
            and isinstance(u.get("devices", {}), dict)
            and (u.get("window_us") is None or (isinstance(u["window_us"], list) and len(u["window_us"]) == 2
                                                and all(_number(v) for v in u["window_us"])))
            and isinstance(u.get("comm_libraries_us", {}), dict)
            and all(isinstance(k, str) and _number(v) for k, v in u.get("comm_libraries_us", {}).items())
            and isinstance(u.get("comm_libraries_us", {}), dict)
            and all(isinstance(k, str) and _number(v) for k, v in u.get("comm_libraries_us", {}).items())
            and isinstance(reduced.host_time, dict) and (reduced.hta is None or isinstance(reduced.hta, dict))
            and isinstance(reduced.gpu_host_events, dict)
            and all(isinstance(k, str) and _number(v) for k, v in reduced.gpu_host_events.items())
            and isinstance(reduced.nccl_host_calls, dict)
            and all(isinstance(k, str) and isinstance(v, dict) and all(_number(v.get(x)) for x in ("count", "bytes"))
                    for k, v in reduced.nccl_host_calls.items())):
        return "its utilization, host time or HTA results are not what the analysis reads"
    return None


def _file_size(path: str) -> int:
    """A file's size; 0 for a dangling link or an unreadable name (reading it says what is wrong)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def choose_source(trace_dir: str, requested: str = "auto") -> str:
    """"summaries" or "traces": what `dstrace analyze --source` reads for this folder."""
    names = folder_names(trace_dir)
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
    size = sum(_file_size(os.path.join(trace_dir, n)) for n in traces)
    return "summaries" if every_rank and (len(traces) >= AUTO_MIN_RANKS or size >= AUTO_MIN_TRACE_BYTES) else "traces"


def load_summaries(trace_dir: str) -> LoadedRun:
    """Read every rank's summary, the manifests and run.json into a `LoadedRun` whose ranks' reductions
    come from their summaries; refuse a folder mixing runs."""
    trace_dir = os.path.abspath(trace_dir)
    warnings: list[str] = []
    skipped: list[dict[str, str]] = []
    found: dict[int, tuple[dict, RankReduction]] = {}
    read: list[tuple[str, dict, dict]] = []  # name, JSON, columns: unpacked together (`cache.unpack_many`)
    texts: dict[str, str] = {}  # equal texts of all ranks as one object

    def skip(name: str, exc: Exception) -> None:
        path = os.path.join(trace_dir, name)
        reason = str(exc) if isinstance(exc, ValueError) else untrusted.unreadable(path, exc)
        skipped.append({"path": path, "reason": reason})
        warnings.append(f"skipped {name}: {reason}")

    for name in folder_names(trace_dir):
        if not name.endswith(SUMMARY_SUFFIX):
            continue
        try:
            data, arrays = _read_arrays(os.path.join(trace_dir, name))
            try:
                columns = cache.columns_of(arrays, data["reduction"], texts)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                raise ValueError(f"not a summary dstrace wrote ({type(exc).__name__}: {exc})") from None
            problem = _columns_problem(data, columns)
            if problem:
                raise ValueError(f"not a summary dstrace wrote ({problem})")
            read.append((name, data, columns))
        except (OSError, ValueError) as exc:
            skip(name, exc)
    try:
        reductions = cache.unpack_many([(columns, data["reduction"]) for _, data, columns in read])
        read = [(name, data, None) for name, data, _ in read]  # the columns are in the tables now
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"rank summaries in {trace_dir} that dstrace did not write ({type(exc).__name__}: "
                        f"{str(exc)[:200]}); analyze the traces with --source traces") from None
    for (name, data, _), reduced in zip(read, reductions):
        try:
            who = _identity(data, reduced, frames_checked=True)
            found[who["rank"]] = (who, reduced)
        except ValueError as exc:
            skip(name, exc)
    manifests, run = read_manifests(trace_dir, warnings, skipped)
    if not found:
        raise UserError(f"no usable rank summary in {trace_dir}")
    ranks = {rank: RankTrace(rank=rank, path=os.path.join(trace_dir, who.get("trace_file") or ""), reduced=reduced,
                             world_size=who.get("world_size"), host=who.get("host"), run_id=who.get("run_id"),
                             distributed=who["distributed"] if isinstance(who.get("distributed"), dict) else None)
             for rank, (who, reduced) in sorted(found.items())}
    return settle_run(trace_dir, ranks, manifests, run, warnings, skipped, source="summaries")
