"""`dstrace compare` over the committed H200 sweep (traces/h200-sweep-qwen2-1.5b): waiting is not
communicating, and remedies carry what the sweep measured."""
from __future__ import annotations

import re
import statistics

import pytest

from dstrace.comparison.compare import compare_runs
from dstrace.comparison.render import render
from tests.fixtures.paths import SWEEP
from tests.fixtures.reports import configs_by_name, quiet


@pytest.fixture(scope="module")
def comparison():
    return compare_runs([SWEEP], progress=quiet)


def test_collective_time_splits_into_transfer_and_wait(comparison):
    from dstrace.analysis.loading import load_run
    from dstrace.analysis.pipeline import analyze

    zero3 = configs_by_name(comparison)["zero3-ds016-tp"]
    traced = next(r for r in zero3.runs if r.transfer_share is not None)
    a = analyze(load_run(traced.path, progress=quiet))
    assert traced.wait_share == pytest.approx(statistics.median(s.wait_us / s.span_us for s in a.ranks.values()))
    assert traced.transfer_share + traced.wait_share == pytest.approx(
        statistics.median((s.comm_us) / s.span_us for s in a.ranks.values()), rel=0.05)
    assert zero3.wait_share > 5 * zero3.transfer_share  # in this run nearly all collective time is waiting
    text = render(comparison, "text")
    head = next(line for line in text.splitlines() if re.match(r" +configuration +transfer +wait for peers ", line))
    assert " comm " not in head
    why = next(e for e in comparison.verdict.explanations
               if e.id == "model-regathered-every-step" and e.configs == ["zero3-ds016-tp"])
    assert f"{zero3.wait_share:.0%} waiting for peers" in why.summary and "communication" not in why.summary


def test_remedies_carry_the_measured_alternatives(comparison):
    configs = configs_by_name(comparison)
    f = next(e for e in comparison.verdict.explanations if e.id == "tp-not-applied")
    gathering_nothing = [c for c in configs.values() if c.ms_per_step is not None and not c.gathered_bytes_per_step]
    assert {c.name for c in gathering_nothing} == {"device-map", "autotp"}  # what the sweep recorded
    for c in gathering_nothing:
        assert f"{c.name} (effective TP {c.effective_tp}, gathers nothing) {c.ms_per_step.median:.1f} ms/step" in f.remedy
    assert "init_inference" in f.remedy


def test_ms_per_step_says_what_it_covers(comparison):
    covers = {c.ms_per_step_covers for c in comparison.configs if c.ms_per_step is not None}
    assert len(covers) == 1 and "the profiler's start and stop steps left out" in covers.pop()
    assert "ms/step: median ms per decode step of each run" in render(comparison, "markdown")
