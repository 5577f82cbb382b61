"""`--set` parsing and the allow-list, and the overrides as the recording code sets them on a config."""
from __future__ import annotations

import inspect
import json

import pytest

from dstrace.errors import UserError
from dstrace.recording import overrides
from dstrace.trying import keys


def test_values_are_json_where_they_parse_else_strings():
    assert keys.parse_sets(["zero_optimization.stage=0", "zero_optimization.stage3_param_persistence_threshold=1e9",
                            "bf16.enabled=true", 'tensor_parallel={"autotp_size": 2}', "dtype=bf16"]) == [
        ("zero_optimization.stage", 0), ("zero_optimization.stage3_param_persistence_threshold", 1e9),
        ("bf16.enabled", True), ("tensor_parallel", {"autotp_size": 2}), ("dtype", "bf16")]


@pytest.mark.parametrize("item, says", [
    ("zero_optimization.stag=0", "did you mean stage"),
    ("zero_optimisation.stage=0", "not a DeepSpeed config section"),
    ("zero_optimization.stage.x=0", "is a value, not an object"),
    ("train_batch_size.x=1", "is a value, not an object"),
    ("tensor_parallel.tp_sise=2", "did you mean tp_size"),
    ("zero_optimization.stage", "expected KEY=VALUE"),
    ("zero_optimization..stage=0", "not a config path"),
])
def test_unknown_keys_and_paths_into_values_are_refused(item, says):
    with pytest.raises(UserError, match=says):
        keys.parse_sets([item])


def test_a_path_inside_another_is_refused():
    with pytest.raises(UserError, match="one sets a value inside the other"):
        keys.parse_sets(["zero_optimization={}", "zero_optimization.stage=0"])


def test_the_allow_list_knows_the_installed_deepspeeds_fields():
    """The lists are DeepSpeed 0.16.1's and 0.19.8's; a DeepSpeed beside dstrace with a field they lack fails here."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    names = {n for name, f in DeepSpeedZeroConfig.model_fields.items() for n in (name, f.alias) if n}
    assert names <= set(keys.FIELDS["zero_optimization"])
    tp = pytest.importorskip("deepspeed.runtime.tensor_parallel.config")
    names = {n for name, f in tp.TPTrainingConfig.model_fields.items() for n in (name, f.alias) if n}
    assert names <= set(keys.FIELDS["tensor_parallel"])


def test_overrides_go_on_a_copy_of_the_config_and_make_the_objects_on_the_way():
    mine = {"zero_optimization": {"stage": 3, "overlap_comm": True}}
    handed, record = overrides.apply(mine, "deepspeed.initialize",
                                     [("zero_optimization.stage", 0), ("tensor_parallel.autotp_size", 2)])
    assert handed == {"zero_optimization": {"stage": 0, "overlap_comm": True}, "tensor_parallel": {"autotp_size": 2}}
    assert mine == {"zero_optimization": {"stage": 3, "overlap_comm": True}}
    assert record["applied"] == {"zero_optimization.stage": 0, "tensor_parallel.autotp_size": 2}


def test_a_path_into_a_value_of_the_jobs_config_is_not_applied():
    with pytest.raises(overrides.NotApplied, match="optimizer is \"adam\""):
        overrides.apply({"optimizer": "adam"}, "HfDeepSpeedConfig", [("optimizer.type", "sgd")])


def test_initialize_gets_the_config_whichever_way_the_job_gave_it(tmp_path):
    """The real signature of deepspeed.initialize: config, config_params, or a path in args.deepspeed_config."""
    deepspeed = pytest.importorskip("deepspeed")
    import argparse

    sig = inspect.signature(deepspeed.initialize)
    wanted = [("zero_optimization.stage", 0)]
    bound = sig.bind_partial(model=None, config_params={"zero_optimization": {"stage": 3}})
    overrides.override_call("deepspeed.initialize", bound.arguments, wanted)
    assert bound.kwargs["config_params"] == {"zero_optimization": {"stage": 0}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    args = argparse.Namespace(deepspeed_config=str(path))
    bound = sig.bind_partial(args=args, model=None)
    overrides.override_call("deepspeed.initialize", bound.arguments, wanted)
    assert bound.kwargs["config"] == {"zero_optimization": {"stage": 0}}
    assert bound.arguments["args"].deepspeed_config is None and args.deepspeed_config == str(path)


def test_init_inference_gets_only_inference_sections():
    handed, record = overrides.apply({"tensor_parallel": {"tp_size": 1}}, "deepspeed.init_inference",
                                     [("zero_optimization.stage", 0), ("tensor_parallel.tp_size", 2)])
    assert handed == {"tensor_parallel": {"tp_size": 2}} and record["applied"] == {"tensor_parallel.tp_size": 2}
