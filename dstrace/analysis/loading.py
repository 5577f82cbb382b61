"""Parse the per-rank traces of a run folder, and refuse what cannot be analyzed.

This module, with `runfolder.folder` (the folder listed once, its manifests read once), `tracefile`
(parsing one file) and `kept` (a rank's reduction kept beside its trace, or alone), is where the analysis
reads files. It turns a folder into a `LoadedRun`: one `RankTrace` per rank (its
reduction, `reduction.RankReduction`, and its complete events as a DataFrame when asked for), the
dstrace manifests when present, and warnings for what it skipped. Input that cannot be analyzed at all
raises `UserError` with one line saying what is wrong.

Traces without a kept reduction that answers for them are parsed in worker processes, as many at once
as there are CPUs and memory for (`parallel.worker_count`); each worker parses its trace once, reduces it (HTA's
breakdowns included) with only that rank in memory, and keeps the reduction, which the main process then
reads: the first and every later analysis see the same reductions, and the main process never holds a
rank's events unless the caller asks for them. A kept reduction whose trace is not in the folder is the
rank (`kept`).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from dstrace.errors import UserError
from dstrace.analysis import hta_breakdown, kept, parallel, reduction, tracefile
from dstrace.analysis.loaded import LoadedRun, RankTrace
from dstrace.rankset import by_rank_lines, ranks_text
from dstrace.analysis.reduction import RankReduction
from dstrace.trace_names import GPU_CATEGORIES
from dstrace.runfolder import untrusted
from dstrace.runfolder.folder import (FolderFile, NotAFolder, RunFolder, UnreadableFolder, dstrace_metadata,
                                      host_of, implausible, rank_of, world_of)
from dstrace.runfolder.names import MANIFEST_SUFFIX, RUN_FILE
from dstrace.runfolder.records import Manifest, RunRecord, error_line, why_no_trace
from dstrace.say import say


ARG_COLUMNS = tracefile.ARG_COLUMNS
EVENT_COLUMNS = ["name", "cat", "pid", "tid", "ts", "dur", "end", "is_gpu"] + [c for c, _ in ARG_COLUMNS]

Progress = Callable[[str], None]

def run_folder(trace_dir: str) -> RunFolder:
    """The run folder (or the one trace) at `trace_dir`, listed once; UserError when it is not a folder or
    cannot be read."""
    try:
        return RunFolder.scan(trace_dir)
    except NotAFolder as exc:
        raise UserError(f"{exc}; give the folder holding the per-rank traces") from None
    except UnreadableFolder as exc:
        raise UserError(f"{exc}; give a folder you can read") from None


def _categorical(columns: tracefile.Columns, name: str) -> pd.Categorical:
    """A coded column as text, kept coded: filters and string matches then run once per distinct value
    (`Series.str` on a categorical works on its categories), not once per event. The categories are
    sorted, so grouping by the column orders groups as grouping by its text would."""
    text = np.fromiter((str(v) for v in columns.tables[name]), dtype=object, count=len(columns.tables[name]))
    merged, categories = pd.factorize(text, sort=True)  # str() may make two values one text
    codes = merged[columns.codes[name]] if len(text) else columns.codes[name]
    return pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype=object))


def events_frame(columns: tracefile.Columns) -> pd.DataFrame:
    """Complete ('X') events as a DataFrame, with the args the analyses use as columns; name and cat are
    categoricals of their text. Text args stay plain objects (None where absent): pandas would otherwise
    scan every row of each to infer a string type, for the few events (collectives) that have them."""
    n = len(columns)
    is_gpu = columns.per_row("cat", lambda c: c in GPU_CATEGORIES)
    data = {"name": _categorical(columns, "name"), "cat": _categorical(columns, "cat"),
            "pid": columns.values("pid"), "tid": columns.values("tid"), "ts": columns.ts, "dur": columns.dur,
            "end": columns.ts + columns.dur, "is_gpu": is_gpu}
    for col, _ in ARG_COLUMNS:
        values = columns.arg(col) if columns.present[col] else np.empty(n, dtype=object)
        if col in ("stream", "device", "correlation"):
            values = pd.to_numeric(values, errors="coerce")
        data[col] = pd.Series(values, dtype=object, copy=False) if values.dtype == object else values
    data["stream"] = np.where(is_gpu, data["stream"], -1.0)
    return pd.DataFrame(data, columns=EVENT_COLUMNS, copy=False)


def decode_rank(path: str, world_hint: int, reduce: bool = True,
                helper: parallel.Helper | None = None) -> tuple[dict, pd.DataFrame, RankReduction | None]:
    """One trace decoded by this process and the `helper` if any (its metadata and events frame) and, with
    `reduce`, reduced (HTA's breakdowns included: part of them by the helper while this process reduces).
    Raises ValueError with what is wrong with the file."""
    meta, columns = tracefile.read_trace(path, helping=[helper] if helper is not None else [])
    hta = None
    if reduce and any(c in GPU_CATEGORIES for c in columns.tables["cat"]):
        # before the events frame exists: the two never peak together in this process
        hta = hta_breakdown.rank_breakdowns(path, meta, columns, helper)
        parallel.release_freed_memory()
    events = events_frame(columns)
    del columns
    if not reduce:
        return meta, events, None
    ours = dstrace_metadata(meta)
    rank, _ = rank_of(path, meta, ours)
    world = max(world_hint, world_of(meta, ours) or 0, (rank or 0) + 1)
    reduced = reduction.reduce_rank(events, world)  # while the helper computes its share of HTA's breakdowns
    if hta is not None and reduced.has_gpu:
        reduced.hta = hta.result()
    return meta, events, reduced


def parse_rank(path: str, targets: list[str], world_hint: int, events: bool = False,
               helper: parallel.Helper | None = None, content: dict | None = None
               ) -> tuple[str | None, str | None, pd.DataFrame | None]:
    """Decode one trace (with the `helper` if any), reduce it and keep the reduction in the first of
    `targets` that accepts it, keyed on `content` (the trace's hash taken before the decode, else taken
    here). Returns (what is wrong with the file, None, None) or (None, the file written, the events when asked
    for). In a worker process, only this short answer goes back."""
    try:
        made_under = kept.key(path, world_hint, content)  # before the decode: a trace changed meanwhile is not answered for
        meta, frame, reduced = decode_rank(path, world_hint, helper=helper)
    except ValueError as exc:
        return str(exc), None, None
    except OSError as exc:
        return untrusted.unreadable(path, exc), None, None
    frame = frame if events else None
    written = None
    for target in targets:
        try:
            kept.KeptReduction(reduced, meta, os.path.basename(path), made_under).save(target)
            written = target
            break
        except OSError:
            continue
    del meta, reduced
    parallel.release_freed_memory()  # the trace's working set, before the next trace is parsed
    if written is None:
        return "could not write its reduction anywhere (folder and temporary folder refused)", None, None
    return None, written, frame


def uncompressed_size(path: str) -> int:
    """The JSON size of a trace: gzip's ISIZE trailer (size mod 4 GiB) or the file size; 0 for what is not a
    readable regular file (a dangling link, a folder, a FIFO: its parse says what is wrong with it)."""
    try:
        with untrusted.open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if path.endswith(".gz") and size >= 4:
                f.seek(-4, os.SEEK_END)
                size = max(size, int.from_bytes(f.read(4), "little"))
    except (OSError, untrusted.Refused):
        return 0
    return size


@dataclass
class Parsed:
    """One trace as the analysis reads it: its metadata, its reduction, its events when asked for."""
    meta: dict
    reduced: RankReduction
    events: pd.DataFrame | None = None


def _content(f: FolderFile) -> dict | None:
    """The trace's hash (taken once per listing); None when it cannot be read: its parse says why."""
    try:
        return f.content
    except (OSError, ValueError):
        return None


def parse_traces(traces: list[FolderFile], progress: Progress, workers: int | None = None, world_hint: int = 0,
                 events: bool = False) -> dict[str, Parsed | str]:
    """path -> its reduction (and events, when asked for) or the reason the file is unusable. Reductions
    come from the kept reductions that answer for their traces (`kept`), or traces are decoded `workers` at
    a time (None: `parse_workers`); when events are asked for, in this process, one trace at a time. Each
    trace's bytes are hashed once."""
    out: dict[str, Parsed | str] = {}
    todo = []
    files = [f.path for f in traces]
    by_path = {f.path: f for f in traces}
    there = [p for p in files if os.path.lexists(kept.kept_path(p))]
    found = dict(zip(there, kept.load_many([kept.kept_path(p) for p in there])))
    for i, path in enumerate(files, 1):
        hit = found.get(path)
        if not (isinstance(hit, kept.KeptReduction) and hit.answers_for(path, world_hint, _content(by_path[path]))):
            todo.append(path)
            continue
        progress(f"parsing trace {i} of {len(files)}: {os.path.basename(path)} (from its kept reduction)")
        out[path] = Parsed(hit.meta, hit.reduced)
    workers = (1 if events or not todo else parallel.worker_count([uncompressed_size(p) for p in todo])
               if workers is None else max(1, min(workers, len(todo))))
    alone = (todo if workers == 1 else []) + ([p for p in files if p not in todo] if events else [])
    sharing = {p for p in alone if parallel.shares_work(uncompressed_size(p))}
    with parallel.helpers(1 if sharing else 0) as helping:  # forked while this process is small
        def helper_for(path: str) -> parallel.Helper | None:
            return helping[0] if helping and path in sharing else None

        if todo:
            _parse(files, [by_path[p] for p in todo], out, progress, workers, world_hint, events, helper_for)
        for path, parsed in out.items():
            if events and isinstance(parsed, Parsed) and parsed.events is None:
                try:
                    parsed.events = decode_rank(path, world_hint, reduce=False, helper=helper_for(path))[1]
                except ValueError as exc:
                    out[path] = str(exc)
    return {p: out[p] for p in files}


SCRATCH_PREFIX = "dstrace-parse-"
_SCRATCH = re.compile(re.escape(SCRATCH_PREFIX) + r"(\d+)-")


def _scratch_folder() -> str:
    """A new scratch folder for reductions the run folder refuses, named by this process's id; the folders of
    analyses that were killed before they could remove theirs (their process is gone) are removed first."""
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        m = _SCRATCH.match(name)
        path = os.path.join(base, name)
        if m and not _alive(int(m.group(1))) and not os.path.islink(path) and os.path.isdir(path) \
                and os.stat(path).st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _parse(files: list[str], traces: list[FolderFile], out: dict, progress: Progress, workers: int, world_hint: int,
           events: bool, helper_for: Callable[[str], parallel.Helper | None]) -> None:
    """Parse the `traces` into `out`: one at a time (each with its `helper_for` helper), or this process the
    smallest and `workers - 1` forked workers the others. A trace that changed since it was hashed (its kept
    reduction is keyed on that hash) is refused."""
    scratch = _scratch_folder()
    todo = [f.path for f in traces]
    contents = [_content(f) for f in traces]
    try:
        targets = [[kept.kept_path(p), os.path.join(scratch, f"{n}{kept.SUFFIX}")] for n, p in enumerate(todo)]
        for path in todo:
            progress(f"parsing trace {files.index(path) + 1} of {len(files)}: {os.path.basename(path)}")
        hints = [world_hint] * len(todo)
        if workers == 1:
            results = [parse_rank(p, t, w, events, helper_for(p), c) for p, t, w, c in zip(todo, targets, hints, contents)]
        else:  # this process parses the smallest trace itself (it analyzes the run after), the workers the rest
            own = min(range(len(todo)), key=lambda i: uncompressed_size(todo[i]))
            others = [i for i in range(len(todo)) if i != own]
            with parallel.workers(workers - 1) as pool:
                rest = [pool.submit(parse_rank, todo[i], targets[i], hints[i], False, None, contents[i]) for i in others]
                mine = parse_rank(todo[own], targets[own], hints[own], content=contents[own])
                results = [r.result() for r in rest]
            results.insert(own, mine)
        unchanged = [problem is None and not f.changed_since_hashed() for f, (problem, _, _) in zip(traces, results)]
        for ok, (problem, written, _) in zip(unchanged, results):
            if problem is None and not ok:
                with contextlib.suppress(OSError):
                    os.unlink(written)  # a reduction of other bytes than its key's
        back = iter(kept.load_many([w for ok, (_, w, _) in zip(unchanged, results) if ok]))
        for f, content, ok, (problem, _, frame) in zip(traces, contents, unchanged, results):
            hit = next(back) if ok else None
            fresh = isinstance(hit, kept.KeptReduction) and hit.answers_for(f.path, world_hint, content)
            out[f.path] = problem or (Parsed(hit.meta, hit.reduced, frame) if fresh
                                      else "changed while it was being parsed; analyze again")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _odd_events(path: str, data: dict) -> list[str]:
    """One warning per kind of event no profiler writes (`tracefile.event_checks`), with how many."""
    checks = data.get(tracefile.CHECKS_KEY)
    if not isinstance(checks, dict):
        return []
    name, out = os.path.basename(path), []
    if checks.get("negative_durations"):
        out.append(f"{name}: {checks['negative_durations']} event(s) with a negative duration, taken as written: not "
                   "what a profiler writes; its breakdowns may be wrong")
    if checks.get("overlaps"):
        out.append(f"{name}: {checks['overlaps']} event(s) start inside the event before them on the same thread "
                   f"and end more than {tracefile.OVERLAP_TOLERANCE_US:g} us after it (overlapping, not nested): the host "
                   "breakdowns take a thread's events as nested and may be off around them")
    if checks.get("duplicate_keys"):
        keys = ", ".join(sorted(set(checks["duplicate_keys"])))[:200]
        out.append(f"{name}: {len(checks['duplicate_keys'])} key(s) given twice in one object ({keys}); the last of "
                   "each is used")
    return out


def _run_id_of(ours: dict | None) -> str | None:
    """The run id of the dstrace metadata, when it is text (`folder.implausible` warns of anything else)."""
    run_id = (ours or {}).get("run_id")
    return run_id if isinstance(run_id, str) else None


def folder_records(folder: RunFolder, warnings: list[str],
                   skipped: list[dict[str, str]]) -> tuple[dict[int, Manifest], RunRecord | None]:
    """The folder's rank manifests and run.json, whatever the ranks are read from (traces or kept reductions);
    one that cannot be read is skipped, with a warning."""
    records = folder.records
    for f, reason in records.skipped:
        skipped.append({"path": f.path, "reason": reason})
        warnings.append(f"skipped {f.name}: {reason}")
    return records.manifests, records.run


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
            warnings.append(f"skipped the files of another run {other} ({ranks_text(ranks)}); {RUN_FILE} names run {run.run_id}")
        return run.run_id
    listing = "; ".join(f"run {rid} ({ranks_text(r)})" for rid, r in sorted(by_run.items()))
    raise UserError(f"ranks of different runs are mixed in {trace_dir}: {listing}; put each run in its own folder")


def _declared_world(manifests: dict[int, Manifest], run: RunRecord | None) -> int:
    """The world size the manifests and run.json give (0 when neither does)."""
    return max([m.world_size for m in manifests.values()] + [(run.world_size or 0) if run else 0])


def no_trace_reasons(manifests: dict[int, Manifest]) -> str:
    """Why the ranks left no trace, each reason once with the ranks it holds for."""
    return "; ".join(by_rank_lines({rank: why_no_trace(m) or "the rank wrote no trace"
                                    for rank, m in manifests.items()}))


def _manifests_only(trace_dir: str, manifests: dict[int, Manifest], run: RunRecord | None,
                    warnings: list[str], skipped: list[dict[str, str]]) -> LoadedRun:
    """The ranks stopped before their profiling window: what the manifests say is all there is."""
    run_ids = {m.run_id for m in manifests.values()}
    if len(run_ids) > 1:
        raise UserError(f"manifests of different runs are mixed in {trace_dir}: {', '.join(sorted(run_ids))}")
    world = _declared_world(manifests, run)
    warnings.append(f"no traces in {trace_dir}: {no_trace_reasons(manifests)}; only the manifests are analyzed")
    return LoadedRun(trace_dir=trace_dir, traces={}, world_size=world, run_id=run_ids.pop(),
                     manifests=manifests, run_record=run, warnings=warnings, skipped=skipped)


def load_run(run_dir: str | RunFolder, progress: Progress = say, workers: int | None = None,
             events: bool = False) -> LoadedRun:
    """Read and validate a run folder (its path, or its listing when the caller has one). Raises UserError when
    nothing in it can be analyzed. `workers`: how many traces to parse at once (None: as many as CPUs and
    memory allow); `events`: keep every rank's events (the timeline needs them; the analysis reads the ranks'
    reductions only)."""
    folder = run_dir if isinstance(run_dir, RunFolder) else run_folder(run_dir)
    trace_dir = folder.path
    warnings: list[str] = []
    skipped: list[dict[str, str]] = []
    files = folder.trace_candidates  # a single trace: the file alone, none of its folder's other files
    alone = folder.kept_alone
    manifests, run = folder_records(folder, warnings, skipped)
    for rank, m in sorted(manifests.items()):
        if m.exit_error:
            warnings.append(f"rank {rank} ended with {error_line(m.exit_error)}")
    if not files and not alone:
        if not manifests:
            raise UserError(f"no trace files (*.pt.trace.json or *.pt.trace.json.gz) in {trace_dir}")
        return _manifests_only(trace_dir, manifests, run, warnings, skipped)

    world_hint = _declared_world(manifests, run)
    parsed: list[tuple[str, dict, dict | None, Parsed]] = []
    results = parse_traces(files, progress, workers, world_hint, events) if files else {}
    if alone:
        progress(f"reading {len(alone)} kept reduction{'s' if len(alone) > 1 else ''} whose "
                 f"{'traces are' if len(alone) > 1 else 'trace is'} not in the folder")
    untraced = set()
    for path, got in zip(alone, kept.load_many(alone, progress)):
        if isinstance(got, str):
            results[path] = got
        else:
            trace = os.path.join(trace_dir, got.trace_file)
            if trace in results or os.path.lexists(trace):
                results[path] = f"the reduction of {got.trace_file}, which has its own in the folder: remove it"
                continue
            results[trace] = Parsed(got.meta, got.reduced)
            untraced.add(trace)
    for path, result in results.items():
        if isinstance(result, str):
            skipped.append({"path": path, "reason": result})
            warnings.append(f"skipped {os.path.basename(path)}: {result}")
            continue
        parsed.append((path, result.meta, dstrace_metadata(result.meta), result))
    if not parsed:
        reasons = "; ".join(f"{os.path.basename(s['path'])}: {s['reason']}" for s in skipped)
        raise UserError(f"no usable trace in {trace_dir} ({reasons})")

    claims: dict[int, list[str]] = defaultdict(list)
    traces: dict[int, RankTrace] = {}
    for path, meta, ours, parsed_rank in parsed:  # meta: the trace's metadata; ours: its dstrace block
        warnings.extend(implausible(path, meta, ours))
        warnings.extend(_odd_events(path, meta))
        rank, _ = rank_of(path, meta, ours)
        if rank is None and len(parsed) == 1:
            rank = 0
        if rank is None:
            skipped.append({"path": path, "reason": "no rank in it (no distributedInfo, no dstrace metadata, no rankN in the name)"})
            warnings.append(f"skipped {os.path.basename(path)}: cannot tell which rank wrote it")
            continue
        if ours and isinstance(ours.get("rank"), int) and ours["rank"] != rank:
            warnings.append(f"{os.path.basename(path)}: distributedInfo says rank {rank}, dstrace metadata says {ours['rank']}; using {rank}")
        claims[rank].append(path)
        traces[rank] = RankTrace(
            rank=rank, path=path, reduced=parsed_rank.reduced, events=parsed_rank.events, world_size=world_of(meta, ours),
            host=host_of(path, meta), run_id=_run_id_of(ours),
            distributed=meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None,
            dstrace=ours, trace_absent=path in untraced,
        )
    duplicated = {r: p for r, p in claims.items() if len(p) > 1}
    if duplicated:
        rank, paths = min(duplicated.items())
        names = " and ".join(os.path.basename(p) for p in paths)
        raise UserError(f"two traces claim rank {rank} in {trace_dir}: {names}; keep one trace per rank")
    if not traces:
        raise UserError(f"no trace in {trace_dir} says which rank wrote it; name them <host>_rank<N>.pt.trace.json.gz")

    loaded = settle_run(trace_dir, traces, manifests, run, warnings, skipped)
    parallel.release_freed_memory()  # the files read and their batches, now that the run is its tables
    return loaded


def settle_run(trace_dir: str, ranks: dict[int, RankTrace], manifests: dict[int, Manifest], run: RunRecord | None,
               warnings: list[str], skipped: list[dict]) -> LoadedRun:
    """One run per folder, and its world size, whether its ranks come from traces or from kept reductions:
    ranks of other runs are refused (or skipped when run.json names ours), and so are manifests of
    another run; the world size is the largest any file gives, with a warning where they disagree."""
    source = "traces" if not any(t.trace_absent for t in ranks.values()) else "kept reductions"
    run_id = _choose_run(ranks, run, trace_dir, warnings, skipped)
    for rank, m in sorted(manifests.items()):
        if run_id and m.run_id != run_id:
            raise UserError(f"{source} of different runs are mixed in {trace_dir}: rank{rank}{MANIFEST_SUFFIX} is from "
                            f"run {m.run_id} but the {source} are from run {run_id}; put each run in its own folder")
    if run_id is None and manifests:
        run_id = next(iter(manifests.values())).run_id

    sizes = {t.world_size for t in ranks.values() if t.world_size} | {m.world_size for m in manifests.values()}
    if run is not None and run.world_size:
        sizes.add(run.world_size)
    world_size = max(sizes | {max(ranks) + 1})
    if len(sizes) > 1:
        warnings.append(f"{source} and manifests disagree on the world size ({sorted(sizes)}); using {world_size}")
    loaded = LoadedRun(trace_dir=trace_dir, traces=ranks, world_size=world_size, run_id=run_id,
                       manifests=manifests, run_record=run, warnings=warnings, skipped=skipped)
    if loaded.missing_ranks:
        neither = "trace" if source == "traces" else "trace or kept reduction"
        warnings.append(f"no {neither} for {ranks_text(loaded.missing_ranks)} of world size {world_size} "
                        f"({len(loaded.missing_ranks)} missing): collectives of a group with a member missing get no "
                        "wait/transfer split")
    return loaded
