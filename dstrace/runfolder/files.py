"""How dstrace writes a run folder's files: whole or not at all, and never through a link (reading them is
`untrusted`'s).

A write goes to a new temporary file with a random name in the target's folder (created exclusively,
without following links), is flushed to disk, then renamed over the target: a rename replaces a link at
the target rather than writing where it points. A write that fails leaves no temporary file.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager

from .untrusted import open_regular


@contextmanager
def atomic_file(path: str, mode: str = "w"):
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: str, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def copy_regular_atomic(source: str, dest: str) -> None:
    """Copy a regular file (never a link) to `dest`, whole or not at all."""
    if os.path.islink(source):
        raise ValueError(f"{source} is a link: only the run folder's own files are copied")
    with open_regular(source) as src, atomic_file(dest, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)

