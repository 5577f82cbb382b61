"""What the profiler did in each forward step of a generation call: the one place analysis reads it from."""
from __future__ import annotations

from dstrace.runfolder.records import GENERATE_TRIGGER, STEP_KINDS, GenerationCall, Manifest

UNPROFILED, WARMUP, START, PROFILED, STOP = STEP_KINDS
BOUNDARY_KINDS = (WARMUP, START, STOP)
"""Steps whose time holds the profiler's own start or stop: compared with no other step."""


def step_kinds(manifest: Manifest, call: GenerationCall) -> list[str]:
    """Each forward's kind (STEP_KINDS): as recorded; for a manifest recorded before kinds were, from its window:
    that dstrace started the profiler as the window's first step began and stopped it as the last one ended, so
    those two steps carry the start and the stop."""
    n = len(call.step_ms)
    if len(call.step_kinds) == n:
        return list(call.step_kinds)
    kinds = [UNPROFILED] * n
    w = manifest.window
    if w is None or w.mode != "full" or w.call != call.index or w.trigger not in (None, GENERATE_TRIGGER):
        return kinds
    recorded = sorted(s for s in set(w.recorded_steps) if 0 <= s < n)
    for s in recorded:
        kinds[s] = PROFILED
    if recorded:
        kinds[recorded[0]] = START
        kinds[recorded[-1]] = STOP if len(recorded) > 1 else START
    return kinds
