"""Bad input: each case gets one clear line (UserError) or, when partly usable, a warning naming what was skipped."""
import os

import pytest

from dstrace.analysis.loading import load_run
from dstrace.errors import UserError
from tests.fixtures.processes import dstrace
from tests.fixtures.reports import analyze_dir, quiet
from tests.fixtures.runs import write_manifest, write_run_record
from tests.fixtures.traces import TraceBuilder


def two_ranks(folder, **kw):
    paths = []
    for r in range(2):
        b = TraceBuilder(r, **kw)
        b.nccl("AllReduce", 100.0, 50.0, 10, 10)
        b.compute(200.0, 50.0)
        paths.append(b.write(str(folder)))
    return paths


def test_empty_folder(tmp_path):
    with pytest.raises(UserError, match="no trace files"):
        load_run(str(tmp_path), progress=quiet)


def test_not_a_folder(tmp_path):
    with pytest.raises(UserError, match="is not a folder"):
        load_run(str(tmp_path / "nope"), progress=quiet)


def test_truncated_file_is_skipped_with_a_warning(tmp_path):
    paths = two_ranks(tmp_path)
    data = open(paths[1], "rb").read()
    with open(paths[1], "wb") as f:
        f.write(data[: len(data) // 2])
    run = load_run(str(tmp_path), progress=quiet)
    assert run.ranks == [0]
    assert run.skipped[0]["path"] == paths[1] and "truncated or corrupt" in run.skipped[0]["reason"]
    assert any(os.path.basename(paths[1]) in w for w in run.warnings)
    assert any("no trace for rank 1 of world size 2" in w for w in run.warnings)


def test_only_corrupt_files(tmp_path):
    (tmp_path / "a_rank0.pt.trace.json").write_text('{"traceEvents": [')
    (tmp_path / "b_rank1.pt.trace.json").write_text('["not", "a", "trace"]')
    with pytest.raises(UserError, match="no usable trace") as err:
        load_run(str(tmp_path), progress=quiet)
    assert "\n" not in str(err.value)
    assert "not a torch.profiler trace" in str(err.value)


def test_two_traces_claim_the_same_rank(tmp_path):
    two_ranks(tmp_path)
    TraceBuilder(0).write(str(tmp_path), "other_rank0.1.pt.trace.json")
    with pytest.raises(UserError, match="two traces claim rank 0"):
        load_run(str(tmp_path), progress=quiet)


def test_missing_ranks_of_the_world(tmp_path):
    for r in (0, 2):
        b = TraceBuilder(r, world_size=4)
        b.nccl("AllReduce", 100.0 + r, 50.0, 10, 10, ranks=(0, 1, 2, 3))
        b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    assert a.world_size == 4 and a.ranks_found == [0, 2] and a.missing_ranks == [1, 3]
    assert any("no trace for ranks 1, 3 of world size 4" in w for w in a.warnings)
    ar = a.ranks[0].collectives["AllReduce"]  # its group lacks ranks 1 and 3: no split (test_partial_traces)
    assert ar.unsplit_us == pytest.approx(50.0) and ar.wait_us == 0.0


def test_traces_of_different_runs(tmp_path):
    TraceBuilder(0, run_id="run-a").write(str(tmp_path))
    TraceBuilder(1, run_id="run-b").write(str(tmp_path))
    with pytest.raises(UserError, match="different runs are mixed.*run run-a \\(rank 0\\); run run-b \\(rank 1\\)"):
        load_run(str(tmp_path), progress=quiet)


def test_run_record_picks_the_run_and_skips_the_stranger(tmp_path):
    two_ranks(tmp_path)
    TraceBuilder(2, world_size=2, run_id="run-old").write(str(tmp_path))
    write_run_record(str(tmp_path))
    run = load_run(str(tmp_path), progress=quiet)
    assert run.ranks == [0, 1] and run.run_id == "run-1"
    assert any("run-old" in w for w in run.warnings)


def test_manifest_of_another_run(tmp_path):
    two_ranks(tmp_path)
    write_manifest(str(tmp_path), 1, run_id="run-2")
    with pytest.raises(UserError, match="rank1.manifest.json is from run run-2 but the traces are from run run-1"):
        load_run(str(tmp_path), progress=quiet)


def test_dstrace_metadata_as_string_and_no_distributed_info(tmp_path):
    two_ranks(tmp_path, distributed=False, dstrace_meta="string")
    run = load_run(str(tmp_path), progress=quiet)
    assert run.ranks == [0, 1] and run.run_id == "run-1" and run.world_size == 2


def test_plain_traces_take_the_rank_from_the_name_and_unnamed_ones_are_skipped(tmp_path):
    two_ranks(tmp_path, distributed=False, dstrace_meta=None)
    TraceBuilder(0, distributed=False, dstrace_meta=None, host=None).write(str(tmp_path), "mystery.pt.trace.json")
    run = load_run(str(tmp_path), progress=quiet)
    assert run.ranks == [0, 1] and run.run_id is None
    assert any("mystery.pt.trace.json" in w and "cannot tell which rank" in w for w in run.warnings)


def test_single_process_multi_gpu_device_map_trace(tmp_path):
    """HF device_map: one process, no distributedInfo, two GPUs used one after the other."""
    b = TraceBuilder(0, distributed=False, dstrace_meta=None, host=None)
    for i in range(4):
        b.compute(i * 200.0, 100.0, device=0, stream=7)
        b.compute(i * 200.0 + 100.0, 100.0, device=1, stream=7)
        b.kernel("Memcpy PtoP (Device -> Device)", i * 200.0 + 99.0, 2.0, device=1, stream=9, cat="gpu_memcpy")
    b.write(str(tmp_path), "trace.json")
    a = analyze_dir(tmp_path)
    assert a.ranks_found == [0] and a.world_size == 1 and a.device == "gpu"
    devices = a.ranks[0].devices
    assert set(devices) == {"0", "1"}
    assert devices["0"]["busy_us"] == pytest.approx(400.0)
    assert a.ranks[0].span_us == pytest.approx(800.0)
    assert devices["1"]["busy_us"] == pytest.approx(4 * 101.0)  # the copy starts 1 us before the kernel
    assert a.ranks[0].busy_us["memory"] == pytest.approx(8.0)
    assert a.ranks[0].collectives == {}


def test_cli_prints_one_line_and_exits_nonzero(tmp_path):
    proc = dstrace("analyze", str(tmp_path))
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [f"dstrace: no trace files (*.pt.trace.json or *.pt.trace.json.gz) in {tmp_path}"]
    assert "Traceback" not in proc.stderr


def test_manifests_without_traces_still_report_the_manifest_findings(tmp_path):
    """DeepSpeed 0.19.8 refuses {"tensor_parallel": {"tp_size": N}} before any trace is written."""
    for r in range(2):
        write_manifest(str(tmp_path), r, tp_request=2, tp_error=True,
                       error_message="1 validation error for TPTrainingConfig\ntp_size\n  Extra inputs are "
                                     "not permitted [type=extra_forbidden, input_value=2, input_type=int]\n"
                                     "    For further information visit https://errors.pydantic.dev/2.14/v/extra_forbidden")
    a = analyze_dir(tmp_path)
    assert a.device == "none" and a.ranks_found == [0, 1] and a.missing_ranks == []  # found by their manifests
    f = next(f for f in a.findings if f.id == "tp-config-rejected")
    assert f.ranks == [0, 1]
    assert f.summary.endswith("TPTrainingConfig / tp_size / Extra inputs are not permitted "
                              "[type=extra_forbidden, input_value=2, input_type=int]")
    assert any("no traces in" in w for w in a.warnings)


