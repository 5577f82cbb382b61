"""Where a report goes: stdout, or a file whose name also picks the format unless --format says one."""
from __future__ import annotations

import os
import sys

from dstrace.runfolder.files import write_output
from dstrace.say import terminal_safe
from dstrace.errors import UserError

FORMAT_BY_EXTENSION = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown",
                       ".json": "json", ".txt": "text"}


def chosen_format(explicit: str | None, output: str | None, formats: tuple[str, ...]) -> str:
    """`--format` when given; else the output file's extension, when it names a format offered; else text."""
    if explicit:
        return explicit
    by_name = FORMAT_BY_EXTENSION.get(os.path.splitext(output or "")[1].lower())
    return by_name if by_name in formats else "text"


def write_report(text: str, output: str | None, escaped: bool = False) -> None:
    """To stdout (its control characters escaped: a report read in a terminal must not drive it; `escaped`:
    the renderer escaped every value itself and its only escape sequences are its colours), or to the
    file, whole or not at all (into a device, FIFO or /proc link in place: `files.output_file`)."""
    if not output:
        sys.stdout.write(text if escaped else terminal_safe(text))
        return
    try:
        write_output(output, text)
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror or exc}; choose another file with -o") from None
    print(f"dstrace: wrote {os.path.abspath(output)}", file=sys.stderr)
