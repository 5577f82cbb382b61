"""Cause, remedy and the numbers behind them on the committed H200 runs (traces/h200-*).

Expectations are derived from what each run recorded (manifests, per-rank waits and idle times), and
the runs are chosen so that each branch (straggler and jitter, 'mostly in' and top three) is exercised.
"""
from __future__ import annotations

import os
import re
import statistics

import pytest

from dstrace.analysis.findings import communication, host, parallelism
from dstrace.analysis.findings.host import host_wait_share
from dstrace.analysis.render import render
from dstrace.analysis.render.common import rank_rows
from dstrace.analysis.results import SPAN_PARTS, shares, span_parts
from dstrace.analysis.shift import SHIFT_RATIO, UNREPRESENTATIVE_RATIO
from dstrace.analysis.steps import decode_step_ms
from dstrace.explain import doc_link
from dstrace.runfolder.records import read_manifest
from dstrace.units import ms
from tests.fixtures.paths import ROOT, TRACES
from tests.fixtures.reports import analyze_dir, findings_by_id

RUNS = {
    "tp2-ds016": "h200-zero3-tp2-ds0.16.1",
    "ds0198": "h200-zero3-ds0.19.8",
    "refused": "h200-zero3-tp2-ds0.19.8",
    "device-map": "h200-device-map",
    "sweep-tp2-ds016": "h200-sweep-qwen2-1.5b/zero3-ds016-tp/rep1",
}


@pytest.fixture(scope="module")
def runs():
    return {k: analyze_dir(os.path.join(TRACES, v)) for k, v in RUNS.items()}


def manifests(key: str) -> dict:
    folder = os.path.join(TRACES, RUNS[key])
    return {int(n[4:-len(".manifest.json")]): read_manifest(os.path.join(folder, n))
            for n in os.listdir(folder) if n.endswith(".manifest.json")}


def test_every_finding_says_why_and_what_to_do(runs):
    seen = set()
    for a in runs.values():
        for f in a.findings:
            assert len(f.cause) > 40 and len(f.remedy) > 40, f.id
            assert f.docs and os.path.exists(os.path.join(ROOT, f.docs.split("#")[0])), f.docs
            seen.add(f.id)
    assert {"tp-not-applied", "tp-config-rejected", "zero3-gathers-model-per-step", "host-bound", "peer-wait",
            "mutual-wait", "step-time-shift", "window-not-representative"} <= seen


def test_tp_not_applied_cause_names_the_installed_release_and_the_remedy_the_split(runs):
    f = findings_by_id(runs["tp2-ds016"])["tp-not-applied"]
    version = {m.versions["deepspeed"] for m in manifests("tp2-ds016").values()}.pop()
    assert parallelism.release(version) < parallelism.AUTOTP_FIXED  # the run's own DeepSpeed is of the era that ignored the key
    assert f"DeepSpeed {version}" in f.cause and "ignored" in f.cause
    assert "ZeRO-3 partitions parameter storage" in f.cause
    assert "deepspeed.init_inference" in f.remedy and "device_map" in f.remedy and "tp_plan" in f.remedy


def test_tp_config_rejected_cause_quotes_the_block_as_passed(runs):
    f = findings_by_id(runs["refused"])["tp-config-rejected"]
    m = manifests("refused")[0]
    block = next(c.config["tensor_parallel"] for c in m.deepspeed_calls if c.error)
    assert f"DeepSpeed {m.versions['deepspeed']}" in f.cause
    assert f'"tensor_parallel": {{"tp_size": {block["tp_size"]}}}' in f.cause
    assert "autotp_size" in f.remedy and "init_inference" in f.remedy


def test_zero3_cause_splits_the_gathers_into_transfer_and_wait(runs):
    a = runs["tp2-ds016"]
    f = findings_by_id(a)["zero3-gathers-model-per-step"]
    link = f.evidence["allgather_per_traced_step_us"]
    expect = statistics.median(a.ranks[r].collectives["AllGather"].wait_us / a.steps.per_rank[r]["count"]
                               for r in a.ranks)
    assert link["wait_us"] == pytest.approx(expect)
    assert f"{ms(link['wait_us'])} of waiting for peers" in f.cause


def test_span_parts_add_up_and_waiting_is_not_transfer(runs):
    for a in runs.values():
        for s in a.ranks.values():
            parts = span_parts(s)
            assert sum(parts.values()) == pytest.approx(s.span_us, rel=1e-9)
            assert parts["wait for peers"] <= s.wait_us + 1e-6
            assert sum(shares(parts).values()) == 100
        for row in rank_rows(a)[1]:
            assert sum(int(re.search(r"\((\d+)%\)", c).group(1)) for c in row[2:2 + len(SPAN_PARTS)]) == 100
    waiter = runs["tp2-ds016"].ranks[1]  # rank 1 of the report's scenario waits most of its collective time
    assert span_parts(waiter)["wait for peers"] > 5 * span_parts(waiter)["transfer"]


def straggler_share(a) -> dict[int, float]:
    """Per rank, the larger of its share of the last arrivals and of the wait it caused."""
    late = sum(s.late_count for s in a.ranks.values())
    caused = sum(s.caused_wait_us for s in a.ranks.values())
    return {r: max(s.late_count / late, s.caused_wait_us / caused) for r, s in a.ranks.items()}


def test_straggler_or_jitter_follows_who_is_last(runs):
    kinds = {}
    for key in ("tp2-ds016", "ds0198", "sweep-tp2-ds016"):
        a = runs[key]
        found = findings_by_id(a)
        share = straggler_share(a)
        top = max(share, key=share.get)
        if share[top] >= communication.STRAGGLER_SHARE:
            f = found["peer-wait"]
            assert "mutual-wait" not in found and top not in f.ranks
            assert f"rank {top} arrives last" in f.summary and f"rank {top}" in f.remedy
            kinds[key] = "straggler"
        else:
            f = found["mutual-wait"]
            assert "peer-wait" not in found and f.ranks == sorted(a.ranks)
            assert f.summary.startswith("no rank is consistently late")
            assert "host-side delays on every rank" in f.summary  # each rank of that run is host-bound
            kinds[key] = "jitter"
    assert set(kinds.values()) == {"straggler", "jitter"}  # both branches are exercised by real runs


def idle_fraction(s) -> float:
    return s.idle_us / s.span_us


def test_host_bound_names_the_worst_rank_first(runs):
    for key in ("tp2-ds016", "ds0198", "sweep-tp2-ds016", "device-map"):
        a = runs[key]
        f = findings_by_id(a)["host-bound"]
        worst = max(f.ranks, key=lambda r: idle_fraction(a.ranks[r]))
        assert f.ranks[0] == worst
        assert f.summary.startswith(f"GPU idle {idle_fraction(a.ranks[worst]):.0%} of ") and \
            f" on rank {worst}" in f.summary.split(";")[0]
        assert host_wait_share(a.ranks[worst].host_time) >= host.HOST_BOUND_HOST_WAIT_SHARE
    # the run where the lowest rank is not the worst one: rank 1 idles more than rank 0
    a = runs["ds0198"]
    assert idle_fraction(a.ranks[1]) > idle_fraction(a.ranks[0]) and findings_by_id(a)["host-bound"].ranks[0] == 1


def test_host_bound_says_mostly_only_when_it_is(runs):
    modes = set()
    for key in ("tp2-ds016", "device-map"):
        a = runs[key]
        f = findings_by_id(a)["host-bound"]
        s = a.ranks[f.ranks[0]]
        where = s.host_time.get("in_dstrace_ranges") or s.host_time.get("top_cpu_ops")
        name, us = next(iter(where.items()))
        if us / s.host_time["gpu_idle_us"] >= host.HOST_BOUND_MOSTLY_SHARE:
            assert f"mostly in {name}" in f.summary
            modes.add("mostly")
        else:
            assert "mostly" not in f.summary
            top3 = list(where)[:3]
            assert re.search(", ".join(rf"{re.escape(n)} \d+%" for n in top3), f.summary)
            modes.add("top three")
    assert modes == {"mostly", "top three"}


def test_one_ms_per_step_in_analyze_and_compare(runs):
    from dstrace.comparison.collect import read_facts
    from dstrace.comparison.model import RunRef

    for key in ("tp2-ds016", "device-map"):
        a = runs[key]
        samples = [x for m in manifests(key).values() for x in decode_step_ms(m)]
        assert a.steps.ms_per_step == pytest.approx(statistics.median(samples))
        path = os.path.join(TRACES, RUNS[key])
        facts = read_facts(RunRef(key, key, path))
        assert facts.ms_per_step == pytest.approx(a.steps.ms_per_step)
        text = render(a, "text")
        per_rank = max(len(decode_step_ms(m)) for m in manifests(key).values())
        assert (f"{a.steps.ms_per_step:.1f} ms per decode step: median of {len(samples)} step times ({per_rank} per "
                f"rank, {len(manifests(key))} rank") in text


def test_step_time_shift_on_a_traced_run(runs):
    f = findings_by_id(runs["tp2-ds016"])["step-time-shift"]
    call = f.evidence["calls"]["1"]
    step_ms = manifests("tp2-ds016")[0].calls[0].step_ms
    start = call["start"]
    before, after = statistics.median(step_ms[1:start]), statistics.median(step_ms[start:])
    assert max(before, after) / min(before, after) >= SHIFT_RATIO
    assert max(step_ms[start:]) < min(step_ms[1:start])  # a clean drop in this run: every later step is faster
    window = manifests("tp2-ds016")[0].window.recorded_steps
    assert call["window"]["where"] == ("before" if max(window) < start else "straddles")
    assert "lies only in the slower level" in f.summary
    assert f"--window-start {start - 1}" in f.remedy


def test_window_not_representative_when_the_window_lies_in_another_level(runs):
    """The window (steps 2-4) lies before the call's shift: its level is the unprofiled steps before the change,
    not the profiled steps (whose start and stop steps carry the profiler's own cost)."""
    from dstrace.analysis.step_kinds import step_kinds

    a = runs["tp2-ds016"]
    start = findings_by_id(a)["step-time-shift"].evidence["calls"]["1"]["start"]
    level = [x for m in manifests("tp2-ds016").values() for i, (x, kind) in
             enumerate(zip(m.calls[0].step_ms, step_kinds(m, m.calls[0]))) if 0 < i < start and kind == "unprofiled"]
    ratio = statistics.median(level) / a.steps.ms_per_step
    assert ratio >= UNREPRESENTATIVE_RATIO
    f = findings_by_id(a)["window-not-representative"]
    assert f.evidence["level_ms"] == pytest.approx(statistics.median(level))
    assert f.evidence["ratio"] == pytest.approx(ratio)


def test_step_time_shift_in_a_call_the_window_did_not_profile(runs):
    f = findings_by_id(runs["device-map"])["step-time-shift"]
    m = manifests("device-map")[0]
    shifted = [c for c, e in f.evidence["calls"].items() if e["window"]["where"] == "other call"]
    assert shifted and all(int(c) != m.window.call for c in shifted)
    assert "the trace shows neither level of this call" in f.summary


def test_step_time_shift_from_manifests_alone(tmp_path):
    src = os.path.join(TRACES, RUNS["device-map"])
    for name in ("rank0.manifest.json", "run.json"):
        with open(os.path.join(src, name)) as fin, open(tmp_path / name, "w") as fout:
            fout.write(fin.read())
    a = analyze_dir(tmp_path)
    assert a.device == "none"
    f = findings_by_id(a)["step-time-shift"]
    traced = findings_by_id(analyze_dir(src))["step-time-shift"]
    assert {c: e["start"] for c, e in f.evidence["calls"].items()} == \
        {c: e["start"] for c, e in traced.evidence["calls"].items()}


def test_report_formats_show_cause_remedy_and_the_legend(runs):
    a = runs["tp2-ds016"]
    text, md, html = (render(a, fmt) for fmt in ("text", "markdown", "html"))
    f = findings_by_id(a)["tp-not-applied"]
    assert "why: " in text and "what to do: " in text and "Terms used above" in text
    assert re.search(r"^  busbw w/o wait  +the same over transfer time", text, re.M)
    link = doc_link(f.docs)
    assert f"  - why: {f.cause}" in md and f"[docs/root-cause.md#1-the-mechanism]({link})" in md
    assert "<summary>Columns</summary>" in md
    assert "<b>why</b>" in html and f'href="{link}"' in html and "<dt>busbw w/o wait</dt>" in html


def test_root_cause_table_is_what_the_committed_traces_say():
    """docs/root-cause.md's per-rank table of the ZeRO-3 runs, row by row, against `dstrace analyze`."""
    with open(os.path.join(ROOT, "docs", "root-cause.md")) as f:
        doc = f.read()
    section = doc[doc.index("**Where the ZeRO-3 step goes on the H200s.**"):]
    rows, run = [], None
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not re.fullmatch(r"\d", cells[3]):
            continue
        named = re.match(r"\[`traces/([^`]+)`\]", cells[0])
        run = named.group(1) if named else run
        rows.append((run, cells[2], int(cells[3]), *(float(re.match(r"[\d.]+", c).group()) for c in cells[4:])))
    assert len(rows) == 6
    for run, ms_step, rank, idle, wait, transfer, busbw in rows:
        a = analyze_dir(os.path.join(TRACES, run))
        s = a.ranks[rank]
        gather = s.collectives["AllGather"]
        if ms_step:
            assert float(ms_step) == round(a.steps.ms_per_step, 1)
        assert idle == round(100 * s.idle_us / s.span_us)
        assert wait == round(100 * s.wait_us / s.comm_us)
        assert transfer == round(gather.transfer_us / a.steps.per_rank[rank]["count"] / 1e3, 1)
        assert busbw == round(gather.busbw_transfer_GBps)
