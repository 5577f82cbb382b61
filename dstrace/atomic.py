"""The one way dstrace writes a file: whole or not at all, and never through a link.

The text goes to a new temporary name in the target's folder (created exclusively, so a link planted
under that name is not followed), is flushed to disk, then renamed over the target; a rename replaces a
link at the target rather than writing where it points. A write that fails leaves no temporary file.
"""
from __future__ import annotations

import os

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with os.fdopen(os.open(tmp, _FLAGS, 0o644), "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
