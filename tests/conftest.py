"""Session-wide fixtures shared by every area; what they are built from lives in tests/fixtures/."""
from __future__ import annotations

import pytest

from tests.fixtures.processes import record_zero3_chat


@pytest.fixture(scope="session")
def zero3_run(tmp_path_factory):
    """The report's path, tiny, under real DeepSpeed ZeRO-3 on two gloo ranks, via torchrun."""
    run_dir = str(tmp_path_factory.mktemp("runs") / "zero3")
    result = record_zero3_chat(run_dir, "--max-new-tokens", "8")
    return run_dir, result
