"""Findings about the steps: a call whose step time changes level for good, and a profiled window at another
level than the run's typical step."""
from __future__ import annotations

import statistics
from collections import Counter

from dstrace.analysis.findings.inputs import FindingInputs, finding
from dstrace.analysis.loaded import LoadedRun
from dstrace.analysis.results import Finding
from dstrace.analysis.shift import (
    SHIFT_RATIO, UNREPRESENTATIVE_RATIO, Shift, apart, call_shifts, level_ms, median_or_none, profiler_cost,
    window_place, window_steps,
)
from dstrace.analysis.step_compare import compare_steps
from dstrace.analysis.steps import MANIFEST_COVERS, cost_json, decode_step_ms
from dstrace.errors import UserError
from dstrace.units import change, ms, ratio, step_ms

DOCS = {
    "step-time-shift": "docs/analysis-schema.md#step-time-shift",
    "window-not-representative": "docs/analysis-schema.md#step-time-shift",
}
"""Where each finding of this module is explained at length (paths in the dstrace repository)."""


def _steps_label(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def _work_growth(run: LoadedRun, ranks: list[int], shift: Shift, steps: list[int]) -> dict | None:
    """The traced work per step of the window's profiled steps before and after the shift (`step_compare`,
    median over ranks): the three items that changed most, in us per step."""
    before, after = [s for s in steps if s < shift.start], [s for s in steps if s >= shift.start]
    if not before or not after:
        return None
    try:
        c = compare_steps(run, (before[0], before[-1]), (after[0], after[-1]),
                          ranks[0] if len(ranks) == 1 else None, top=3)
    except UserError:
        return None
    return {i.name: {"before_us": i.steps_ms * 1e3, "after_us": i.against_ms * 1e3, "kind": i.kind}
            for i in c.items} or None


def _levels_text(sh: Shift) -> str:
    """Each kind of step's two levels, like with like: `unprofiled steps 1 vs 6-31: 36.0 -> 58.0 ms`."""
    parts = []
    for kind, lv in sh.levels.items():
        if lv.before_ms is not None and lv.after_ms is not None:
            parts.append(f"{kind} steps {_list_label(lv.before_steps)} vs {_list_label(lv.after_steps)}: "
                         f"{change(step_ms(lv.before_ms), step_ms(lv.after_ms))} ({ratio(lv.after_ms / lv.before_ms)})")
        elif lv.after_ms is not None:
            parts.append(f"{kind} steps after it ({_list_label(lv.after_steps)}) {step_ms(lv.after_ms)}, none before")
        else:
            parts.append(f"{kind} steps before it ({_list_label(lv.before_steps)}) {step_ms(lv.before_ms)}, none after")
    return "; ".join(parts)


def _list_label(steps: list[int]) -> str:
    """Steps as runs: [1, 2, 3, 6] -> `1-3, 6`."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def step_time_shift(inputs: FindingInputs) -> Finding | None:
    """A call whose decode steps change level for good, like compared with like (manifests' per-step times and
    kinds; see shift.py), placed at the first step of the new level."""
    run = inputs.run
    per_call: dict[int, list[tuple[int, Shift]]] = {}
    for r, m in sorted(run.manifests.items()):
        for sh in call_shifts(m):
            per_call.setdefault(sh.call, []).append((r, sh))
    if not per_call:
        return None
    parts, calls, causes = [], {}, []
    remedies = []
    for call, found in sorted(per_call.items()):
        ranks = [r for r, _ in found]
        start = int(statistics.median(sh.start for _, sh in found))
        first_sh = found[0][1]
        kind = first_sh.kind
        before = statistics.median(sh.levels[kind].before_ms for _, sh in found if kind in sh.levels
                                   and sh.levels[kind].before_ms is not None)
        after = statistics.median(sh.levels[kind].after_ms for _, sh in found if kind in sh.levels
                                  and sh.levels[kind].after_ms is not None)
        first, last = first_sh.first_before, first_sh.last_after
        place = window_place(run.manifests[ranks[0]], first_sh)
        text = (f"call {call}: from step {start} on, steps take {ratio(after / before)} as long "
                f"({_levels_text(first_sh)}; the profiler's start and stop steps left out), "
                f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}")
        steps_txt = _steps_label(place.steps[0], place.steps[-1]) if place.steps else ""
        growth = None
        if place.where == "straddles":
            growth = _work_growth(run, ranks, first_sh, place.steps)
            text += f"; the profiled window ({steps_txt}) straddles the change"
            if growth:
                text += (": per step " + ", ".join(f"{n} {change(ms(g['before_us']), ms(g['after_us']))}"
                                                   for n, g in growth.items())
                         + f" (`dstrace analyze --steps {place.steps[0]}:{start - 1} --against "
                           f"{start}:{place.steps[-1]}` lists more)")
        elif place.where in ("before", "after"):
            in_slow = (place.where == "after") == (after > before)
            text += (f"; the profiled window ({steps_txt}) lies only in the {'slower' if in_slow else 'faster'} level: "
                     "its trace cannot show what changed")
        elif place.where == "other call":
            text += f"; the profiled window is in call {place.call}: the trace shows neither level of this call"
        parts.append(text)
        calls[str(call)] = {"ranks": ranks, "start": start, "first_step": first, "last_step": last,
                            "kind": kind, "before_ms": before, "after_ms": after, "ratio": after / before,
                            "levels": {k: {"before_ms": lv.before_ms, "after_ms": lv.after_ms,
                                           "before_steps": lv.before_steps, "after_steps": lv.after_steps}
                                       for k, lv in first_sh.levels.items()},
                            "window": {"where": place.where, "call": place.call, "steps": place.steps},
                            "work_growth_us": growth}
        if growth:
            grew = max(growth.items(), key=lambda kv: kv[1]["after_us"] - kv[1]["before_us"])
            grown = change(ms(grew[1]["before_us"]), ms(grew[1]["after_us"]), " to ")
            causes.append(f"in call {call}, {grew[0]} grew from {grown} per step across the change")
            if "attention" in grew[0]:
                causes.append("attention's host time growing at new sequence lengths is cuDNN building a plan for "
                              "each length it has not seen (measured on H200 with device_map)")
        elif place.where != "straddles":
            remedies.append(f"to see what changes in call {call}, profile across step {start}: "
                            f"`dstrace record --window-call {call} --window-start {max(start - 1, 1)} --window-steps 3`")
    summary = "; ".join(parts)
    cause = ("the steps of one call are not alike: the step time changed level and stayed there"
             + ("; " + "; ".join(causes) if causes else
                "; what changed is not in the traces (the profiled window does not cover the change)"))
    remedy = ("compare configurations on the same level: time more calls and steps, warm up with a call as long "
              "as the timed one, and report both levels rather than a whole-call average"
              + ("; " + "; ".join(remedies) if remedies else ""))
    ranks = sorted({r for found in per_call.values() for r, _ in found})
    return finding(DOCS, "step-time-shift", ranks, summary, {"threshold_ratio": SHIFT_RATIO, "calls": calls}, cause,
                   remedy)


def window_not_representative(inputs: FindingInputs) -> Finding | None:
    """The profiled window lies at another level than the run's typical decode step: its call's unprofiled steps
    at the window's side of any shift run at another speed. The profiler's own cost (profiled vs unprofiled steps
    of one level, `shift.profiler_cost`) is not such a difference: it is quoted apart, as the Steps line does."""
    run, steps = inputs.run, inputs.steps
    if steps is None or steps.ms_per_step is None or steps.ms_per_step_covers != MANIFEST_COVERS:
        return None
    level = level_ms(run.manifests)
    if level is None:
        return None
    samples, level_label = level
    level_value, level_count = float(statistics.median(samples)), len(samples)
    level_ratio = level_value / steps.ms_per_step
    if 1 / UNREPRESENTATIVE_RATIO < level_ratio < UNREPRESENTATIVE_RATIO:
        return None
    others = Counter(t for m in run.manifests.values() for t in decode_step_ms(m))
    others.subtract(Counter(samples))
    rest = list(others.elements())
    if not rest or not apart(samples, rest):
        return None  # the run's other steps overlap the window's level: one level, however its median falls
    profiled = {}
    for r, m in sorted(run.manifests.items()):
        call, shown = window_steps(m)
        times = next((c.step_ms for c in m.calls if c.index == call), [])
        profiled[r] = [times[s] for s in shown]
    window_ms = median_or_none([v for vs in profiled.values() for v in vs])
    w = next(m.window for m in run.manifests.values() if m.window and m.window.recorded_steps)
    shown = sorted({s for r, m in run.manifests.items() for s in window_steps(m)[1]})
    where = f"call {w.call}, {_steps_label(shown[0], shown[-1])}"
    cost = profiler_cost(run.manifests)
    summary = (f"the profiled window ({where}) lies at another level than the run's typical step: its call's "
               f"unprofiled steps at that level ({level_label}, {level_count} steps) take {step_ms(level_value)}, "
               f"{ratio(level_ratio)} the run's {step_ms(steps.ms_per_step)} per decode step; the trace shows a "
               f"{'slower' if level_ratio > 1 else 'faster'} moment than the typical step"
               + (f"; apart from that, {cost.line()}" if cost else ""))
    shifts = [sh for m in run.manifests.values() for sh in call_shifts(m) if sh.call == w.call]
    cause = ("the window's level differs from the run's typical one"
             + (f": call {w.call} changes level at step {shifts[0].start} and the window lies on one side "
                "(see step-time-shift)" if shifts else f": call {w.call} runs at another speed than the other calls")
             + "; the traced shares (idle, wait, host time) describe that level, not the run's typical step")
    if shifts:
        later = shifts[0].start + 1 if level_label.startswith("before") else max(shifts[0].start - 3, 2)
        remedy = (f"profile steps of the level you care about (e.g. `dstrace record --window-call {w.call} "
                  f"--window-start {later}`), ")
    else:
        typical = min((c for m in run.manifests.values() for c in m.calls if c.index != w.call and not c.error),
                      key=lambda c: abs(statistics.median(c.step_ms[1:] or c.step_ms) - steps.ms_per_step),
                      default=None)
        remedy = (f"profile a call at the typical level (e.g. `dstrace record --window-call {typical.index}`), "
                  if typical else "profile a call at the typical level, ")
    remedy += "and take step times from the manifests (`ms per decode step`, the profiler's steps left out)"
    return finding(DOCS, "window-not-representative", sorted(r for r, v in profiled.items() if v), summary,
                   {"threshold_ratio": UNREPRESENTATIVE_RATIO, "level_ms": level_value, "level": level_label,
                    "level_steps": level_count, "window_ms_median": window_ms, "ms_per_step": steps.ms_per_step,
                    "ratio": level_ratio, "profiler_cost": cost_json(cost),
                    "profiled_step_ms": {str(r): v for r, v in profiled.items()}}, cause, remedy)
