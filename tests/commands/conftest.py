"""The verbs' fixtures: a SLURM cluster of two nodes on this host for the tests that run the real srun."""
from __future__ import annotations

import os

import pytest

from tests.fixtures import slurm


@pytest.fixture(scope="session")
def slurm_cluster():
    """Started for the session and stopped after it. Skipped, saying why, where it cannot start; `make test`
    sets DSTRACE_REQUIRE_SLURM=1 after installing it, and there it fails instead."""
    try:
        cluster = slurm.start()
    except slurm.SlurmUnavailable as why:
        if os.environ.get("DSTRACE_REQUIRE_SLURM") == "1":
            pytest.fail(f"no SLURM cluster: {why}")
        pytest.skip(f"no SLURM cluster: {why}")
    yield cluster
    cluster.stop()
