"""Bad input to `dstrace view` is one line on stderr and a non-zero exit, never a traceback."""
from __future__ import annotations

import pytest

from tests.fixtures.processes import dstrace


def assert_one_line(result, words: str):
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("dstrace: ") and words in last, result.stderr


@pytest.mark.parametrize("modes, words", [((), "given: none"), (("--perfetto", "--report"), "--perfetto and --report")])
def test_exactly_one_view(gpu_run, modes, words):
    assert_one_line(dstrace("view", gpu_run, *modes), words)


@pytest.mark.parametrize("mode", ["--tensorboard", "--perfetto", "--report"])
def test_missing_folder(tmp_path, mode):
    assert_one_line(dstrace("view", str(tmp_path / "nope"), mode), "is not a folder")


@pytest.mark.parametrize("mode", ["--tensorboard", "--perfetto", "--report"])
def test_folder_without_traces(tmp_path, mode):
    assert_one_line(dstrace("view", str(tmp_path), mode), "no trace files")


@pytest.mark.parametrize("steps, words", [("2-4", "FIRST:LAST"), ("4:2", "comes before"), ("40:41", "rank 0 has steps 0 to 3")])
def test_bad_step_window(gpu_run, tmp_path, steps, words):
    assert_one_line(dstrace("view", gpu_run, "--perfetto", "--steps", steps, "-o", str(tmp_path / "x.pftrace")), words)


def test_option_of_another_view(gpu_run):
    assert_one_line(dstrace("view", gpu_run, "--tensorboard", "--steps", "1:2"), "--steps do(es) not apply")
