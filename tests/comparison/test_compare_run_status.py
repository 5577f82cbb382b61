"""compare reads each run's status from its own record, held fractions as the manifests measured them, and
claims no spread that one run per configuration cannot have (issue 24)."""
from __future__ import annotations

import os

from dstrace.comparison.compare import compare_runs
from dstrace.comparison.facts import held_fraction
from dstrace.comparison.render import render
from dstrace.runfolder.names import manifest_path
from dstrace.runfolder.records import (
    MANIFEST_SCHEMA, RUN_SCHEMA, Inventory, Manifest, RunRecord, Weight, Window, to_json, write_json_atomic,
)
from tests.fixtures.reports import configs_by_name, quiet
from tests.fixtures.runs import write_chat_run, write_run_record


def ddp_run(run_dir: str, exit_code: int = 0) -> str:
    """torch DDP training as `record` writes it: manifests with no generate() call and no DeepSpeed call, but the
    environment's DeepSpeed version (installed, never imported)."""
    os.makedirs(run_dir, exist_ok=True)
    for rank in range(2):
        m = Manifest(schema=MANIFEST_SCHEMA, run_id="ddp", status="complete", rank=rank, local_rank=rank,
                     world_size=2, host="h", pid=100 + rank, started=0.0, ended=1.0,
                     versions={"deepspeed": "0.19.8", "torch": "2.x"},
                     window=Window(mode="full", call=1, start=2, steps=3, recorded_steps=[2, 3, 4],
                                   trigger="optimizer.step",
                                   iterations={"optimizer.step": 7, "DistributedDataParallel.forward": 7}))
        write_json_atomic(manifest_path(run_dir, rank), to_json(m))
    write_run_record(run_dir, "ddp", 2, status="complete" if exit_code == 0 else "incomplete", exit_code=exit_code,
                     problems=[] if exit_code == 0 else [f"the command exited with code {exit_code}"])
    return run_dir


def test_a_ddp_run_that_exited_0_is_complete_and_names_no_deepspeed(tmp_path):
    ddp_run(str(tmp_path / "ddp" / "rep1"))
    ddp_run(str(tmp_path / "ddp-broken" / "rep1"), exit_code=3)
    c = configs_by_name(compare_runs([str(tmp_path)], progress=quiet))
    assert c["ddp"].status == "complete" and c["ddp"].reason is None
    assert c["ddp"].deepspeed_versions == []  # installed, never called
    assert c["ddp-broken"].status == "failed" and c["ddp-broken"].reason == "the command exited with code 3"
    text = render(compare_runs([str(tmp_path)], progress=quiet), "text")
    assert "DeepSpeed 0.19.8" not in text


def test_an_exited_0_run_with_an_incomplete_record_is_incomplete_not_failed(tmp_path):
    run = ddp_run(str(tmp_path / "ddp" / "rep1"))
    path = os.path.join(run, "run.json")
    record = RunRecord(schema=RUN_SCHEMA, run_id="ddp", command=["torchrun"], cwd="/", started=0.0, ended=1.0,
                       status="incomplete", exit_code=0, world_size=2, problems=["rank 1: no summary: damaged"])
    write_json_atomic(path, to_json(record))
    (c,) = compare_runs([str(tmp_path)], progress=quiet).configs
    assert c.status == "incomplete" and c.reason == "rank 1: no summary: damaged"


def test_a_dtensor_weight_is_not_split_twice():
    """transformers' tp_plan="auto" over 2 ranks: the DTensor's shape is the global one, the rank holds half."""
    w = Weight(name="q.weight", shape=[8, 8], local_numel=32, dtype="float32", module_class="Linear", split=2.0,
               placements="Shard(dim=0)@tp=2")
    inv = Inventory(taken_at="generate", model_class="Toy", weights=[w], logical_numel=64, local_numel=32,
                    local_bytes=128, logical_bytes=256, zero3_partitioned=0, module_classes={}, effective_tp=2,
                    dtensors=1)
    assert held_fraction(inv) == 0.5
    autotp = Weight(name="q.weight", shape=[4, 8], local_numel=32, dtype="float32", module_class="LinearLayer",
                    split=2.0)  # AutoTP's layer keeps its split shape: the split is applied once
    assert held_fraction(Inventory(**{**inv.__dict__, "weights": [autotp], "dtensors": 0})) == 0.5


def test_a_tp_plan_auto_run_holds_half_of_the_weights(tmp_path):
    """Two ranks of transformers' tp_plan="auto" (no ZeRO): every weight a DTensor with its global shape,
    split 2, the rank holding half of it. An expert reads off the manifests: each rank holds 50% of the
    weights, TP 2.

    Before (ff03bd2): the split was applied to the global shape again: "held 25%"."""
    write_chat_run(str(tmp_path / "tp-auto" / "rep1"), [90.0, 10.0, 99.0, 99.0, 11.0, 12.0], tp=2, zero3=False,
                   dtensor=True)
    comparison = compare_runs([str(tmp_path)], progress=quiet)
    (c,) = comparison.configs
    assert c.held_fraction == 0.5 and c.effective_tp == 2
    text = " ".join(render(comparison, "text").split())  # lines wrap
    assert "each rank holds 50% of the weights" in text and "25%" not in text, text


def test_one_run_per_configuration_claims_no_spread(tmp_path):
    write_chat_run(str(tmp_path / "zero3" / "rep1"), [90.0, 10.0, 99.0, 99.0, 11.0, 12.0], gathered=4096)
    write_chat_run(str(tmp_path / "zero3-tp" / "rep1"), [90.0, 20.0, 99.0, 99.0, 21.0, 22.0], gathered=4096,
                   tp_requested=2)
    comparison = compare_runs([str(tmp_path)], progress=quiet)
    (e,) = [e for e in comparison.verdict.explanations if e.id == "tp-request-without-effect"]
    assert "more than their spread" not in e.summary and "one run of each" in e.summary
