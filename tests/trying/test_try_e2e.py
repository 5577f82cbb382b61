"""`dstrace try` end to end: real torchrun ranks on CPU (gloo), real DeepSpeed ZeRO-3 on saved tiny Qwen2
checkpoints, HfDeepSpeedConfig before from_pretrained as in the report. Few and small: each try is two runs."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.processes import cpu_env, dstrace, torchrun
from tests.fixtures.runs import manifests, read_json


SCRIPT = os.path.join(ROOT, "tests", "trying", "scripts", "zero3_generate.py")
EXTENSIONS = os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions", "deepspeed-installed")
"""DeepSpeed JIT-builds its CPU all-reduce op under one name in every release: this DeepSpeed's own folder (as
launch/sweeps/cpu-tiny.json) keeps another release's build from being loaded."""
BF16_NEAR_TIE = 2.0 ** -9
"""lm_head rows 1 and 2 differ by this factor: fp32 tells them apart, bf16 (2^-7 ulp at 1) rounds both to one value."""


def save_checkpoints(root) -> tuple[str, str]:
    """(random, tie): a random tiny Qwen2, and one whose next token is 2 in fp32 and provably 1 in bf16.

    The tie model: attention and MLP outputs zeroed, so the last hidden state is the normalized embedding, whose
    dimension 0 is 1 for every token (positive after RMSNorm); lm_head is zero but for rows 1 and 2, which read
    dimension 0 with weights 1 and 1 + 2^-9. In fp32 logit 2 is the largest; in bf16 both rows are 1, logits 1
    and 2 tie, and greedy decoding takes the first: token 1."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    random_path, tie_path = str(root / "qwen2-random"), str(root / "qwen2-tie")
    Qwen2ForCausalLM(config).save_pretrained(random_path)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[1, 0] = 1.0
        model.lm_head.weight[2, 0] = 1.0 + BF16_NEAR_TIE
    model.save_pretrained(tie_path)
    return random_path, tie_path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_checkpoints(tmp_path_factory.mktemp("checkpoints"))


def try_(out: str, checkpoint: str, *sets: str, tokens: int = 4):
    command = [*torchrun(), SCRIPT, "--checkpoint", checkpoint, "--max-new-tokens", str(tokens)]
    args = [a for s in sets for a in ("--set", s)]
    return dstrace("try", "--repeats", "1", "-o", out, "--format", "json", *args, "--", *command, env=cpu_env(
        PYTHONPATH=ROOT, TORCH_EXTENSIONS_DIR=EXTENSIONS))


@pytest.fixture(scope="module")
def stage0(checkpoints, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("try") / "stage0")
    return out, try_(out, checkpoints[0], "zero_optimization.stage=0")


def test_stage_0_gathers_nothing_answers_the_same_and_is_not_slower(stage0):
    out, result = stage0
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report == read_json(os.path.join(out, "try.json"))
    as_is, variant = report["as_is"], report["variant"]
    assert as_is["gathered_bytes_per_step"] > 0 and variant["gathered_bytes_per_step"] == 0
    assert variant["ms_per_step"] < as_is["ms_per_step"] and report["verdict"]["outcome"] == "faster"
    assert report["same_output"] is True and report["output_differences"] == []
    assert variant["overrides_applied"] is True and as_is["peak_memory_kind"] == "host rss"
    assert report["verdict"]["baseline"] == "as-is" and {c["name"] for c in report["configs"]} == {"as-is", "variant"}
    assert "[1/2] as-is rep1: recording" in result.stderr and "[2/2] variant rep1: complete" in result.stderr


def test_the_manifest_has_the_config_as_passed_and_as_applied(stage0):
    out, _ = stage0
    for rank, m in manifests(os.path.join(out, "variant", "rep1")).items():
        assert m["config_overrides"] == {"zero_optimization.stage": 0}
        assert m["hf_deepspeed_config"]["zero_optimization"]["stage"] == 3
        assert m["hf_deepspeed_config_overrides"]["config"]["zero_optimization"]["stage"] == 0
        (init,) = [c for c in m["deepspeed_calls"] if c["api"] == "deepspeed.initialize"]
        assert init["config"]["zero_optimization"]["stage"] == 3
        assert init["overrides"]["applied"] == {"zero_optimization.stage": 0}
        assert m["inventory"]["zero3_partitioned"] == 0  # HfDeepSpeedConfig saw stage 0: no zero.Init
        assert len(m["calls"][0]["output_sha256"]) == 1
    for m in manifests(os.path.join(out, "as-is", "rep1")).values():
        assert m["config_overrides"] == {} and m["inventory"]["zero3_partitioned"] > 0


def test_suggested_autotp_is_refused_when_ranks_get_different_inputs(stage0):
    from dstrace.runfolder.records import read_manifest
    from dstrace.trying.suggest import why_not

    run = os.path.join(stage0[0], "as-is", "rep1")
    ms = {r: read_manifest(os.path.join(run, f"rank{r}.manifest.json")) for r in (0, 1)}
    assert "different inputs" in why_not({"tensor_parallel": {"autotp_size": 2}}, ms)
    assert why_not({"zero_optimization.stage": 0}, ms) is None  # a tiny model fits


def test_suggested_takes_the_change_the_runs_findings_name(stage0):
    from dstrace.trying.suggest import suggested

    overrides, notes = suggested(os.path.join(stage0[0], "as-is", "rep1"))
    assert overrides == [("zero_optimization.stage", 0)]
    assert "finding zero3-gathers-model-per-step" in notes[0]


def test_suggested_stage_0_is_refused_when_the_model_exceeds_the_device(stage0, tmp_path):
    """The as-is run's own analysis suggests stage 0 (zero3-gathers-model-per-step); with its ranks' device memory
    made smaller than the model, try refuses before any run."""
    run = str(tmp_path / "run")
    shutil.copytree(os.path.join(stage0[0], "as-is", "rep1"), run)
    for name in os.listdir(run):
        if name.endswith(".manifest.json"):
            m = read_json(os.path.join(run, name))
            m["device_memory_bytes"], m["device_memory_kind"] = m["inventory"]["logical_bytes"] // 2, "gpu"
            with open(os.path.join(run, name), "w") as f:
                json.dump(m, f)
    out = str(tmp_path / "try")
    result = dstrace("try", "--suggested", run, "-o", out, "--", sys.executable, "-c", "pass")
    assert result.returncode == 2
    assert "zero_optimization.stage=0" in result.stderr and "exceed rank 0's" in result.stderr
    assert not os.path.exists(out)


def test_a_change_of_dtype_that_changes_the_answer_says_so(checkpoints, tmp_path):
    result = try_(str(tmp_path / "bf16"), checkpoints[1], "bf16.enabled=true", tokens=2)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["same_output"] is False
    assert report["output_differences"] == ["variant rep1: rank 0 call 1: different token ids",
                                            "variant rep1: rank 1 call 1: different token ids"]
    as_is, variant = (manifests(os.path.join(str(tmp_path / "bf16"), side, "rep1"))[0]["inventory"]
                      for side in ("as-is", "variant"))
    weights = {w["name"]: (w["dtype"], v["dtype"]) for w, v in zip(as_is["weights"], variant["weights"])}
    assert set(weights.values()) == {("float32", "bfloat16")}
    assert report["dtype_differences"][0] == (f"rank 0: {len(weights)} weights float32 as-is, bfloat16 in the "
                                              f"variant ({', '.join(sorted(weights)[:3])} and {len(weights) - 3} more)")


def test_a_variant_that_fails_keeps_its_exit_code_and_error(checkpoints, tmp_path):
    result = try_(str(tmp_path / "stage7"), checkpoints[0], "zero_optimization.stage=7", tokens=2)
    assert result.returncode == 1, result.stderr[-3000:]
    report = json.loads(result.stdout)
    variant = report["variant"]
    assert variant["complete"] == 0 and variant["exit_codes"] == [1]
    assert report["verdict"]["outcome"] == "variant failed"
    assert "stage" in variant["errors"][0]
    assert report["as_is"]["complete"] == 1 and report["as_is"]["ms_per_step"] is not None


def test_a_command_that_fails_as_it_is_stops_try_with_its_exit_code(tmp_path):
    out = str(tmp_path / "fails")
    result = dstrace("try", "--set", "zero_optimization.stage=0", "-o", out, "--",
                     sys.executable, "-c", "import sys; sys.exit(3)")
    assert result.returncode == 3
    assert "fails as it is (exit code 3)" in result.stderr
    assert not os.path.exists(os.path.join(out, "variant"))


@pytest.mark.parametrize("sets, says", [
    (["zero_optimization.stag=0"], "did you mean stage"),
    (["zero_optimization.stage.x=0"], "is a value, not an object"),
    ([], "nothing to try"),
])
def test_bad_overrides_are_refused_before_the_job_starts(tmp_path, sets, says):
    out = str(tmp_path / "t")
    result = dstrace("try", *[a for s in sets for a in ("--set", s)], "-o", out, "--", sys.executable, "-c", "pass")
    assert result.returncode == 2 and says in result.stderr
    assert not os.path.exists(out)
