"""The committed H200 reference runs (traces/h200-*): real NCCL traces, analyzed end to end.

Each assertion is checked against what the run's own files say (the manifests' requested and measured
TP, the recorded gathered bytes), not against a verdict written down in advance.
"""
from __future__ import annotations

import os

import pytest

from dstrace.runfolder.records import read_manifest
from tests.fixtures.paths import TRACES
from tests.fixtures.reports import analyze_dir, findings_by_id


def reference(name: str) -> str:
    path = os.path.join(TRACES, name)
    assert os.path.isdir(path), f"reference run {name} is missing from traces/"
    return path


@pytest.fixture(scope="module")
def zero3_tp2_era():
    return analyze_dir(reference("h200-zero3-tp2-ds0.16.1"))


def test_era_run_is_read_as_gpu_nccl(zero3_tp2_era):
    a = zero3_tp2_era
    assert a.world_size == 2 and a.ranks_found == [0, 1] and a.device == "gpu"
    for rank in (0, 1):
        gather = a.ranks[rank].collectives["AllGather"]
        assert gather.count > 0 and gather.bytes > 0 and gather.busbw_GBps > 0
        assert gather.wait_us + gather.transfer_us == pytest.approx(gather.kernel_us, rel=1e-6)


def test_era_run_states_tp_not_applied_from_the_manifests(zero3_tp2_era):
    manifests = [read_manifest(os.path.join(reference("h200-zero3-tp2-ds0.16.1"), f"rank{r}.manifest.json"))
                 for r in (0, 1)]
    requested = {t.value for m in manifests for t in m.tp_requested}
    measured = {m.inventory.effective_tp for m in manifests}
    assert requested == {2} and measured == {1}  # what the run itself recorded
    assert "tp-not-applied" in findings_by_id(zero3_tp2_era)


def test_era_run_gathers_the_model_every_step(zero3_tp2_era):
    f = findings_by_id(zero3_tp2_era)["zero3-gathers-model-per-step"]
    m = read_manifest(os.path.join(reference("h200-zero3-tp2-ds0.16.1"), "rank0.manifest.json"))
    decode = m.calls[0].gathered_bytes[1:]
    assert min(decode) >= 0.9 * m.inventory.logical_bytes  # the recorded bytes: the whole model per step
    assert f.ranks == [0, 1]


def test_refused_run_is_explained_from_manifests_alone():
    a = analyze_dir(reference("h200-zero3-tp2-ds0.19.8"))
    assert a.ranks_found == [0, 1] and "tp-config-rejected" in findings_by_id(a)  # found by their manifests


def test_device_map_baseline_has_no_zero3_findings():
    a = analyze_dir(reference("h200-device-map"))
    assert a.world_size == 1 and a.device == "gpu"
    ids = set(findings_by_id(a))
    assert not ids & {"zero3-gathers-model-per-step", "tp-not-applied", "peer-wait"}
