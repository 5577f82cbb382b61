"""How dstrace touches files: writes whole or not at all and never through a link; reads bounded, of
regular files only (a FIFO named like a manifest would block a reader forever, a link would lead outside
the run folder).

A write goes to a new temporary file with a random name in the target's folder (created exclusively,
without following links), is flushed to disk, then renamed over the target: a rename replaces a link at
the target rather than writing where it points. A write that fails leaves no temporary file.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from contextlib import contextmanager


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


def open_regular(path: str):
    """A binary reader of a regular file that is not a link; ValueError for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        if os.path.islink(path):
            raise ValueError(f"{path} is a link: dstrace reads only the run folder's own files") from None
        raise e
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise ValueError(f"{path} is not a regular file")
    return f


def read_bytes_bounded(path: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; ValueError for anything else."""
    with open_regular(path) as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"{path} is larger than {limit >> 20} MiB: not a file dstrace wrote")
    return raw


def copy_regular_atomic(source: str, dest: str) -> None:
    """Copy a regular file (never a link) to `dest`, whole or not at all."""
    with open_regular(source) as src, atomic_file(dest, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)

