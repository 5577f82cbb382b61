"""The choices `dstrace analyze` (and `view`) offer, apart from the code that acts on them: building the
command line then imports no pandas, so a report kept in `report_cache` comes back at once."""
from __future__ import annotations

FORMATS = ("text", "json", "markdown", "html")
CLOCK_POLICIES = ("auto", "always", "never")
