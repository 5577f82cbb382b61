"""The typed decode, the reduction kept beside each trace, and parallel parsing give the same frames as before.

No timing here: bench/ measures speed. These check that what is fast is also right.
"""
import dataclasses
import glob
import gzip
import json
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dstrace.analysis import hta_adapter, hta_breakdown, kept, loading, parallel, tracefile
from dstrace.analysis.loading import load_run
from dstrace.runfolder.folder import RunFolder
from dstrace.analysis.pipeline import analyze
from dstrace.analysis.render import render
from tests.fixtures.paths import ROOT, TRACES
from tests.fixtures.reports import quiet
from tests.fixtures.traces import TraceBuilder, write_zero3_traces

REFERENCE = os.path.join(TRACES, "h200-zero3-tp2-ds0.16.1")


def reference_events_frame(trace_events: list) -> pd.DataFrame:
    """The events frame as dstrace built it from `json.loads` output before the typed decoder: the oracle.
    Args are kept for the events whose args an analysis reads (`tracefile.reads_args`) only."""
    rows = []
    for e in trace_events:
        if not isinstance(e, dict) or e.get("ph") != "X" or "ts" not in e:
            continue
        args = (e.get("args") or {}) if tracefile.reads_args(e.get("cat", ""), e.get("name", "")) else {}
        row = [e.get("name", ""), e.get("cat", ""), e.get("pid"), e.get("tid"), float(e["ts"]), float(e.get("dur") or 0.0)]
        row.extend(args.get(key) for _, key in loading.ARG_COLUMNS)
        rows.append(row)
    df = pd.DataFrame(rows, columns=["name", "cat", "pid", "tid", "ts", "dur"] + [c for c, _ in loading.ARG_COLUMNS])
    for i, (col, _) in enumerate(loading.ARG_COLUMNS):  # text args stay plain objects, None where absent
        if df[col].dtype.kind not in "iuf":
            df[col] = pd.Series([row[6 + i] for row in rows], dtype=object) if rows else df[col].astype(object)
    df["name"] = df["name"].astype(str)
    df["cat"] = df["cat"].astype(str)
    df["end"] = df["ts"] + df["dur"]
    df["is_gpu"] = df["cat"].isin(loading.GPU_CATEGORIES)
    for col in ("stream", "device", "correlation"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df.loc[~df["is_gpu"], "stream"] = -1
    return df[loading.EVENT_COLUMNS]


def assert_same_events(new: pd.DataFrame, old: pd.DataFrame):
    """Same rows and values; integer-valued arg columns may come back as float64 where the old frame had int64,
    and names and categories are categoricals of the same text."""
    assert list(new.columns) == list(old.columns)
    new, old = new.reset_index(drop=True), old.reset_index(drop=True)
    for col in ("name", "cat"):
        assert isinstance(new[col].dtype, pd.CategoricalDtype)
        assert new[col].astype(str).tolist() == old[col].tolist()
    new, old = new.drop(columns=["name", "cat"]), old.drop(columns=["name", "cat"])
    pd.testing.assert_frame_equal(new, old, check_dtype=False)
    for col in new.columns:
        if old[col].dtype.kind not in "iuf":
            assert new[col].dtype == old[col].dtype, col


def zero3_folder(folder, world_size=2):
    write_zero3_traces(str(folder), world_size=world_size, steps=3, layers=3)
    return folder


def caches(folder):
    return sorted(glob.glob(os.path.join(str(folder), f"*{kept.SUFFIX}")))


def kept_of(trace_path):
    return kept.KeptReduction.load(kept.kept_path(trace_path))


def test_events_frame_matches_the_json_loads_frame(tmp_path):
    b = TraceBuilder(0)
    b.host_range("dstrace/step#1", 0.0, 500.0)
    b.nccl("AllGather", 100.0, 50.0, 10, 20)
    b.compute(200.0, 50.0)
    path = b.write(str(tmp_path))
    _, columns = tracefile.read_trace(path)
    assert_same_events(loading.events_frame(columns), reference_events_frame(b.to_dict()["traceEvents"]))


def test_kineto_layout_is_parsed_in_pieces_like_the_whole_file(monkeypatch):
    path = sorted(glob.glob(os.path.join(REFERENCE, "*.pt.trace.json.gz")))[0]
    monkeypatch.setattr(tracefile, "CHUNK_BYTES", 1 << 20)  # many pieces
    meta, builder = tracefile._read_pieces(path)
    pieces = builder.finish()
    whole_meta, whole = tracefile._read_whole(path)
    assert meta == whole_meta and len(pieces) == len(whole) > 0
    assert_same_events(loading.events_frame(pieces), loading.events_frame(whole))
    with gzip.open(path) as f:
        events = json.loads(f.read())["traceEvents"]
    assert_same_events(loading.events_frame(pieces), reference_events_frame(events))


def same_columns(a: tracefile.Columns, b: tracefile.Columns) -> None:
    """Equal decodes: the same rows and values, whatever the order of the code tables."""
    assert len(a) == len(b) > 0 and a.present == b.present and a.ts_all_int == b.ts_all_int
    for field in ("position", "ts", "dur", "has_dur"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    for c in tracefile.CODED:
        assert [a.tables[c][i] for i in a.codes[c]] == [b.tables[c][i] for i in b.codes[c]], c
    for c in a.args:
        x, y = a.arg(c), b.arg(c)
        assert x.dtype == y.dtype, c
        assert np.array_equal(x, y, equal_nan=True) if x.dtype != object else x.tolist() == y.tolist(), c


@pytest.mark.parametrize("ways", [2, 3])
def test_a_trace_decoded_by_several_processes_is_the_trace_decoded_by_one(monkeypatch, ways):
    path = sorted(glob.glob(os.path.join(REFERENCE, "*.pt.trace.json.gz")))[0]
    monkeypatch.setattr(tracefile, "CHUNK_BYTES", 1 << 20)  # many pieces, handed out in turn
    meta, alone = tracefile.read_trace(path)
    split_meta, split = tracefile.read_trace(path, ways)
    assert split_meta == meta
    same_columns(split, alone)


def test_damage_in_a_helpers_piece_is_reported_as_when_decoded_alone(tmp_path, monkeypatch):
    """A bad value in the second piece (decoded by the helper) gives the message the single decode gives."""
    path = sorted(glob.glob(os.path.join(REFERENCE, "*.pt.trace.json.gz")))[0]
    with gzip.open(path) as f:
        text = f.read()
    at = text.index(b'"ts": ', (4 << 20) + 4096)  # in piece 3 of the 1 MiB pieces: the helper's, with ways=2
    damaged = tmp_path / "host_rank0.1.pt.trace.json"
    damaged.write_bytes(text[:at] + b'"ts": "soon", "was": ' + text[at + 6:])
    monkeypatch.setattr(tracefile, "CHUNK_BYTES", 1 << 20)
    with pytest.raises(ValueError) as alone:
        tracefile.read_trace(str(damaged))
    with pytest.raises(ValueError) as split:
        tracefile.read_trace(str(damaged), 2)
    assert str(split.value) == str(alone.value) and "ts" in str(alone.value)


def test_one_helper_serves_traces_in_turn_after_damaged_ones(tmp_path, monkeypatch):
    """Every decode a helper began is answered, even when this process's share failed: the next trace's
    decode never reads a stale answer."""
    path = sorted(glob.glob(os.path.join(REFERENCE, "*.pt.trace.json.gz")))[0]
    with gzip.open(path) as f:
        text = f.read()
    at = text.index(b'"ts": ', (1 << 20) + 4096)  # in piece 2 of the 1 MiB pieces: this process's
    damaged = tmp_path / "host_rank0.1.pt.trace.json"
    damaged.write_bytes(text[:at] + b'"ts": "soon", "was": ' + text[at + 6:])
    truncated = tmp_path / "host_rank0.2.pt.trace.json"  # found out at its end, after pieces were handed out
    truncated.write_bytes(text[:-2000])
    monkeypatch.setattr(tracefile, "CHUNK_BYTES", 1 << 20)
    meta, alone = tracefile.read_trace(path)
    with parallel.helpers(1) as helping:
        for bad in (damaged, truncated, damaged):
            with pytest.raises(ValueError):
                tracefile.read_trace(str(bad), helping=helping)
            again_meta, again = tracefile.read_trace(path, helping=helping)
            assert again_meta == meta
            same_columns(again, alone)
        assert helping[0].submit(divmod, 9, 4).result() == (2, 1)


def test_hta_frame_gives_what_htas_own_parse_gives():
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.common.trace import Trace

    path = sorted(glob.glob(os.path.join(REFERENCE, "*.pt.trace.json.gz")))[0]
    meta, columns = tracefile.read_trace(path)
    ours = hta_breakdown.rank_breakdowns(path, meta, columns).result()
    assert ours.problems == []
    with hta_adapter.quiet():
        t = Trace(trace_files={0: path}, trace_dir=REFERENCE)
        t.load_traces(include_last_profiler_step=True, use_multiprocessing=False, use_memory_profiling=False)
        theirs = BreakdownAnalysis.get_temporal_breakdown(t, visualize=False).iloc[0]
        idle = BreakdownAnalysis.get_idle_time_breakdown(t, hta_breakdown.IDLE_CONSECUTIVE_KERNEL_DELAY_NS, rank=0,
                                                         visualize=False)[0]
    assert ours.temporal.idle_us == float(theirs["idle_time(us)"])
    assert ours.temporal.compute_us == float(theirs["compute_time(us)"])
    assert ours.idle_causes_us == {str(k): float(v) for k, v in idle.groupby("idle_category")["idle_time"].sum().items()}


def assert_same_ranks(a, b, events=True):
    """The same reductions (frames and dicts) and, when loaded, the same events in both runs."""
    assert a.ranks == b.ranks
    for r in a.traces:
        ra, rb = vars(a.traces[r].reduced), vars(b.traces[r].reduced)
        for key in kept.FRAMES:
            pd.testing.assert_frame_equal(ra[key], rb[key])
        assert {k: v for k, v in ra.items() if k not in kept.FRAMES} == \
            {k: v for k, v in rb.items() if k not in kept.FRAMES}
        if events:
            pd.testing.assert_frame_equal(a.traces[r].events, b.traces[r].events)


def test_second_load_reads_the_kept_reductions_and_gives_the_same_analysis(tmp_path):
    zero3_folder(tmp_path)
    messages = []
    first = load_run(str(tmp_path), progress=messages.append, events=True)
    assert len(caches(tmp_path)) == 2
    listed = [f.path for f in RunFolder.scan(str(tmp_path)).trace_candidates]
    assert listed == sorted(glob.glob(str(tmp_path / "*.pt.trace.json.gz")))
    again = []
    second = load_run(str(tmp_path), progress=again.append, events=True)
    assert not any("from its kept reduction" in m for m in messages) and all("from its kept reduction" in m for m in again)
    assert_same_ranks(first, second)
    assert render(analyze(first), "json") == render(analyze(second), "json")


def test_the_analysis_holds_reductions_not_events(tmp_path):
    zero3_folder(tmp_path)
    with_events = load_run(str(tmp_path), progress=quiet, events=True)
    run = load_run(str(tmp_path), progress=quiet)
    assert all(t.events is None for t in run.traces.values())
    assert all(len(t.reduced.collectives) < len(with_events.traces[r].events) for r, t in run.traces.items())
    assert_same_ranks(run, with_events, events=False)
    assert render(analyze(run), "json") == render(analyze(with_events), "json")


def test_a_reduction_kept_under_another_world_size_is_parsed_again(tmp_path):
    zero3_folder(tmp_path)
    path = sorted(glob.glob(str(tmp_path / "*.pt.trace.json.gz")))[0]
    load_run(str(tmp_path), progress=quiet)
    assert kept_of(path).answers_for(path, 0) and not kept_of(path).answers_for(path, 4)


def test_a_reduction_kept_by_other_code_is_parsed_again_where_its_trace_is(tmp_path):
    """With its trace in the folder, a kept reduction answers only when this code made it of these bytes: one
    made by another dstrace (or forged: nothing seals it) is decoded again and replaced."""
    zero3_folder(tmp_path)
    first = load_run(str(tmp_path), progress=quiet)
    path = first.traces[0].path
    old = kept_of(path)
    old.reduced.utilization["span_us"] = 1.0  # what another code made of the same trace
    dataclasses.replace(old, key={**old.key, "code": "another"}).save(kept.kept_path(path))
    messages = []
    second = load_run(str(tmp_path), progress=messages.append)
    assert sum("from its kept reduction" not in m for m in messages) == 1
    assert second.traces[0].reduced.utilization["span_us"] == first.traces[0].reduced.utilization["span_us"] != 1.0
    assert kept_of(path).answers_for(path, 0)


def test_a_changed_trace_is_parsed_again(tmp_path):
    zero3_folder(tmp_path)
    first = load_run(str(tmp_path), progress=quiet)
    b = TraceBuilder(0)
    b.compute(10.0, 5.0)
    path = first.traces[0].path
    b.write(str(tmp_path), os.path.basename(path))
    messages = []
    second = load_run(str(tmp_path), progress=messages.append, events=True)
    assert any(m.endswith(os.path.basename(path)) for m in messages)
    assert len(second.traces[0].events) == len(reference_events_frame(b.to_dict()["traceEvents"]))


def test_a_new_mtime_on_the_same_bytes_keeps_the_kept_reduction(tmp_path):
    """The key is the content: touching a trace cannot change its answer, so it costs no decode."""
    zero3_folder(tmp_path)
    load_run(str(tmp_path), progress=quiet)
    path = sorted(glob.glob(str(tmp_path / "*.pt.trace.json.gz")))[0]
    later = time.time() + 5
    os.utime(path, (later, later))
    messages = []
    load_run(str(tmp_path), progress=messages.append)
    assert messages and all("from its kept reduction" in m for m in messages)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "other trace"])
def test_a_damaged_kept_reduction_is_ignored_where_its_trace_is(tmp_path, damage):
    zero3_folder(tmp_path)
    first = load_run(str(tmp_path), progress=quiet, events=True)
    target = caches(tmp_path)[0]
    data = open(target, "rb").read()
    other = caches(tmp_path)[1]
    payload = {"garbage": b"not a reduction at all", "truncated": data[: len(data) // 2], "empty": b"",
               "other trace": open(other, "rb").read()}[damage]
    with open(target, "wb") as f:
        f.write(payload)
    messages = []
    second = load_run(str(tmp_path), progress=messages.append, events=True)
    assert sum("parsing trace" in m and "from its kept reduction" not in m for m in messages) == 1
    assert_same_ranks(first, second)
    assert all(kept_of(t.path).answers_for(t.path, 0) for t in first.traces.values())


def test_a_folder_that_refuses_the_kept_reduction_is_still_analyzed(tmp_path):
    zero3_folder(tmp_path)
    for path in glob.glob(str(tmp_path / "*.pt.trace.json.gz")):
        os.mkdir(kept.kept_path(path))  # the file's name is taken by a folder: writing there fails
    run = load_run(str(tmp_path), progress=quiet)
    assert run.ranks == [0, 1] and all(os.path.isdir(p) for p in caches(tmp_path))


@pytest.mark.parametrize("workers", [2, 3])
def test_parallel_parse_gives_what_serial_parse_gives(tmp_path, workers):
    """This process parses the smallest trace, `workers - 1` forked workers the others."""
    os.makedirs(tmp_path / "a")
    zero3_folder(tmp_path / "a", world_size=4)
    serial = load_run(str(tmp_path / "a"), progress=quiet, workers=1)
    for path in caches(tmp_path / "a"):
        os.unlink(path)
    parallel = load_run(str(tmp_path / "a"), progress=quiet, workers=workers)
    assert serial.ranks == parallel.ranks == [0, 1, 2, 3]
    assert len(caches(tmp_path / "a")) == 4
    assert_same_ranks(serial, parallel, events=False)
    assert render(analyze(serial), "json") == render(analyze(parallel), "json")


def test_breakdowns_shared_with_a_helper_are_those_of_one_process():
    path = sorted(glob.glob(os.path.join(REFERENCE, "*.pt.trace.json.gz")))[0]
    meta, columns = tracefile.read_trace(path)
    alone = hta_breakdown.rank_breakdowns(path, meta, columns).result()
    with parallel.helpers(1) as (helper,):
        meta, columns = tracefile.read_trace(path, helping=[helper])
        shared = hta_breakdown.rank_breakdowns(path, meta, columns, helper).result()
    assert alone.problems == [] and set(alone.to_json()) >= {"temporal", "kernel_types_us", "idle_causes_us"}
    assert json.dumps(shared.stored()) == json.dumps(alone.stored())  # the same entries in the same order


def test_a_helper_job_that_ends_the_helper_is_an_error_here():
    with parallel.helpers(1) as (helper,):
        assert helper.submit(divmod, 7, 2).result() == (3, 1)
        ended = helper.submit(os._exit, 3)
        with pytest.raises(parallel.HelperGone):
            ended.result()
        assert helper.submit(divmod, 7, 2) is None  # gone: the caller does the work itself


def test_a_job_that_does_not_pickle_is_left_to_the_caller_and_the_helper_serves_on():
    with parallel.helpers(1) as (helper,):
        assert helper.submit(divmod, lambda: 0, 2) is None  # a lambda does not pickle: nothing was sent
        assert helper.submit(divmod, 7, 2).result() == (3, 1)


def test_a_helper_gone_before_its_share_leaves_the_breakdowns_to_this_process():
    path = sorted(glob.glob(os.path.join(REFERENCE, "*.pt.trace.json.gz")))[0]
    meta, columns = tracefile.read_trace(path)
    alone = hta_breakdown.rank_breakdowns(path, meta, columns).result()
    with parallel.helpers(1) as (helper,):
        helper.kill()
        given = hta_breakdown.rank_breakdowns(path, meta, columns, helper).result()
    assert json.dumps(given.stored()) == json.dumps(alone.stored())


def test_a_helper_that_dies_with_its_share_leaves_that_share_out_and_says_so(tmp_path):
    """The helper is busy (a job of the test's) when its share is handed over, then killed: this process's
    breakdowns stay, the helper's are left out with a problem line each."""
    path = write_zero3_traces(str(tmp_path), world_size=2, steps=1, layers=1)[0]
    with parallel.helpers(1) as (helper,):
        meta, columns = tracefile.read_trace(path, helping=[helper])
        assert helper.submit(time.sleep, 60)  # the share below waits in the pipe (a small trace: it fits)
        pending = hta_breakdown.rank_breakdowns(path, meta, columns, helper)
        helper.kill()
        given = pending.result()
    assert given.temporal is not None and given.idle_causes_us is not None
    assert given.kernel_types_us is None and given.top_kernels is None and given.comm_comp_overlap_pct is None
    assert [p.split(" left out")[0] for p in given.problems] == [f"HTA {label}" for label in hta_breakdown.HELPER_SHARE]
    assert all("helper process ended" in p for p in given.problems)


def test_sparse_args_read_densely_over_any_rows():
    path = sorted(glob.glob(os.path.join(REFERENCE, "*.pt.trace.json.gz")))[0]
    _, columns = tracefile.read_trace(path)
    rows = np.flatnonzero(np.arange(len(columns)) % 3 == 1)
    for name in columns.args:
        whole, some = columns.arg(name), columns.arg(name, rows)
        assert whole.dtype == some.dtype and len(whole) == len(columns), name
        assert whole[rows].tolist() == some.tolist() if whole.dtype == object else \
            np.array_equal(whole[rows], some, equal_nan=True), name
    assert columns.present["correlation"] and not np.isnan(columns.arg("correlation")).all()
    assert columns.arg("correlation", rows[:0]).shape == (0,)


def test_plotting_modules_are_stood_in_for_until_used():
    """HTA imports plotly's plotting modules; the breakdowns never plot, so they load only when used."""
    code = ("import sys; from dstrace.analysis import hta_adapter as h; h.import_analyzers(); "
            "print('narwhals' in sys.modules); import hta.analyzers.breakdown_analysis as b; "
            "print(b.make_subplots(rows=1, cols=2).layout.xaxis.domain, b.px.bar is not None, b.go.Figure().layout.width)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.split("\n")[:2] == ["False", "(0.0, 0.45) True None"]


def test_parse_workers_hold_the_memory_budget():
    """2x the largest trace or 512 MiB, whichever is more; CPUs and free memory bound it too."""
    mb, gb = 1 << 20, 1 << 30
    eight = [300 * mb] * 8
    assert parallel.workers_for(eight, cpus=2, in_use=80 * mb, available=20 * gb) == 1  # 2 would need 960 MB
    assert parallel.workers_for([28 * mb] * 2, cpus=2, in_use=80 * mb, available=20 * gb) == 2
    assert parallel.workers_for([60 * mb] * 8, cpus=16, in_use=170 * mb, available=20 * gb) == 3
    assert parallel.workers_for([2 * gb] * 8, cpus=16, in_use=200 * mb, available=64 * gb) == 1  # 4 GB budget
    assert parallel.workers_for([60 * mb] * 8, cpus=16, in_use=170 * mb, available=100 * mb) == 1
    assert parallel.workers_for([10 * mb] * 2, cpus=8, in_use=0, available=gb) == 1  # too little to parse


def test_parse_workers_is_one_for_little_work(tmp_path):
    paths = write_zero3_traces(str(tmp_path), world_size=2, steps=1, layers=1)
    assert parallel.worker_count([loading.uncompressed_size(p) for p in paths]) == 1
    with gzip.open(paths[0]) as f:
        assert loading.uncompressed_size(paths[0]) == len(f.read())


def stream_of(path: str) -> pa.Buffer:
    """A kept reduction's Arrow IPC stream: its file is one zstd frame of it."""
    with open(path, "rb") as f:
        return pa.CompressedInputStream(f, "zstd").read_buffer()


def test_the_kept_reduction_is_one_arrow_table_of_its_frames(tmp_path):
    """Arrow IPC in a zstd frame, no pickle: a `frame` column, the frames' columns side by side, texts
    dictionary-encoded."""
    zero3_folder(tmp_path)
    run = load_run(str(tmp_path), progress=quiet)
    table = pa.ipc.open_stream(stream_of(caches(tmp_path)[0])).read_all()
    reduced = run.traces[0].reduced
    assert table.schema.names == ["frame"] + [f"{name}.{c}" for name in kept.FRAMES
                                              for c in getattr(reduced, name).columns]
    frames = table.column("frame").to_numpy()
    assert [int((frames == n).sum()) for n in range(3)] == [len(getattr(reduced, name)) for name in kept.FRAMES]
    assert pa.types.is_dictionary(table.schema.field("collectives.kind").type)
    assert json.loads(table.schema.metadata[b"dstrace"])["format"] == kept.FORMAT


def test_a_ranks_kept_reduction_is_kilobytes_with_its_schema_once(tmp_path):
    """A rank of the 256-rank synthetic run (360 collectives) keeps a file of a few kB (an uncompressed IPC
    file was 64 kB: the nulls of the frames side by side, and the schema and its metadata twice), whose stream
    holds the head once; and it reads back as the reduction saved."""
    from dstrace.testing.scale_run import write_run

    write_run(str(tmp_path), world=256, ranks=[0])
    (path,) = caches(tmp_path)
    assert os.path.getsize(path) < 16 << 10
    stream = stream_of(path).to_pybytes()
    assert stream.count(b'"trace_file"') == 1 and stream.count(b'"span_us"') == 1
    saved = kept.KeptReduction.load(path)
    saved.save(str(tmp_path / "again.reduction.arrow"))
    assert open(tmp_path / "again.reduction.arrow", "rb").read() == open(path, "rb").read()


def test_a_reduction_kept_by_an_older_dstrace_is_refused_by_its_format(tmp_path):
    """An uncompressed IPC file, as dstrace.reduction/1 kept them: one line naming its format, without its
    trace; where its trace is, the trace is decoded again."""
    zero3_folder(tmp_path)
    load_run(str(tmp_path), progress=quiet)
    path = caches(tmp_path)[0]
    table = kept._table(kept.KeptReduction.load(path))
    head = json.loads(table.schema.metadata[kept.META_KEY])
    table = table.replace_schema_metadata({kept.META_KEY: json.dumps(head | {"format": "dstrace.reduction/1"})})
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    (problem,) = kept.load_many([path])
    assert problem == (f"not a {kept.FORMAT} reduction (dstrace.reduction/1: written by another dstrace "
                       "version?); remove it, or keep its trace beside it")
    messages = []
    assert load_run(str(tmp_path), progress=messages.append).ranks == [0, 1]
    assert sum("parsing trace" in m and "from its kept reduction" not in m for m in messages) == 1
