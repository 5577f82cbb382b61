"""The verdict: which configurations cannot be told apart, how each compares with the baseline, and
what the manifests and traces show as the reason. Every statement is derived from the evidence of the
runs; nothing is specific to one scenario."""
from __future__ import annotations

from itertools import combinations

from dstrace.analysis.findings.parallelism import ZERO3_MODEL_FRACTION
from dstrace.comparison.model import ConfigSummary, Explanation, Verdict
from dstrace.comparison.stats import (
    INDISTINGUISHABLE_RULE,
    indistinguishable,
    same_bytes,
)
from dstrace.units import percent, ratio, size, spread


def _ms(c: ConfigSummary) -> str:
    s = c.ms_per_step
    return "-" if s is None else spread(s.median, s.low, s.high, " ms/step")


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def indistinguishable_pairs(configs: list[ConfigSummary]) -> list[list[str]]:
    timed = [c for c in configs if c.ms_per_step is not None]
    return [[a.name, b.name] for a, b in combinations(timed, 2) if indistinguishable(a.ms_per_step, b.ms_per_step)]


def ratios(configs: list[ConfigSummary], baseline: ConfigSummary | None) -> dict[str, dict[str, float | None]]:
    """Medians over the baseline's: ms per step (above 1 is slower), tokens/s per sequence and over all
    sequences generated at once (above 1 is faster)."""
    if baseline is None or baseline.ms_per_step is None:
        return {}
    out = {}
    for c in configs:
        if c.ms_per_step is None:
            continue
        agg, base_agg = c.aggregate_tokens_per_s, baseline.aggregate_tokens_per_s
        out[c.name] = {
            "ms_per_step": c.ms_per_step.median / baseline.ms_per_step.median,
            "tokens_per_s": baseline.ms_per_step.median / c.ms_per_step.median,
            "aggregate_tokens_per_s": agg.median / base_agg.median if agg and base_agg else None,
        }
    return out


def not_run(configs: list[ConfigSummary]) -> list[Explanation]:
    out = []
    for c in configs:
        if c.status in ("refused", "failed"):
            verb = "DeepSpeed refused the configuration" if c.status == "refused" else "every run failed"
            versions = f" (DeepSpeed {', '.join(c.deepspeed_versions)})" if c.deepspeed_versions else ""
            out.append(Explanation(c.status, [c.name], f"{c.name}: {verb}{versions}: {c.reason}",
                                   {"reason": c.reason, "runs": len(c.runs), "deepspeed": c.deepspeed_versions,
                                    "tp_requested": c.tp_requested}))
    return out


def same_structure(a: ConfigSummary, b: ConfigSummary) -> bool:
    """Same effective TP, the same weight shapes, and the same bytes gathered per step."""
    return (a.effective_tp is not None and a.effective_tp == b.effective_tp and bool(a.weight_shapes)
            and a.weight_shapes == b.weight_shapes and same_bytes(a.gathered_bytes_per_step, b.gathered_bytes_per_step))


def _asked(c: ConfigSummary) -> str:
    return ", ".join(c.tp_requested) or "no TP size"


def tp_request_without_effect(configs: list[ConfigSummary]) -> list[Explanation]:
    """Pairs that differ in the tensor-parallel sizes requested and in nothing the model does."""
    timed = [c for c in configs if c.ms_per_step is not None]
    out = []
    for a, b in combinations(timed, 2):
        if a.tp_requested == b.tp_requested or not same_structure(a, b):
            continue
        tie = indistinguishable(a.ms_per_step, b.ms_per_step)
        single = a.ms_per_step.runs < 2 or b.ms_per_step.runs < 2
        timing = ("indistinguishable in time" if tie else
                  "apart in time with one run of each, so no spread to judge the gap by, and nothing in the model "
                  "to explain it: run repeats" if single else
                  "apart in time by more than their spread, with nothing in the model to explain it: "
                  "run more repeats")
        summary = (f"{a.name} ({_asked(a)}) and {b.name} ({_asked(b)}) run the same model: effective TP "
                   f"{a.effective_tp}, the same {len(a.weight_shapes)} weight shapes, "
                   f"{size(a.gathered_bytes_per_step)} gathered per step each; {timing} "
                   f"({_ms(a)} vs {_ms(b)})")
        out.append(Explanation("tp-request-without-effect", [a.name, b.name], summary, {
            "tp_requested": {a.name: a.tp_requested, b.name: b.tp_requested},
            "effective_tp": a.effective_tp, "weights": len(a.weight_shapes),
            "gathered_bytes_per_step": {a.name: a.gathered_bytes_per_step, b.name: b.gathered_bytes_per_step},
            "deepspeed": {a.name: a.deepspeed_versions, b.name: b.deepspeed_versions},
            "indistinguishable": tie,
            "ms_per_step_median": {a.name: a.ms_per_step.median, b.name: b.ms_per_step.median}}))
    return out


def measured_alternatives(configs: list[ConfigSummary], than: ConfigSummary) -> str:
    """The timed configurations that gather nothing per step (weights split by TP, or not partitioned), with
    their ms per step: what the comparison measured for the remedies."""
    alternatives = [c for c in configs if c is not than and c.ms_per_step is not None
                    and not c.gathered_bytes_per_step]
    if not alternatives:
        return ""
    return "measured here: " + "; ".join(
        f"{c.name} (effective TP {c.effective_tp or '-'}, gathers nothing) {_ms(c)}" for c in alternatives) \
        + (f", against {than.name} {_ms(than)}" if than.ms_per_step is not None else "")


REMEDY = ("split the computation with `deepspeed.init_inference(model, tensor_parallel={\"tp_size\": N})` (AutoTP), "
          "a `device_map`, or transformers' `tp_plan`; keep ZeRO-3 for inference only when the model does not fit "
          "otherwise")


def tp_not_applied(configs: list[ConfigSummary]) -> list[Explanation]:
    hit = [c for c in configs if "tp-not-applied" in c.findings]
    if not hit:
        return []
    parts = [f"{c.name} asked {', '.join(c.tp_requested)} and has effective TP {c.effective_tp}" for c in hit]
    return [Explanation("tp-not-applied", [c.name for c in hit],
                        "tensor parallelism was requested but no weight is split: " + "; ".join(parts),
                        {c.name: {"tp_requested": c.tp_requested, "effective_tp": c.effective_tp,
                                  "deepspeed": c.deepspeed_versions} for c in hit},
                        remedy="; ".join(x for x in [REMEDY] + [measured_alternatives(configs, c) for c in hit] if x))]


def regathered(configs: list[ConfigSummary], baseline: ConfigSummary | None,
               ratio_of: dict[str, dict[str, float | None]]) -> list[Explanation]:
    """ZeRO-3's cost: most of the model moved to every rank on every decode step."""
    out = []
    for c in configs:
        if not c.gathered_bytes_per_step or not c.model_bytes:
            continue
        share = c.gathered_bytes_per_step / c.model_bytes
        if share < ZERO3_MODEL_FRACTION:
            continue
        slower = ratio_of.get(c.name, {}).get("ms_per_step")
        against = (f"; {ratio(slower)} the baseline {baseline.name}'s ms per step" if slower and baseline
                   and baseline.name != c.name else "")
        comm = (f", collectives {percent(c.transfer_share)} transfer and {percent(c.wait_share)} waiting for peers "
                "of the traced time" if c.transfer_share is not None and c.wait_share is not None else "")
        out.append(Explanation("model-regathered-every-step", [c.name], (
            f"{c.name}: every decode step gathers {size(c.gathered_bytes_per_step)} per rank, {percent(share)} of the "
            f"model's {size(c.model_bytes)}, while each rank holds {percent(c.held_fraction)} of the weights"
            f"{comm}{against}"), {
            "gathered_bytes_per_step": c.gathered_bytes_per_step, "model_bytes": c.model_bytes,
            "share": share, "threshold": ZERO3_MODEL_FRACTION, "held_fraction": c.held_fraction,
            "comm_share": c.comm_share, "transfer_share": c.transfer_share, "wait_share": c.wait_share,
            "ms_per_step_ratio": slower,
            "collectives_per_step": c.collectives_per_step},
            remedy="; ".join(x for x in (REMEDY, measured_alternatives(configs, c)) if x)))
    return out


def _reference(configs: list[ConfigSummary], baseline: ConfigSummary | None) -> ConfigSummary | None:
    """An unsplit model to hold split shapes against: the baseline when it is one."""
    unsplit = [c for c in configs if c.effective_tp == 1 and c.weight_shapes]
    if baseline in unsplit:
        return baseline
    return unsplit[0] if unsplit else None


def weights_split(configs: list[ConfigSummary], baseline: ConfigSummary | None) -> list[Explanation]:
    out = []
    ref = _reference(configs, baseline)
    for c in configs:
        if not c.effective_tp or c.effective_tp <= 1:
            continue
        example = None
        if ref is not None:
            changed = [(n, ref.weight_shapes[n], s) for n, s in c.weight_shapes.items()
                       if n in ref.weight_shapes and ref.weight_shapes[n] != s]
            if changed:
                example = max(changed, key=lambda x: _numel(x[1]))
        shape = f" ({example[0]}: {example[1]} in {ref.name} -> {example[2]})" if example else ""
        kinds = ", ".join(f"{k} {n:.1f}/step" for k, n in c.collectives_per_step.items()) or "none in the trace"
        gathered = size(c.gathered_bytes_per_step) if c.gathered_bytes_per_step else "nothing"
        out.append(Explanation("weights-split", [c.name], (
            f"{c.name}: weights split {c.effective_tp} ways{shape} by {', '.join(c.split_modules) or '-'}; "
            f"each rank holds {percent(c.held_fraction)} of the weights, gathers {gathered} per step; "
            f"collectives: {kinds}"), {
            "effective_tp": c.effective_tp, "example": {"weight": example[0], "reference": ref.name,
                                                        "reference_shape": example[1], "shape": example[2]}
            if example else None,
            "split_modules": c.split_modules, "held_fraction": c.held_fraction,
            "gathered_bytes_per_step": c.gathered_bytes_per_step, "collectives_per_step": c.collectives_per_step}))
    return out


def verdict(configs: list[ConfigSummary], baseline_name: str | None) -> Verdict:
    baseline = next((c for c in configs if c.name == baseline_name), None)
    ratio_of = ratios(configs, baseline)
    explanations = (not_run(configs) + tp_request_without_effect(configs) + tp_not_applied(configs)
                    + regathered(configs, baseline, ratio_of) + weights_split(configs, baseline))
    return Verdict(rule=INDISTINGUISHABLE_RULE, baseline=baseline_name,
                   indistinguishable=indistinguishable_pairs(configs), ratios=ratio_of, explanations=explanations)
