"""Step-time shifts: a call whose decode steps run at one level, then at another, for good.

Seen on H200: HF `device_map` decode steps 0-3 of a call at 33-65 ms, steps 4-31 at 105-188 ms (cuDNN
attention planning each sequence length it had not seen); ZeRO-3 runs shift too. A whole-call median
then describes neither level, and a profiled window inside one level says nothing of the other. The
detector reads the manifests' per-step times only, so it works in any recording mode, traces or not.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from dstrace.runfolder.records import Manifest

SHIFT_RATIO = 1.25
"""Repeats of one configuration on the H200 machine spread up to ~20% (docs/root-cause.md); a change of
level smaller than that within one call is not told apart from noise."""

MIN_LEVEL_STEPS = 3
"""A level must hold for at least 3 steps: one or two slow steps are a hiccup, not a regime."""

UNREPRESENTATIVE_RATIO = 1.25
"""The profiled steps' median this far (either way) from the run's ms per step: the trace shows another
moment than the run's typical step (same noise bound as SHIFT_RATIO)."""


@dataclass
class Shift:
    """One call's change of level on one rank: steps [first_before, start) at `before_ms`, [start, last_after]
    at `after_ms` (medians)."""
    call: int
    start: int
    first_before: int
    last_after: int
    before_ms: float
    after_ms: float

    @property
    def ratio(self) -> float:
        return self.after_ms / self.before_ms


def _iqr(values: np.ndarray) -> tuple[float, float]:
    return float(np.percentile(values, 25)), float(np.percentile(values, 75))


def find_shift(step_ms: list[float], first_step: int = 1) -> tuple[int, float, float] | None:
    """(index of the first step of the second level, level before, level after) or None.

    The split is the one that leaves the least absolute deviation (in log time) from each side's median;
    it is a shift when the medians differ by SHIFT_RATIO or more, the two sides' interquartile ranges
    do not overlap, and each side holds at least MIN_LEVEL_STEPS steps on its own side of the midpoint
    between the levels (a sustained level, not a few outliers). `first_step` is the index of step_ms[0].
    """
    x = np.asarray(step_ms, dtype=float)
    if len(x) < 2 * MIN_LEVEL_STEPS or (x <= 0).any():
        return None
    logs = np.log(x)
    best, best_cost = None, np.inf
    for k in range(MIN_LEVEL_STEPS, len(x) - MIN_LEVEL_STEPS + 1):
        left, right = logs[:k], logs[k:]
        cost = np.abs(left - np.median(left)).sum() + np.abs(right - np.median(right)).sum()
        if cost < best_cost:
            best, best_cost = k, cost
    left, right = x[:best], x[best:]
    before, after = float(np.median(left)), float(np.median(right))
    if max(before, after) / min(before, after) < SHIFT_RATIO:
        return None
    (l_lo, l_hi), (r_lo, r_hi) = _iqr(left), _iqr(right)
    if l_lo <= r_hi and r_lo <= l_hi:
        return None
    mid = float(np.sqrt(before * after))
    if min(((left > mid) == (before > mid)).sum(), ((right > mid) == (after > mid)).sum()) < MIN_LEVEL_STEPS:
        return None
    return first_step + best, before, after


def call_shifts(manifest: Manifest) -> list[Shift]:
    """Each call's shift among its decode steps (the prefill, step 0, is another kind of work)."""
    out = []
    for call in manifest.calls:
        if call.error or len(call.step_ms) < 2:
            continue
        found = find_shift(call.step_ms[1:], first_step=1)
        if found:
            start, before, after = found
            out.append(Shift(call.index, start, 1, len(call.step_ms) - 1, before, after))
    return out


@dataclass
class WindowPlace:
    """Where the profiled window lies against a shift: `before`, `after` or `straddles` the change; `other
    call` when the window profiled another call; `none` when nothing was profiled."""
    where: str
    call: int | None
    steps: list[int]


def window_place(manifest: Manifest, shift: Shift) -> WindowPlace:
    w = manifest.window
    steps = list(w.recorded_steps) if w and w.mode == "full" else []
    if not steps:
        return WindowPlace("none", None, [])
    if w.call != shift.call:
        return WindowPlace("other call", w.call, steps)
    sides = {"before" if s < shift.start else "after" for s in steps}
    return WindowPlace(sides.pop() if len(sides) == 1 else "straddles", w.call, steps)


def profiled_step_ms(manifest: Manifest) -> list[float]:
    """The step times of the profiled window's steps, as the manifest recorded them."""
    w = manifest.window
    if not w or w.mode != "full" or not w.recorded_steps:
        return []
    call = next((c for c in manifest.calls if c.index == w.call and not c.error), None)
    if call is None:
        return []
    return [call.step_ms[i] for i in w.recorded_steps if 0 < i < len(call.step_ms)]


def median_or_none(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None
