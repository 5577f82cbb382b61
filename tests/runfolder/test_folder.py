"""`RunFolder`: a run folder listed once, every file classified once, its records read once, one world cap
for every file, each trace hashed once per analysis (issue #29)."""
from __future__ import annotations

import gzip
import json
import os

from dstrace.analysis.loading import load_run
from dstrace.runfolder import folder as rf
from dstrace.runfolder.names import reduction_name
from dstrace.runfolder.records import MAX_WORLD

RANK0 = "hostA_rank0.1700000000000.pt.trace.json.gz"

KINDS = {
    RANK0: rf.TRACE, "hostA_rank1.1700000000000.pt.trace.json": rf.TRACE,
    "rank0.manifest.json": rf.MANIFEST, "rank0.reduction.arrow": rf.REDUCTION, "run.json": rf.RUN,
    "unrecorded.hostA.123.json": rf.UNRECORDED, "nodes": rf.NODES, "deepspeed_env": rf.DEEPSPEED_ENV,
    ".dstrace-report.json.cache": rf.DERIVED,
    "dstrace-report.html": rf.DERIVED, "dstrace-merged.pftrace": rf.DERIVED, ".run.json.abc123.tmp": rf.DERIVED,
    "other_tool.json": rf.JSON, "notes.txt": rf.OTHER,
}


def test_every_file_of_a_run_folder_is_classified_by_its_name_once(tmp_path):
    for name in KINDS:
        if name == "nodes":
            (tmp_path / name).mkdir()
            (tmp_path / name / "node0.json").write_text("{}")
        else:
            (tmp_path / name).write_text("{}")
    folder = rf.RunFolder.scan(str(tmp_path))
    assert {f.name: f.kind for f in folder.files} == KINDS
    assert [f.name for f in folder.traces] == sorted(n for n, k in KINDS.items() if k == rf.TRACE)
    assert [f.rank for f in folder.traces] == [0, 1]
    assert [f.name for f in rf.node_files(str(tmp_path))] == ["node0.json"]
    assert "nodes" not in {f.name for f in folder.run_files} and rf.DERIVED not in {f.kind for f in folder.run_files}


def test_without_profiler_traces_every_other_json_is_a_trace_candidate(tmp_path):
    for name in ("rank0.manifest.json", "run.json", "a.json", "b.json.gz", "notes.txt"):
        (tmp_path / name).write_text("{}")
    assert [f.name for f in rf.RunFolder.scan(str(tmp_path)).trace_candidates] == ["a.json", "b.json.gz"]


def test_one_world_cap_for_traces_as_for_manifests():
    """A trace may claim what a manifest may hold (0 <= rank < world <= MAX_WORLD), and nothing beyond; a trace
    of a 100,000-rank job was ignored before (its cap was 2^16, the manifests' 2^20)."""
    assert rf.plausible(MAX_WORLD, 1) and not rf.plausible(MAX_WORLD + 1, 1)
    assert rf.plausible(MAX_WORLD - 1, 0) and not rf.plausible(MAX_WORLD, 0)
    meta = {"distributedInfo": {"rank": 99_999, "world_size": 100_000}}
    assert rf.rank_of("x.pt.trace.json", meta, None) == (99_999, "distributedInfo")
    assert rf.world_of(meta, None) == 100_000 and rf.implausible("x.pt.trace.json", meta, None) == []


def test_a_trace_changed_after_it_was_hashed_is_refused_not_read_under_the_old_hash(small_run):
    """The kept reduction is keyed on the hash taken once per listing: a trace rewritten after that hash (and
    before its decode ended) must not leave a reduction of the new bytes under the old key."""
    folder = rf.RunFolder.scan(small_run)
    trace = next(f for f in folder.traces if f.name == RANK0)
    before = trace.content
    data = json.loads(gzip.open(trace.path).read())
    data["traceEvents"] = data["traceEvents"][: len(data["traceEvents"]) // 2]
    with gzip.open(trace.path, "wt") as f:
        json.dump(data, f)
    assert trace.content == before and trace.changed_since_hashed()
    run = load_run(folder, progress=lambda message: None)
    assert sorted(run.traces) == [1]
    assert any(s["path"] == trace.path and "changed while it was being parsed" in s["reason"] for s in run.skipped)
    assert not os.path.exists(os.path.join(small_run, reduction_name(RANK0)))
    assert sorted(load_run(small_run, progress=lambda message: None).traces) == [0, 1]  # listed and hashed anew
