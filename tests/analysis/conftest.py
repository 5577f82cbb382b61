"""Fixtures: synthetic GPU-shaped runs written to tmp_path, and one real 2-rank gloo run (session-wide)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.fixtures.runs import write_manifest, write_run_record
from tests.fixtures.traces import write_zero3_traces


HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def zero3_dir(tmp_path):
    write_zero3_traces(str(tmp_path))
    return tmp_path


@pytest.fixture
def full_run(zero3_dir) -> str:
    """`zero3_dir` as `dstrace record` leaves it: a manifest per rank (tensor parallel 2 asked for, not
    applied) and the run record."""
    for r in range(2):
        write_manifest(str(zero3_dir), r, tp_request=2)
    write_run_record(str(zero3_dir))
    return str(zero3_dir)


def run_gloo_job(out, *extra: str) -> None:
    env = dict(os.environ, DSTRACE_TEST_RUN_ID="gloo-e2e", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         os.path.join(HERE, "gloo_job.py"), str(out), *extra],
        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="session")
def gloo_job_output(tmp_path_factory):
    """What the gloo job wrote, as it wrote it: no test analyses this folder (analysing one leaves cache
    files in it); tests take a copy (`gloo_run_dir`, `fresh_gloo_run_dir`)."""
    out = tmp_path_factory.mktemp("gloo_job")
    run_gloo_job(out)
    return out


@pytest.fixture(scope="session")
def gloo_run_dir(gloo_job_output, tmp_path_factory):
    """Real CPU traces: torchrun of gloo_job.py, 2 ranks, rank 1 late to every collective. Shared by every
    test of the session: it may hold the caches earlier tests' analyses left."""
    out = tmp_path_factory.mktemp("gloo_run")
    shutil.copytree(gloo_job_output, out, dirs_exist_ok=True)
    return out


@pytest.fixture
def fresh_gloo_run_dir(gloo_job_output, tmp_path):
    """The gloo job's folder as the job left it, this test's own copy: nothing analysed it before."""
    out = tmp_path / "gloo_run"
    shutil.copytree(gloo_job_output, out)
    return out


@pytest.fixture(scope="session")
def plain_gloo_run_dir(tmp_path_factory):
    """The same job profiled with torch.profiler alone: ProfilerStep#n steps, no dstrace ranges or manifests."""
    out = tmp_path_factory.mktemp("plain_gloo_run")
    run_gloo_job(out, "plain")
    return out
