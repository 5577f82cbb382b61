"""How dstrace writes files: a run folder's files whole or not at all and never through a link, and the
user's `-o` output wherever it points (reading them is `untrusted`'s).

A run-folder write (`atomic_file`) goes to a new temporary file with a random name in the target's folder
(created exclusively, without following links), is flushed to disk, then renamed over the target: a
rename replaces a link at the target rather than writing where it points. A write that fails leaves no
temporary file. Only a regular file (or a link, or nothing) is renamed over: a device, FIFO or socket
put where a kept file goes is refused, never replaced (as root a rename would replace /dev/null itself).

A user's output (`output_file`, `-o FILE`) is the same atomic write when FILE is a regular file or new;
onto a device, a FIFO or a link to one (`/dev/null`, `/dev/stdout`, `/proc/self/fd/1`) it is written
in place, as a shell's `>` would, never renamed over.

Files keep the mode of the file they replace (an 0600 report stays 0600); new files get 0666 less the
umask, as `open` would give them.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager

from dstrace.runfolder.untrusted import open_regular


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (a change, even undone at once,
    would give a file another thread creates meanwhile the wrong mode)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _mode_for(path: str, existing: os.stat_result | None) -> int:
    if existing is not None and stat.S_ISREG(existing.st_mode):
        return stat.S_IMODE(existing.st_mode)
    return 0o666 & ~current_umask()


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


@contextmanager
def atomic_file(path: str, mode: str = "w", file_mode: int | None = None):
    """A new file at `path`, whole or not at all. Refused (OSError) when `path` is a device, FIFO, socket or
    folder: only a regular file or a link is replaced. `file_mode`: the mode to give it (default: the
    replaced file's, else 0666 less the umask)."""
    existing = _lstat(path)
    if existing is not None and not (stat.S_ISREG(existing.st_mode) or stat.S_ISLNK(existing.st_mode)):
        raise OSError(errno.EEXIST, f"{_kind(existing.st_mode)} is there, not a file: dstrace replaces regular "
                                    "files only; remove it or choose another file", path)
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path, existing) if file_mode is None else file_mode)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def writes_in_place(path: str) -> bool:
    """Whether a user's output goes into what is already at `path` rather than a new file renamed over it: a
    device, FIFO or socket, or a link to one, or anything reached through /proc (`/dev/stdout` is a link to
    `/proc/self/fd/1`, which no rename may replace). Links are followed one at a time to see where they go."""
    hop = os.path.abspath(path)
    for _ in range(40):
        hop = os.path.join(os.path.realpath(os.path.dirname(hop)), os.path.basename(hop))
        if hop.startswith("/proc/"):
            return True
        found = _lstat(hop)
        if found is None:
            return False  # nothing there, or a dangling link: a new file is made
        if not stat.S_ISLNK(found.st_mode):
            return not (stat.S_ISREG(found.st_mode) or stat.S_ISDIR(found.st_mode))
        hop = os.path.join(os.path.dirname(hop), os.readlink(hop))
    return False


@contextmanager
def output_file(path: str, mode: str = "w"):
    """Where a user's `-o FILE` output goes: written in place into a device, FIFO or /proc link
    (`writes_in_place`), else an `atomic_file`. A folder is refused (OSError)."""
    if os.path.isdir(path):
        raise OSError(errno.EISDIR, "a folder, not a file: choose a file name", path)
    if not writes_in_place(path):
        with atomic_file(path, mode) as f:
            yield f
        return
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0)
    if stat.S_ISREG(os.stat(path).st_mode):
        flags |= os.O_TRUNC  # /proc/self/fd/1 onto a file: as the shell's `>` does
    with os.fdopen(os.open(path, flags), mode) as f:
        yield f


def write_text_atomic(path: str, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def write_output(path: str, data: str | bytes) -> None:
    """A user's output file (`output_file`), whole."""
    with output_file(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def copy_regular_atomic(source: str, dest: str) -> None:
    """Copy a regular file (never a link) to `dest`, whole or not at all, with a mode no wider than the
    source's (and the umask's)."""
    if os.path.islink(source):
        raise ValueError(f"{source} is a link: only the run folder's own files are copied")
    with open_regular(source) as src:
        allowed = stat.S_IMODE(os.fstat(src.fileno()).st_mode) & 0o666 & ~current_umask()
        with atomic_file(dest, "wb", file_mode=allowed) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


class OutputRefused(ValueError):
    """A folder a verb was told to write into and must not: the message is the user's one line."""


def make_output_folder(path: str, instead: str) -> str:
    """`path` made absolute and made if new, for a verb to write a run folder into: never through a link,
    never over a file. Refusals are one line ending in `instead` (what to give the verb instead)."""
    path = os.path.abspath(path)
    if os.path.islink(path):
        raise OutputRefused(f"{path} is a link: dstrace writes no run folder through one; {instead}")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise OutputRefused(f"{path} is there and is not a folder: {instead}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise OutputRefused(f"cannot make the folder {path} ({e.strerror or e}); {instead}") from None
    return path
