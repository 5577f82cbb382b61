"""A recorded run whose profiled window holds one step (a 3-step DDP loop): `record` reduces its traces and
`analyze` reads them (issue 24: every such run failed its reduction with a pandas TypeError, and `record`
still called it complete); a rank whose reduction fails makes the run incomplete, with the error line."""
from __future__ import annotations

import gzip
import json
import os
import shutil

import pytest

from dstrace.commands.record import finish
from dstrace.runfolder.names import REDUCTION_SUFFIX, reduction_name
from dstrace.runfolder.records import RUN_SCHEMA, RunRecord
from tests.fixtures.paths import LAUNCH
from tests.fixtures.processes import dstrace, torchrun
from tests.fixtures.runs import read_json, trace_paths


@pytest.fixture(scope="module")
def three_step_run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("one_step") / "ddp3")
    result = dstrace("record", "-o", run_dir, "--", *torchrun(), os.path.join(LAUNCH, "ddp_train.py"), "--steps", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result


def test_a_one_step_window_is_reduced_and_analyzed(three_step_run):
    run_dir, result = three_step_run
    run = read_json(os.path.join(run_dir, "run.json"))
    assert "no kept reduction" not in result.stderr
    assert run["status"] == "complete" and run["problems"] == []
    assert sorted(n for n in os.listdir(run_dir) if n.endswith(REDUCTION_SUFFIX)) == sorted(
        reduction_name(os.path.basename(p)) for p in trace_paths(run_dir))
    for path in trace_paths(run_dir):
        with gzip.open(path) as f:
            steps = {e["name"] for e in json.load(f)["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
        assert len(steps) == 1  # the window holds one step: the case that failed
    analyzed = dstrace("analyze", run_dir, "--format", "json")
    assert analyzed.returncode == 0, analyzed.stderr[-3000:]
    assert json.loads(analyzed.stdout)["steps"]["source"] == "ProfilerStep ranges"


def test_a_failed_reduction_makes_the_run_incomplete(three_step_run, tmp_path):
    run_dir = str(tmp_path / "copy")
    shutil.copytree(three_step_run[0], run_dir)
    for name in os.listdir(run_dir):
        if name.endswith(REDUCTION_SUFFIX):
            os.unlink(os.path.join(run_dir, name))
    damaged = next(p for p in trace_paths(run_dir) if "_rank1." in p)
    with open(damaged, "r+b") as f:
        f.truncate(os.path.getsize(damaged) // 2)
    run = RunRecord(schema=RUN_SCHEMA, run_id="copy", command=["torchrun"], cwd="/", started=1.0, status="running")
    finish(run_dir, run, 0)
    assert run.status == "incomplete"
    (line,) = [p for p in run.problems if p.startswith("rank 1: no kept reduction: ")]
    assert "\n" not in line and len(line) > len("rank 1: no kept reduction: ")
    kept = next(p for p in trace_paths(run_dir) if "_rank0." in p)
    assert os.path.exists(os.path.join(run_dir, reduction_name(os.path.basename(kept))))
