"""A real recorded run folder to corrupt: one generate() rank with its trace, manifest and run.json."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.conftest import SCRIPTS, dstrace


@pytest.fixture(scope="session")
def recorded(tmp_path_factory) -> str:
    run_dir = str(tmp_path_factory.mktemp("base") / "run")
    r = dstrace("record", "-o", run_dir, sys.executable, os.path.join(SCRIPTS, "job.py"))
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
    from tests.analysis import synthetic

    folder = tmp_path / "small"
    folder.mkdir()
    for b in synthetic.zero3_run(str(folder), world_size=2, steps=3, layers=3):
        b.write(str(folder))
    return str(folder)
