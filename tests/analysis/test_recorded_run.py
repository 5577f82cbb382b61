"""`dstrace analyze` on what `dstrace record` writes: the report's ZeRO-3 chat path, tiny, 2 gloo ranks.

Uses the session-wide `zero3_run` fixture of tests/conftest.py (shared with the recording tests).
"""

from tests.fixtures.processes import analyze_json
from tests.fixtures.reports import analyze_dir


def test_recorded_zero3_chat(zero3_run):
    run_dir, result = zero3_run
    assert result.returncode == 0, result.stderr[-3000:]
    a = analyze_dir(run_dir)
    assert a.run_id and a.ranks_found == [0, 1] and a.device == "cpu"
    assert set(a.ranks[0].collectives) >= {"AllGather"}
    assert a.steps is not None and a.steps.source == "dstrace/step ranges" and a.steps.count >= 1
    assert a.steps.model_bytes and a.steps.gathered_bytes_median
    assert "zero3-gathers-model-per-step" in {f.id for f in a.findings}
    assert not any(w.startswith("skipped") for w in a.warnings)


def test_recorded_run_through_the_dstrace_command(zero3_run):
    run_dir, _ = zero3_run
    assert analyze_json(run_dir)["schema"] == "dstrace.analysis/1"


def test_recorded_run_says_why_and_what_to_do(zero3_run):
    import statistics

    from dstrace.analysis.loading import load_run
    from dstrace.analysis.render import render
    from dstrace.analysis.steps import MANIFEST_COVERS, decode_step_ms

    run_dir, _ = zero3_run
    a = analyze_dir(run_dir)
    for f in a.findings:
        assert f.cause and f.remedy and f.docs, f.id
    f = next(f for f in a.findings if f.id == "zero3-gathers-model-per-step")
    assert f"each rank stores 1/{a.world_size} of every weight" in f.cause
    assert "deepspeed.init_inference" in f.remedy
    manifests = load_run(run_dir, progress=lambda m: None).manifests
    samples = [x for m in manifests.values() for x in decode_step_ms(m)]
    assert a.steps.ms_per_step_covers == MANIFEST_COVERS
    assert a.steps.ms_per_step == statistics.median(samples)
    assert f"{a.steps.ms_per_step:.1f} ms per decode step" in render(a, "text")
