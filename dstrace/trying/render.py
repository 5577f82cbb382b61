"""`dstrace try`'s result (`dstrace.try/1`: the comparison's fields and what try adds) and its text and markdown."""
from __future__ import annotations

import dataclasses
import json

from dstrace.analysis.render.markdown import md_cell, md_table
from dstrace.comparison.model import Comparison
from dstrace.comparison.render import render as render_comparison
from dstrace.comparison.render import to_dict
from dstrace.say import one_line
from dstrace.trying.keys import describe
from dstrace.trying.result import AS_IS, TRY_SCHEMA, VARIANT, TryRun, dtype_differences, outcome, same_output, side
from dstrace.units import ratio, size, spread

FORMATS = ("text", "markdown", "json")


def build(comparison: Comparison, overrides, notes: list[str], runs: list[TryRun], manifests: dict) -> dict:
    """The JSON object: the comparison's own fields, `verdict` with try's `outcome` added, and per side the
    numbers try prints."""
    configs = {c.name: c for c in comparison.configs}
    sides = {}
    for name in (AS_IS, VARIANT):
        mine = [r for r in runs if r.side == name]
        sides[name] = side(configs.get(name), mine, [manifests[r.path] for r in mine], name == VARIANT)
    complete = {name: [manifests[r.path] for r in runs if r.side == name and r.exit_code == 0] for name in sides}
    same, differences = same_output(complete[AS_IS], complete[VARIANT])
    dtypes = dtype_differences(complete[AS_IS], complete[VARIANT]) if same is False else []
    data = to_dict(comparison)
    data["compare_schema"] = data.pop("schema")
    verdict = {"outcome": outcome(comparison, sides[AS_IS], sides[VARIANT]), **data.pop("verdict")}
    return {"schema": TRY_SCHEMA, "overrides": dict(overrides), "notes": notes,
            "as_is": dataclasses.asdict(sides[AS_IS]), "variant": dataclasses.asdict(sides[VARIANT]),
            "same_output": same, "output_differences": differences, "dtype_differences": dtypes, "verdict": verdict,
            "runs": [dataclasses.asdict(r) for r in runs], **data}


def _ms(s: dict) -> str:
    if s["ms_per_step"] is None:
        return "-"
    return spread(s["ms_per_step"], s["ms_per_step_low"], s["ms_per_step_high"])


def _rows(result: dict) -> list[tuple[str, str, str]]:
    a, v = result["as_is"], result["variant"]
    same = {True: "yes", False: "no", None: "cannot tell"}[result["same_output"]]
    return [("runs complete", f"{a['complete']}/{a['runs']}", f"{v['complete']}/{v['runs']}"),
            ("ms per decode step, median [min-max]", _ms(a), _ms(v)),
            ("bytes gathered per decode step", size(a["gathered_bytes_per_step"]), size(v["gathered_bytes_per_step"])),
            ("peak memory", f"{size(a['peak_memory_bytes'])} ({a['peak_memory_kind'] or '-'})",
             f"{size(v['peak_memory_bytes'])} ({v['peak_memory_kind'] or '-'})"),
            ("same answers", "", same)]


def _lines(result: dict) -> list[str]:
    """What the table does not hold: the verdict, what differs, failures, overrides not applied, notes."""
    v, verdict = result["variant"], result["verdict"]
    times = verdict.get("ratios", {}).get(VARIANT, {}).get("ms_per_step")
    out = [f"verdict: {verdict['outcome']}" + (f" ({ratio(times)} the as-is ms per step)" if times else "")
           + (f"; {verdict['rule']}" if verdict["outcome"] == "indistinguishable" else "")]
    out += [f"answers: {d}" for d in result["output_differences"]]
    if result["dtype_differences"]:
        out += [f"held in another dtype: {d}" for d in result["dtype_differences"]]
        out.append("a tensor held in another dtype computes other numbers, which can part a greedy answer")
    out += [f"variant failed: {e} (exit codes {v['exit_codes']})" for e in v["errors"]]
    if v["overrides_applied"] is False:
        out += [f"overrides not applied: {x}" for x in v["not_applied"]]
    out += result["notes"] + [f"warning: {w}" for w in result["warnings"]]
    return out


def render_text(result: dict) -> str:
    rows = [("", "as-is", "variant")] + _rows(result)
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    out = [f"dstrace try: {describe(list(result['overrides'].items()))}", ""] + table + [""] + _lines(result)
    return "\n".join(map(one_line, out)) + "\n"


def render_markdown(result: dict, comparison: Comparison) -> str:
    out = [f"### dstrace try: `{md_cell(describe(list(result['overrides'].items())))}`", ""]
    out += md_table(["", "as-is", "variant"], _rows(result))
    out += [""] + [f"- {md_cell(x)}" for x in _lines(result)]
    return ("\n".join(out) + "\n\n<details><summary>The comparison</summary>\n\n"
            + render_comparison(comparison, "markdown") + "\n</details>\n")


def render(result: dict, fmt: str, comparison: Comparison) -> str:
    if fmt == "json":
        return json.dumps(result, indent=1) + "\n"
    return render_markdown(result, comparison) if fmt == "markdown" else render_text(result)
