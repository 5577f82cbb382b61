"""A run read (partly) from kept reductions whose traces are not in the folder: the report says which ranks were
read so, in words that fit how many, and names what is missing as what could have stood for it."""
import json
import os
import shutil

from dstrace.analysis.kept import write_run_reductions
from dstrace.analysis.loading import load_run
from dstrace.analysis.results import Finding
from dstrace.analysis.pipeline import _trace_pointers, analyze
from dstrace.analysis.render import render
from tests.fixtures.reports import quiet
from tests.fixtures.traces import TraceBuilder


def three_of_four(folder):
    """Ranks 0-2 of a 4-rank job, each with its kept reduction beside it, then rank 1's trace taken away."""
    folder.mkdir()
    for r in range(3):
        b = TraceBuilder(r, world_size=4)
        b.compute(0.0, 100.0)
        b.write(str(folder))
    traces = {int(p.name.split("_rank")[1].split(".")[0]): p.name for p in sorted(folder.glob("*.pt.trace.json.gz"))}
    assert write_run_reductions(str(folder), traces, 4) == []
    os.remove(folder / traces[1])
    return folder, traces


def test_each_rank_says_whether_it_was_read_from_its_trace_or_its_kept_reduction(tmp_path):
    folder, traces = three_of_four(tmp_path / "run")
    a = analyze(load_run(str(folder), progress=quiet))
    doc = json.loads(render(a, "json"))
    assert {r: v["read_from"] for r, v in doc["ranks"].items()} == {"0": "trace", "1": "kept reduction", "2": "trace"}
    assert os.path.basename(doc["ranks"]["1"]["file"]) == traces[1] and not os.path.exists(doc["ranks"]["1"]["file"])


def test_one_rank_read_from_its_kept_reduction_is_said_in_the_singular(tmp_path):
    folder, _ = three_of_four(tmp_path / "run")
    notes = analyze(load_run(str(folder), progress=quiet)).notes
    assert f"rank 1 read from its kept reduction (*.reduction.arrow): its trace is not in {folder}" in notes
    assert not any("their" in n for n in notes)


def test_several_ranks_read_from_kept_reductions_are_said_in_the_plural(tmp_path):
    folder, traces = three_of_four(tmp_path / "run")
    os.remove(folder / traces[2])
    notes = analyze(load_run(str(folder), progress=quiet)).notes
    assert f"ranks 1, 2 read from their kept reductions (*.reduction.arrow): their traces are not in {folder}" in notes


def test_a_missing_rank_of_a_run_read_from_kept_reductions_has_neither(tmp_path):
    folder, _ = three_of_four(tmp_path / "run")
    warnings = load_run(str(folder), progress=quiet).warnings
    assert any(w.startswith("no trace or kept reduction for rank 3 of world size 4 (1 missing)") for w in warnings)
    traced = tmp_path / "traced"
    shutil.copytree(folder, traced, ignore=shutil.ignore_patterns("*rank1*"))
    assert any(w.startswith("no trace for ranks 1, 3 of world size 4 (2 missing)")
               for w in load_run(str(traced), progress=quiet).warnings)


def test_a_finding_names_its_one_rank_trace_in_the_singular(tmp_path):
    folder, traces = three_of_four(tmp_path / "run")
    run = load_run(str(folder), progress=quiet)
    one = Finding("host-bound", [0, 1], "", {})
    assert _trace_pointers(run, [one]) == [f"host-bound: its rank's trace, not in {folder}: rank 1: {traces[1]}"]
    os.remove(folder / traces[2])
    two = Finding("host-bound", [1, 2], "", {})
    assert _trace_pointers(load_run(str(folder), progress=quiet), [two]) == [
        f"host-bound: its ranks' traces, not in {folder}: rank 1: {traces[1]}; rank 2: {traces[2]}"]
