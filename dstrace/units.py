"""How a report writes a number: one function per unit, used by the findings, the report's tables, the
comparison and `dstrace try`, so that a finding and the table beside it print one value the same way.

None prints as "-" (a value not measured), never as 0.
"""
from __future__ import annotations

SIZE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
"""Decimal units (GB = 1e9 B), as nccl-tests and the bandwidths count them."""


def size(n: float | None) -> str:
    """Bytes in the largest unit that leaves at least 1 of it: `500.00 MB`, not `0.50 GB`."""
    if n is None:
        return "-"
    for unit, scale in SIZE_UNITS:
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def ms(us: float | None) -> str:
    """A time the traces measured (in us) as ms, to the 10 us."""
    return "-" if us is None else f"{us / 1e3:.2f} ms"


def step_ms(value: float | None) -> str:
    """A step's wall time as the manifests record it (already in ms), and medians of such times, to the 0.1 ms:
    the precision every step time is quoted with (the Steps line, the shift levels, the comparison)."""
    return "-" if value is None else f"{value:.1f} ms"


def us(value: float, signed: bool = False) -> str:
    """A time in us to the 0.1 us (clock offsets and residuals); `signed`: with its sign, as an offset."""
    return f"{value:+.1f} us" if signed else f"{value:.1f} us"


def percent(fraction: float | None, digits: int = 0) -> str:
    """A fraction (0.25) as a percentage (`25%`)."""
    return "-" if fraction is None else f"{fraction:.{digits}%}"


def ratio(value: float) -> str:
    """How many times another value: `1.52x`."""
    return f"{value:.2f}x"


def gbps(value: float | None) -> str:
    """A bandwidth in GB/s (1e9 B/s), the number only: a table names the unit in its column's head, a sentence
    after the number."""
    return "-" if value is None else f"{value:.2f}"


def spread(median: float, low: float, high: float, unit: str = "") -> str:
    """A median over repeats with their range: `36.1 ms/step [35.9-36.4]` (unit ` ms/step`)."""
    return f"{median:.1f}{unit} [{low:.1f}-{high:.1f}]"


def percent_range(low: float, high: float) -> str:
    """The percentages of several ranks: `30%` when they round alike, else `30-45%`."""
    if round(low * 100) == round(high * 100):
        return percent(low)
    return f"{low * 100:.0f}-{percent(high)}"


def change(before: str, after: str, link: str = " -> ") -> str:
    """Two values of one unit as a change, the unit said once: `36.0 -> 58.0 ms` (`link` " to ": `36.0 to
    58.0 ms`)."""
    number, _, unit = before.rpartition(" ")
    if number and after.endswith(f" {unit}"):
        return f"{number}{link}{after}"
    return f"{before}{link}{after}"
