"""Step-time shifts, and the profiler's own cost: two different reasons why steps of one call differ.

Seen on H200: HF `device_map` decode steps 0-3 of a call at ~21 ms, steps 4-31 at ~55 ms (cuDNN attention
planning each sequence length it had not seen); ZeRO-3 runs shift too. A whole-call median then describes
neither level, and a profiled window inside one level says nothing of the other. Profiled steps cost more
than unprofiled ones (ZeRO-3 1.37x), and the steps where the profiler starts and stops 2-5x a profiled step:
those are not a change of level. So steps are compared like with like (`steps.step_kinds`): a level change
must show in each kind of step that has steps on both sides of it, boundary steps are left out, and the
profiler's cost is profiled against unprofiled steps of one level. Manifests' per-step times only: any
recording mode, traces or not.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from dstrace.analysis.step_kinds import PROFILED, UNPROFILED, step_kinds
from dstrace.runfolder.records import Manifest

SHIFT_RATIO = 1.25
"""Repeats of one configuration on the H200 machine spread up to ~20% (docs/root-cause.md); a change of
level smaller than that within one call is not told apart from noise."""

MIN_LEVEL_STEPS = 3
"""A level must last at least 3 decode steps (the profiler's boundary steps in it count: they ran at that
level too): one or two slow steps are a hiccup, not a regime."""

MIN_CLEAN_STEPS = 2
"""...and hold at least 2 steps that are neither boundary steps nor on the other level's side of the midpoint."""

UNREPRESENTATIVE_RATIO = 1.25
"""The window's level (its call's unprofiled steps at the window's side of any shift) this far, either way,
from the run's ms per step: the trace shows another moment than the run's typical step (same noise bound as
SHIFT_RATIO). The profiler's own cost is not counted in: it is `profiler_cost`, reported apart."""

CLEAN_KINDS = (UNPROFILED, PROFILED)


@dataclass
class Level:
    """One kind of step on both sides of a shift: medians before and after, and which steps."""
    before_ms: float | None
    after_ms: float | None
    before_steps: list[int]
    after_steps: list[int]


@dataclass
class Shift:
    """One call's change of level on one rank: from step `start` on (the first clean step of the new level),
    the decode steps [first_before, last_after] run at another level; `levels` per step kind."""
    call: int
    start: int
    first_before: int
    last_after: int
    levels: dict[str, Level] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """The kind of step whose two levels are quoted: unprofiled when it has both, else profiled."""
        return next(k for k in CLEAN_KINDS if k in self.levels and self._both(k))

    def _both(self, kind: str) -> bool:
        lv = self.levels[kind]
        return lv.before_ms is not None and lv.after_ms is not None

    @property
    def before_ms(self) -> float:
        return self.levels[self.kind].before_ms

    @property
    def after_ms(self) -> float:
        return self.levels[self.kind].after_ms

    @property
    def ratio(self) -> float:
        return self.after_ms / self.before_ms


def _iqr(values: np.ndarray) -> tuple[float, float]:
    return float(np.percentile(values, 25)), float(np.percentile(values, 75))


def _cost(logs: np.ndarray) -> float:
    return float(np.abs(logs - np.median(logs)).sum()) if len(logs) else 0.0


def find_level_change(steps: list[tuple[int, float, str]]) -> tuple[int, dict[str, Level]] | None:
    """(index of the first clean step of the second level, levels per kind) or None; `steps` are (index, ms,
    kind) of consecutive decode steps.

    Boundary steps are left out. The split is the one that leaves the least absolute deviation (in log time)
    from the median of each kind on each side. It is a shift when every kind with steps on both sides changes
    the same way by SHIFT_RATIO or more with the two sides' interquartile ranges apart, and each side lasts
    MIN_LEVEL_STEPS steps and holds MIN_CLEAN_STEPS clean steps on its own side of each kind's midpoint, and
    fewer than a quarter on the other side (a sustained level, not a few outliers).
    """
    if not steps:
        return None
    first, last = steps[0][0], steps[-1][0]
    clean = [(i, ms, k) for i, ms, k in steps if k in CLEAN_KINDS]
    if any(ms <= 0 for _, ms, _ in clean) or last - first + 1 < 2 * MIN_LEVEL_STEPS:
        return None
    idx = np.array([i for i, _, _ in clean])
    values = np.array([ms for _, ms, _ in clean], dtype=float)
    logs = np.log(values)
    kinds = np.array([k for _, _, k in clean])
    best, best_cost = None, np.inf
    for start in idx:
        if start - first < MIN_LEVEL_STEPS or last - start + 1 < MIN_LEVEL_STEPS:
            continue
        before = idx < start
        cost = sum(_cost(logs[(kinds == k) & before]) + _cost(logs[(kinds == k) & ~before]) for k in CLEAN_KINDS)
        if cost < best_cost:
            best, best_cost = int(start), cost
    if best is None:
        return None
    levels, ratios, own, other = {}, [], {True: 0, False: 0}, {True: 0, False: 0}
    for k in CLEAN_KINDS:
        mine = kinds == k
        left, right = values[mine & (idx < best)], values[mine & (idx >= best)]
        if not len(left) and not len(right):
            continue
        levels[k] = Level(float(np.median(left)) if len(left) else None,
                          float(np.median(right)) if len(right) else None,
                          idx[mine & (idx < best)].tolist(), idx[mine & (idx >= best)].tolist())
        if not len(left) or not len(right):
            continue
        b, a = levels[k].before_ms, levels[k].after_ms
        (l_lo, l_hi), (r_lo, r_hi) = _iqr(left), _iqr(right)
        if l_lo <= r_hi and r_lo <= l_hi:
            return None
        ratios.append(a / b)
        mid = float(np.sqrt(a * b))
        for side, times, level in ((True, left, b), (False, right, a)):
            on_own = int(((times > mid) == (level > mid)).sum())
            own[side] += on_own
            other[side] += len(times) - on_own
    if not ratios or min(max(r, 1 / r) for r in ratios) < SHIFT_RATIO or len({r > 1 for r in ratios}) > 1:
        return None
    if any(own[side] < MIN_CLEAN_STEPS or other[side] * 4 > own[side] + other[side] for side in own):
        return None
    return best, levels


def find_shift(step_ms: list[float], first_step: int = 1) -> tuple[int, float, float] | None:
    """`find_level_change` over unprofiled steps only: (first step of the second level, before, after)."""
    found = find_level_change([(first_step + i, ms, UNPROFILED) for i, ms in enumerate(step_ms)])
    if found is None:
        return None
    start, levels = found
    return start, levels[UNPROFILED].before_ms, levels[UNPROFILED].after_ms


def call_steps(manifest: Manifest, call) -> list[tuple[int, float, str]]:
    """(index, ms, kind) of the call's decode steps (the prefill, step 0, is another kind of work)."""
    kinds = step_kinds(manifest, call)
    return [(i, ms, kinds[i]) for i, ms in enumerate(call.step_ms) if i > 0]


def call_shifts(manifest: Manifest) -> list[Shift]:
    """Each call's shift among its decode steps."""
    out = []
    for call in manifest.calls:
        if call.error or len(call.step_ms) < 2:
            continue
        found = find_level_change(call_steps(manifest, call))
        if found:
            start, levels = found
            out.append(Shift(call.index, start, 1, len(call.step_ms) - 1, levels))
    return out


@dataclass
class WindowPlace:
    """Where the profiled window lies against a shift: `before`, `after` or `straddles` the change; `other
    call` when the window profiled another call; `none` when nothing was profiled. `steps` are the window's
    profiled steps (its start and stop steps left out)."""
    where: str
    call: int | None
    steps: list[int]


def window_steps(manifest: Manifest) -> tuple[int | None, list[int]]:
    """The window's call and its profiled steps (kind `profiled`, prefill included), as the manifest has them."""
    w = manifest.window
    if not w or w.mode != "full" or not w.recorded_steps:
        return None, []
    call = next((c for c in manifest.calls if c.index == w.call and not c.error), None)
    if call is None:
        return w.call, []
    kinds = step_kinds(manifest, call)
    return w.call, [i for i in sorted(set(w.recorded_steps)) if 0 <= i < len(kinds) and kinds[i] == PROFILED]


def window_place(manifest: Manifest, shift: Shift) -> WindowPlace:
    call, steps = window_steps(manifest)
    if not steps:
        return WindowPlace("none", None, [])
    if call != shift.call:
        return WindowPlace("other call", call, steps)
    sides = {"before" if s < shift.start else "after" for s in steps}
    return WindowPlace(sides.pop() if len(sides) == 1 else "straddles", call, steps)


@dataclass
class ProfilerCost:
    """Profiled against unprofiled decode steps of one level of the window's call (medians over ranks'
    steps): what the profiler adds to each step it records. Its start and stop steps are in neither."""
    call: int
    profiled_ms: float
    unprofiled_ms: float
    profiled_steps: int
    unprofiled_steps: int
    level: str  # "the whole call" or "before step N" / "from step N on"

    @property
    def added_ms(self) -> float:
        return self.profiled_ms - self.unprofiled_ms

    @property
    def ratio(self) -> float:
        return self.profiled_ms / self.unprofiled_ms

    def line(self) -> str:
        steps = (f"call {self.call}'s profiled steps {self.profiled_ms:.1f} ms vs {self.unprofiled_ms:.1f} ms "
                 f"unprofiled, {self.level}")
        if self.added_ms < 0:
            return f"no cost of the profiler shows: {steps} ({self.ratio:.2f}x)"
        return f"the profiler added {self.added_ms:.1f} ms per step ({self.ratio:.2f}x): {steps}"


def _level_samples(manifest: Manifest, shift: Shift | None, after: bool | None,
                   kind: str = UNPROFILED) -> list[tuple[int, float]]:
    """(step, ms) of the window's call's decode steps of `kind` on one side of `shift` (all, without one)."""
    w = manifest.window
    call = next((c for c in manifest.calls if w and c.index == w.call and not c.error), None)
    if call is None:
        return []
    return [(i, ms) for i, ms, k in call_steps(manifest, call)
            if k == kind and (shift is None or (i >= shift.start) == after)]


def profiler_cost(manifests: dict[int, Manifest]) -> ProfilerCost | None:
    """The profiler's cost per recorded step, from the level of the window's call that has both kinds of step,
    at least MIN_CLEAN_STEPS of each (the one with the most profiled steps when both sides of a shift have;
    the whole call when it has no shift). One step of a kind is one moment, not a level: no figure then."""
    windows = {r: m for r, m in manifests.items() if window_steps(m)[1]}
    if not windows:
        return None
    call = next(iter(windows.values())).window.call
    sides: dict[str, tuple[list[tuple[int, float]], list[tuple[int, float]]]] = {}
    for m in windows.values():
        shift = next((sh for sh in call_shifts(m) if sh.call == call), None)
        for after in ((None,) if shift is None else (False, True)):
            label = ("the whole call" if shift is None else
                     f"{'from' if after else 'before'} step {shift.start}{' on' if after else ''}")
            acc = sides.setdefault(label, ([], []))
            acc[0].extend(_level_samples(m, shift, after, PROFILED))
            acc[1].extend(_level_samples(m, shift, after, UNPROFILED))
    usable = [(len({i for i, _ in p}), len({i for i, _ in u}), label, p, u) for label, (p, u) in sides.items()]
    usable = [t for t in usable if min(t[0], t[1]) >= MIN_CLEAN_STEPS]
    if not usable:
        return None
    _, _, label, p, u = max(usable, key=lambda t: (t[0], t[1]))
    return ProfilerCost(call, float(statistics.median(ms for _, ms in p)), float(statistics.median(ms for _, ms in u)),
                        len(p), len(u), label)


def level_ms(manifests: dict[int, Manifest]) -> tuple[list[float], str] | None:
    """The unprofiled step times at the window's level: the window's call's unprofiled decode steps on the
    window's side of the call's shift (all of them without one), and which those are; None when the window
    straddles a shift or no unprofiled step shares its level."""
    samples, label = [], ""
    for m in manifests.values():
        call, steps = window_steps(m)
        if not steps:
            continue
        shift = next((sh for sh in call_shifts(m) if sh.call == call), None)
        place = window_place(m, shift) if shift else WindowPlace("whole", call, steps)
        if place.where == "straddles":
            return None
        after = None if shift is None else place.where == "after"
        samples.extend(ms for _, ms in _level_samples(m, shift, after))
        label = ("the whole call" if shift is None else
                 f"{'from' if after else 'before'} step {shift.start}{' on' if after else ''}")
    return (samples, label) if samples else None


def apart(a: list[float], b: list[float]) -> bool:
    """Two sets of step times whose interquartile ranges do not overlap (the shift's test of two levels)."""
    (a_lo, a_hi), (b_lo, b_hi) = _iqr(np.asarray(a, dtype=float)), _iqr(np.asarray(b, dtype=float))
    return a_hi < b_lo or b_hi < a_lo


def median_or_none(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None
