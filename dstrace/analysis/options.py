"""The choices `dstrace analyze` (and `view`) offer, apart from the code that acts on them: building the
command line then imports no pandas, so a report kept in `report_cache` comes back at once."""
from __future__ import annotations

FORMATS = ("text", "json", "markdown", "html")
CLOCK_POLICIES = ("auto", "always", "never")
SOURCES = ("auto", "traces", "summaries")
AUTO_MIN_RANKS = 16
"""From this many ranks up, `--source auto` reads summaries when every rank has one: parsing each
trace costs seconds and memory per rank, and HTA's per-rank breakdowns (which need the traces) matter
less than the cross-rank picture. Below it, the traces' fuller report is cheap enough."""
