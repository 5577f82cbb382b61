"""`dstrace compare` over hand-made run folders: grouping, numbers, refusals and the verdict's rules."""
from __future__ import annotations

import json
import os

import pytest

from dstrace.comparison.collect import find_runs
from dstrace.comparison.compare import compare_runs
from dstrace.errors import UserError
from tests.fixtures.processes import dstrace
from tests.fixtures.reports import configs_by_name, quiet
from tests.fixtures.runs import write_chat_run

GATHER = 4096


@pytest.fixture
def sweep_dir(tmp_path):
    """zero3 with and without tp_size (same structure), a refused one, an AutoTP one, a slow different one."""
    d = tmp_path / "sweep"
    steps = {1: [90.0, 10.0, 99.0, 99.0, 11.0, 12.0], 2: [90.0, 12.0, 99.0, 99.0, 13.0, 14.0]}
    for k in (1, 2):
        write_chat_run(str(d / "zero3" / f"rep{k}"), steps[k], gathered=GATHER)
        write_chat_run(str(d / "zero3-tp" / f"rep{k}"), [x + 0.5 for x in steps[k]], gathered=GATHER, tp_requested=2)
        write_chat_run(str(d / "zero3-tp-new" / f"rep{k}"), [], tp_requested=2, refused=True, deepspeed="0.19.8")
        write_chat_run(str(d / "autotp" / f"rep{k}"), [50.0, 4.0, 40.0, 40.0, 5.0, 4.0 + k], tp=2, zero3=False,
                       tp_requested=2)
        write_chat_run(str(d / "zero3-other" / f"rep{k}"), [x * 3 for x in steps[k]], gathered=2 * GATHER)
    return str(d)


def test_runs_group_by_the_folder_above_rep(sweep_dir):
    refs = find_runs([sweep_dir])
    assert {(r.config, r.repeat) for r in refs if r.config == "zero3"} == {("zero3", "rep1"), ("zero3", "rep2")}
    assert len(refs) == 10
    direct = find_runs([os.path.join(sweep_dir, "autotp")])
    assert [r.config for r in direct] == ["autotp", "autotp"]
    single = find_runs([os.path.join(sweep_dir, "autotp", "rep1")])
    assert [(r.config, r.repeat) for r in single] == [("autotp", "rep1")]


def test_numbers_per_configuration(sweep_dir):
    c = configs_by_name(compare_runs([sweep_dir], "zero3", progress=quiet))
    z = c["zero3"]
    # rep1 steps 1, 4, 5 -> median 11; rep2 -> 13 (steps 2 and 3 were profiled)
    assert (z.ms_per_step.median, z.ms_per_step.low, z.ms_per_step.high) == (12.0, 11.0, 13.0)
    assert z.tokens_per_s.median == pytest.approx(1e3 / 12.0, rel=0.01)
    assert z.sequences == 2 and z.aggregate_tokens_per_s.median == pytest.approx(2e3 / 12.0, rel=0.01)
    assert z.gathered_bytes_per_step == GATHER and z.effective_tp == 1 and z.held_fraction == pytest.approx(0.5)
    a = c["autotp"]
    assert a.effective_tp == 2 and a.sequences == 1 and a.gathered_bytes_per_step == 0
    assert a.held_fraction < 1.0


def test_refused_configuration_is_shown_not_dropped(sweep_dir):
    comparison = compare_runs([sweep_dir], "zero3", progress=quiet)
    refused = configs_by_name(comparison)["zero3-tp-new"]
    assert refused.status == "refused" and refused.ms_per_step is None and len(refused.runs) == 2
    assert "TPTrainingConfig" in refused.reason and refused.deepspeed_versions == ["0.19.8"]
    assert any(e.id == "refused" and e.configs == ["zero3-tp-new"] for e in comparison.verdict.explanations)


def test_tp_request_without_effect_needs_the_same_structure(sweep_dir):
    v = compare_runs([sweep_dir], "zero3", progress=quiet).verdict
    pairs = [sorted(e.configs) for e in v.explanations if e.id == "tp-request-without-effect"]
    assert ["zero3", "zero3-tp"] in pairs
    assert not any("zero3-other" in p for p in pairs)  # twice the bytes gathered: another structure
    assert not any("autotp" in p for p in pairs)  # split shapes
    assert ["zero3", "zero3-tp"] in [sorted(p) for p in v.indistinguishable]
    assert not any("zero3-other" in p for p in v.indistinguishable)


def test_ratios_and_split_shapes_against_the_baseline(sweep_dir):
    v = compare_runs([sweep_dir], "zero3", progress=quiet).verdict
    assert v.ratios["zero3"]["ms_per_step"] == 1.0
    assert v.ratios["zero3-other"]["ms_per_step"] == pytest.approx(3.0)
    (split,) = [e for e in v.explanations if e.id == "weights-split"]
    example = split.evidence["example"]
    assert split.configs == ["autotp"] and example["reference"] == "zero3"
    assert example["shape"][0] * 2 == example["reference_shape"][0]


def test_cli_json_markdown_and_bad_input(sweep_dir, tmp_path):
    out = tmp_path / "c.json"
    r = dstrace("compare", sweep_dir, "--baseline", "zero3", "--format", "json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["schema"] == "dstrace.compare/1" and data["verdict"]["baseline"] == "zero3"
    assert [c["name"] for c in data["configs"]] == sorted(c["name"] for c in data["configs"])
    md = dstrace("compare", sweep_dir, "--format", "markdown")
    assert md.returncode == 0 and "| zero3-tp-new | refused |" in md.stdout
    bad = dstrace("compare", sweep_dir, "--baseline", "nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nope" in bad.stderr
    missing = dstrace("compare", str(tmp_path / "absent"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    with pytest.raises(UserError):
        find_runs([str(tmp_path)])  # a folder without runs
