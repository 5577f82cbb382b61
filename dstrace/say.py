"""What dstrace prints: one `dstrace: ...` line at a time, safe for a terminal.

Run folders are untrusted: a kernel name, a host name or a file name can carry escape sequences (clear
the screen, write the clipboard through OSC 52, rewrite earlier lines). Control characters, line
separators and bidirectional overrides are shown as `\\uNNNN` escapes instead of being acted on.
"""
from __future__ import annotations

import re
import sys

# C0 and C1 controls (newline and tab handled by the caller's choice), DEL, line/paragraph separators,
# and the bidirectional embeddings, overrides and isolates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match) -> str:
    """`\\u001b` for ESC: readable, and still valid inside a JSON string."""
    return f"\\u{ord(match.group()):04x}"


def terminal_safe(text: str) -> str:
    """A report for a terminal: its lines kept, every other control character escaped."""
    return _UNSAFE.sub(_escaped, text)


def one_line(text: str) -> str:
    """An untrusted value inside one line of a report: newlines and tabs escaped too."""
    return _UNSAFE_LINE.sub(_escaped, str(text))


def md_inline(text: str) -> str:
    """An untrusted value inside one line of markdown: one line, and no HTML tag GitHub would render."""
    return one_line(text).replace("<", "&lt;")


def say(message: str) -> None:
    print(f"dstrace: {one_line(message)}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    say(f"warning: {message}")
