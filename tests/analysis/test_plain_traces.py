"""Real 2-rank gloo runs on CPU (rank 1 late to every collective): the straggler's cause and remedy, the
wait/transfer split, and `dstrace compare` over a folder of plain torch.profiler traces."""
from __future__ import annotations

import json
import os


from dstrace.analysis.results import span_parts
from dstrace.comparison.compare import compare_runs
from dstrace.comparison.facts import WITHOUT_MANIFESTS
from dstrace.comparison.render import render
from tests.fixtures.processes import dstrace
from tests.fixtures.reports import analyze_dir, quiet


def test_the_late_rank_is_named_as_the_straggler_with_cause_and_remedy(gloo_run_dir):
    a = analyze_dir(gloo_run_dir)
    f = next(f for f in a.findings if f.id == "peer-wait")
    caused = {r: s.caused_wait_us for r, s in a.ranks.items()}
    late = max(caused, key=caused.get)
    assert late == 1  # the job sleeps on rank 1 before each AllGather
    assert f.ranks == [0] and f"rank {late} arrives last" in f.summary
    assert f"rank {late} reaches them later" in f.cause and f"find what rank {late} does" in f.remedy
    waiting = span_parts(a.ranks[0])
    assert waiting["wait for peers"] > waiting["transfer"]


def test_plain_traces_analyze_from_their_profiler_steps(plain_gloo_run_dir):
    a = analyze_dir(plain_gloo_run_dir)
    assert not any(n.endswith(".manifest.json") for n in os.listdir(plain_gloo_run_dir))
    assert a.steps.source == "ProfilerStep ranges"
    assert a.steps.ms_per_step == a.steps.ms_median and "no manifests" in a.steps.ms_per_step_covers


def test_compare_reads_plain_traces_and_says_what_it_cannot_know(plain_gloo_run_dir, tmp_path):
    run = tmp_path / "plain" / "rep1"
    run.mkdir(parents=True)
    for name in os.listdir(plain_gloo_run_dir):
        if name.endswith(".pt.trace.json.gz"):
            os.link(os.path.join(plain_gloo_run_dir, name), run / name)
    c = compare_runs([str(tmp_path / "plain")], progress=quiet)
    config = c.configs[0]
    a = analyze_dir(run)
    assert config.name == "plain" and config.status == "complete"
    assert config.ms_per_step.median == a.steps.ms_per_step
    assert config.gathered_bytes_per_step == a.steps.gathered_bytes_median > 0
    waits = sorted(s.wait_us / s.span_us for s in a.ranks.values())
    assert config.wait_share == sum(waits) / 2 and config.wait_share > config.transfer_share
    assert config.effective_tp is None and config.deepspeed_versions == []
    assert WITHOUT_MANIFESTS in config.notes
    text = render(c, "text")
    assert "no dstrace manifests" in text and "wait for peers" in text
    proc = dstrace("compare", str(tmp_path / "plain"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["configs"][0]["notes"] == [WITHOUT_MANIFESTS] and doc["configs"][0]["wait_share"] > 0
