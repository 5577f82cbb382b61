"""The CPU sweep CI runs: the report's configurations, recorded twice each by `dstrace sweep`, compared.

One session-wide sweep (launch/sweeps/cpu-tiny.json, 2 repeats); every test reads its compare.json.
"""
from __future__ import annotations

import json
import os

import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.processes import cpu_env, deepspeed_era_path, dstrace
from tests.fixtures.runs import read_json


SPEC = os.path.join(ROOT, "launch", "sweeps", "cpu-tiny.json")
REPEATS = 2
SWEEP_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def cpu_sweep(tmp_path_factory):
    era = deepspeed_era_path()
    out = str(tmp_path_factory.mktemp("sweep") / "cpu-tiny")
    result = dstrace("sweep", SPEC, "-o", out, "--repeats", str(REPEATS), "--set", f"ds_era={era}",
                     "--run-timeout", "300", env=cpu_env(), timeout=SWEEP_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result, read_json(os.path.join(out, "compare.json"))


def configs(data: dict) -> dict:
    return {c["name"]: c for c in data["configs"]}


def explanations(data: dict, kind: str) -> list[dict]:
    return [e for e in data["verdict"]["explanations"] if e["id"] == kind]


def test_every_configuration_recorded_in_alternating_order(cpu_sweep):
    out, result, data = cpu_sweep
    spec = read_json(SPEC)
    names = [c["name"] for c in spec["configurations"]]
    sweep = read_json(os.path.join(out, "sweep.json"))
    assert [r["config"] for r in sweep["runs"]] == names * REPEATS  # ABCABC
    assert [c["name"] for c in data["configs"]] == names
    assert all(len(c["runs"]) == REPEATS for c in data["configs"])
    assert data["schema"] == "dstrace.compare/1" and data["verdict"]["baseline"] == spec["baseline"]
    assert "Indistinguishable" in result.stdout and "Why" in result.stdout  # the text report


def test_tp_size_under_zero3_changes_nothing(cpu_sweep):
    _, _, data = cpu_sweep
    c = configs(data)
    plain, tp = c["zero3-ds016"], c["zero3-ds016-tp"]
    assert plain["status"] == tp["status"] == "complete"
    assert plain["deepspeed_versions"] == tp["deepspeed_versions"] == ["0.16.1"]
    assert plain["tp_requested"] == [] and any("tp_size=2" in t for t in tp["tp_requested"])
    assert plain["effective_tp"] == tp["effective_tp"] == 1
    assert plain["weight_shapes"] == tp["weight_shapes"]
    assert plain["gathered_bytes_per_step"] == tp["gathered_bytes_per_step"] > 0
    (same,) = [e for e in explanations(data, "tp-request-without-effect")
               if sorted(e["configs"]) == ["zero3-ds016", "zero3-ds016-tp"]]
    tie = ["zero3-ds016", "zero3-ds016-tp"] in [sorted(p) for p in data["verdict"]["indistinguishable"]]
    assert same["evidence"]["indistinguishable"] == tie
    assert "tp-not-applied" in tp["findings"] and "tp-not-applied" not in plain["findings"]
    assert any("zero3-ds016-tp" in e["configs"] for e in explanations(data, "tp-not-applied"))


def test_zero3_regathers_the_model_every_step(cpu_sweep):
    _, _, data = cpu_sweep
    hit = {n for e in explanations(data, "model-regathered-every-step") for n in e["configs"]}
    assert {"zero3-ds016", "zero3-ds016-tp"} <= hit
    for name in ("zero3-ds016", "zero3-ds016-tp"):
        c = configs(data)[name]
        assert c["held_fraction"] == pytest.approx(0.5, abs=0.02)  # ZeRO-3: 1/world of every weight
        assert c["sequences"] == 2  # each rank its own prompt
    assert "device-map" not in hit and configs(data)["device-map"]["sequences"] == 1


def test_current_deepspeed_refuses_tp_size(cpu_sweep):
    _, _, data = cpu_sweep
    refused = configs(data)["zero3-tp"]
    assert refused["status"] == "refused" and refused["ms_per_step"] is None
    assert all(r["status"] == "refused" for r in refused["runs"])
    assert "tp_size" in refused["reason"] or "TPTraining" in refused["reason"]
    assert refused["deepspeed_versions"] and refused["deepspeed_versions"] != ["0.16.1"]
    assert explanations(data, "refused")[0]["configs"] == ["zero3-tp"]


def test_autotp_splits_the_weights(cpu_sweep):
    _, _, data = cpu_sweep
    autotp = configs(data)["autotp"]
    assert autotp["status"] == "complete", autotp["reason"]
    assert autotp["effective_tp"] == 2 and autotp["sequences"] == 1 and not autotp["gathered_bytes_per_step"]
    (split,) = [e for e in explanations(data, "weights-split") if e["configs"] == ["autotp"]]
    example = split["evidence"]["example"]
    assert example["reference"] == "device-map"
    assert sorted(example["shape"]) != sorted(example["reference_shape"])
    assert example["shape"][0] * 2 == example["reference_shape"][0] or \
        example["shape"][1] * 2 == example["reference_shape"][1]
    assert data["verdict"]["ratios"]["autotp"]["ms_per_step"] > 0


def test_autotp_under_zero3_is_recorded_as_it_went(cpu_sweep):
    _, _, data = cpu_sweep
    for name in ("zero3-autotp", "zero3-autotp-pretrained"):
        c = configs(data)[name]
        assert any("autotp_size=2" in t for t in c["tp_requested"])
        if c["status"] == "complete":
            assert c["effective_tp"] == 2
        else:
            assert c["reason"] and c["status"] in ("refused", "failed")


def test_compare_reads_the_sweep_folder_again(cpu_sweep, tmp_path):
    out, _, data = cpu_sweep
    md = dstrace("compare", out, "--format", "markdown", "--baseline", "autotp")
    assert md.returncode == 0, md.stderr
    assert "| zero3-tp | refused |" in md.stdout and "against the baseline `autotp`" in md.stdout.lower()
    again = dstrace("compare", os.path.join(out, "zero3-ds016"), os.path.join(out, "zero3-ds016-tp"),
                    "--format", "json")
    assert again.returncode == 0, again.stderr
    assert [c["name"] for c in json.loads(again.stdout)["configs"]] == ["zero3-ds016", "zero3-ds016-tp"]


def test_sweep_refuses_a_spec_it_cannot_fill(tmp_path):
    r = dstrace("sweep", SPEC, "-o", str(tmp_path / "x"))
    assert r.returncode == 2 and "--set ds_era=VALUE" in r.stderr and "Traceback" not in r.stderr
    r = dstrace("sweep", SPEC, "-o", str(tmp_path / "x"), "--set", "ds_era=/x", "--only", "nope")
    assert r.returncode == 2 and "nope" in r.stderr
    assert not os.path.exists(tmp_path / "x" / "sweep.json")
