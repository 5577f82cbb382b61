"""The statistics a comparison rests on: which steps count, the spread over repeats, and when two
configurations cannot be told apart."""
from __future__ import annotations

import statistics
from collections.abc import Iterable

from dstrace.comparison.model import Spread
from dstrace.runfolder.records import Manifest

INDISTINGUISHABLE_RULE = ("two configurations are indistinguishable when each one's median ms per decode step "
                          "lies inside the other's min-max range over its repeats")

SAME_BYTES_TOLERANCE = 0.01
"""Bytes gathered per step are a property of the model and the partitioning, not of the prompt: runs of
one structure gather the same number every step. 1% absorbs a step whose set of fetched modules differs
(the prefill is already left out)."""


def decode_gathered_bytes(manifest: Manifest) -> list[int]:
    """Bytes gathered in each decode forward (the profiler does not change what is gathered)."""
    return [b for call in manifest.calls if not call.error for b in call.gathered_bytes[1:]]


def median(values: Iterable[float]) -> float | None:
    values = list(values)
    return float(statistics.median(values)) if values else None


def spread(values: Iterable[float | None]) -> Spread | None:
    """Median and range of one value per run; runs without the value are left out."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return Spread(median=float(statistics.median(values)), low=float(min(values)), high=float(max(values)),
                  runs=len(values))


def indistinguishable(a: Spread, b: Spread) -> bool:
    """INDISTINGUISHABLE_RULE: a single run each is a range of one point, so only equal medians tie."""
    return b.low <= a.median <= b.high and a.low <= b.median <= a.high


def same_bytes(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return False
    return abs(a - b) <= SAME_BYTES_TOLERANCE * max(a, b, 1.0)
