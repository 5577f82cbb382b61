"""A real recorded run folder to corrupt: one generate() rank with its trace, manifest and run.json."""
from __future__ import annotations

import shutil
import sys

import pytest

from tests.fixtures.paths import JOB
from tests.fixtures.processes import dstrace
from tests.fixtures.traces import write_zero3_traces


@pytest.fixture(scope="session")
def recorded(tmp_path_factory) -> str:
    run_dir = str(tmp_path_factory.mktemp("base") / "run")
    r = dstrace("record", "-o", run_dir, sys.executable, JOB)
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


@pytest.fixture
def copy_of(recorded, tmp_path):
    """A fresh copy of the recorded folder, without the caches an earlier analysis left."""
    def make(name: str = "run") -> str:
        dest = str(tmp_path / name)
        shutil.copytree(recorded, dest, ignore=shutil.ignore_patterns(".*"))
        return dest
    return make


@pytest.fixture
def small_run(tmp_path) -> str:
    """A hand-made 2-rank ZeRO-3 run (two GPU-shaped traces): seconds to analyze, for the output and input cases."""
    folder = tmp_path / "small"
    folder.mkdir()
    write_zero3_traces(str(folder), world_size=2, steps=3, layers=3)
    return str(folder)
