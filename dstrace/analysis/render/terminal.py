"""How a text report is laid out for where it goes: the terminal's width and colour, or 100 plain columns.

rich lays out the tables and wraps the lines; every untrusted value reaches it as `Text` (never markup)
after `one_line`, so the only escape sequences in the output are the colours chosen here.
"""
from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from typing import Callable

PLAIN_WIDTH = 100
"""Columns of a report that does not go to a terminal (a pipe, a file)."""
MIN_WIDTH = 40


@dataclass(frozen=True)
class Screen:
    width: int = PLAIN_WIDTH
    color: bool = False
    verbose: bool = False

    def options(self) -> dict:
        """What a kept report depends on besides the folder (`report_cache` keys on it)."""
        return {"width": self.width, "color": self.color, "verbose": self.verbose}


def screen_for(to_file: bool, verbose: bool = False, stream=None) -> Screen:
    """The terminal's width and colour when the report goes to one; colour off under NO_COLOR
    (https://no-color.org: set to anything non-empty) and whenever it goes to a pipe or a file."""
    stream = sys.stdout if stream is None else stream
    try:
        tty = not to_file and stream.isatty()
        width = os.get_terminal_size(stream.fileno()).columns if tty else PLAIN_WIDTH
    except (OSError, ValueError, AttributeError):
        tty, width = False, PLAIN_WIDTH
    color = tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    return Screen(width=max(width, MIN_WIDTH), color=color, verbose=verbose)


def capture(screen: Screen, draw: Callable) -> str:
    """What `draw(console)` prints, as a string laid out for `screen`."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=screen.width, force_terminal=screen.color, no_color=not screen.color,
                      color_system="standard" if screen.color else None, markup=False, highlight=False,
                      emoji=False, soft_wrap=False, legacy_windows=False, force_jupyter=False,
                      force_interactive=False)
    draw(console)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
