"""Reading a file of a run folder, which is untrusted input: in bounded memory and time, or one line saying why not.

A run folder may come from anyone. A file named like a trace may be a FIFO (opening it would wait forever),
a device, a gzip that inflates a thousandfold (9 MB of zeros is 9 GB), or gigabytes of JSON. Every
file the analysis reads goes through `open_regular`; traces through `json_chunks` as well,
which inflates piece by piece and stops at the limits below with a `Refused` that says what is wrong.
Standard library only, but for ISA-L's inflate (`isal`, 3-4x zlib's speed), imported at the first gzip
where it is installed: a recorded job imports this module and must import nothing it would not; the kept
report's key (`report_cache`) uses it without importing pandas.
"""
from __future__ import annotations

import errno
import os
import queue
import stat
import threading
import zlib
from collections.abc import Iterator

MAX_JSON_BYTES = 1 << 30
"""JSON one trace may hold: 1 GiB (a window of ~40 decode steps of an 80-layer model is ~1 GB). Analyzing a
trace laid out as torch.profiler writes it peaks at about 2x its JSON over the interpreter's ~170 MB
(bench/trace_layouts.py: 2.0x measured from 30 to 200 MB), so this limit holds one trace to ~2.3 GB (extrapolated); the
other layouts have their own limits (`tracefile.MAX_EVENTS`, `tracefile.MAX_WHOLE_BYTES`). docs/run-folder.md."""
MAX_INFLATION = 100
"""How many times its size a gzip may inflate to: torch.profiler's traces inflate 10-20x (12x and 16x
measured), a file of zeros 1000x."""
INFLATION_GRACE = 64 << 20
"""JSON a gzip may inflate to whatever its ratio, so that small files are never refused for it."""
READ_BYTES = 1 << 20
HASH_READ_BYTES = 8 << 20


class Refused(ValueError):
    """The file is not read: its message says what is wrong with it and what to do."""


class TooLarge(Refused):
    """More text than the reader's limit."""


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def open_regular(path: str):
    """The file opened for binary reading, if it is a regular file (links followed). Opened without blocking
    and checked on the open descriptor, so a FIFO put in its place meanwhile cannot hang the reader.
    Raises Refused for anything else, OSError when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Refused(f"{_kind(mode)}, not a file: remove it from the folder or rename it")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def unreadable(path: str, exc: OSError) -> str:
    """Why a file of a run folder could not be opened, and what to do, in one line."""
    if os.path.islink(path) and not os.path.exists(path):
        if exc.errno == errno.ELOOP:
            return "a link in a loop of links: remove it from the folder"
        return f"a link to {os.readlink(path)!r}, which does not exist: remove it or put the file there"
    if exc.errno in (errno.EPERM, errno.EACCES):
        return "not readable by you (permission denied): make it readable or remove it from the folder"
    return f"unreadable ({exc.strerror or exc}): remove it from the folder or replace it with the file itself"


def read_bytes(path: str, limit: int) -> bytes:
    """A regular file's bytes, refused when it has more than `limit`."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"larger than {limit >> 20} MiB, more than this file can hold")
    return data


def content(path: str) -> dict:
    """Size and a hash of every byte (xxh3-128, ~10 GB/s: well under a parse), never its size, time or a part of
    it: any edit, wherever it is and whatever it does to size and mtime, changes it. What the kept reduction and
    the kept report are keyed on. Raises OSError (or Refused for what is not a regular file)."""
    import xxhash  # dstrace's environment only: the recorded job never hashes

    h = xxhash.xxh3_128()
    size = 0
    with open_regular(path) as f:
        while chunk := f.read(HASH_READ_BYTES):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "xxh3_128": h.hexdigest()}


def _too_much(total: int, limit: int) -> TooLarge:
    return TooLarge(f"holds more than {limit / 2**30:.3g} GiB of JSON ({total / 1e9:.1f} GB read so far), more than "
                    "dstrace reads from one file: record a shorter window (dstrace record --window-steps)")


def json_chunks(path: str, size: int = 8 << 20, limit: int = MAX_JSON_BYTES) -> Iterator[bytes]:
    """The file's text in pieces of at most `size` bytes, inflated when the name ends in .gz; at most `limit`
    bytes in all, and a gzip never more than MAX_INFLATION times what was read of it (beyond a grace).
    Raises TooLarge past `limit`, Refused past the other limits, ValueError for a damaged gzip, OSError when unreadable."""
    with open_regular(path) as f:
        if not path.endswith(".gz"):
            total = 0
            while piece := f.read(size):
                total += len(piece)
                if total > limit:
                    raise _too_much(total, limit)
                yield piece
            return
        yield from _inflate(f, size, limit)


def _gzip_module():
    """ISA-L's zlib-compatible inflate where isal is installed, else the standard library's."""
    try:
        from isal import isal_zlib

        return isal_zlib
    except ImportError:  # a platform without isal's wheels: a third of the speed
        return zlib


def _inflate(f, size: int, limit: int) -> Iterator[bytes]:
    """gzip members one after the other, as `gzip` reads them; zero padding after the last is ignored."""
    gz = _gzip_module()
    read = out = 0
    d = gz.decompressobj(16 + zlib.MAX_WBITS)
    pending = b""
    while True:
        if not pending:
            pending = f.read(READ_BYTES)
            read += len(pending)
        if d.eof and pending:
            rest = pending.lstrip(b"\0")
            pending = b""
            if rest:
                d, pending = gz.decompressobj(16 + zlib.MAX_WBITS), rest
            continue
        try:
            piece = d.decompress(pending, size) if pending else d.flush()
        except gz.error as exc:
            raise ValueError(f"truncated or corrupt gzip ({exc})") from None
        out += len(piece)
        if out > limit:
            raise _too_much(out, limit)
        if out > MAX_INFLATION * read + INFLATION_GRACE:
            raise Refused(f"a gzip that inflates more than {MAX_INFLATION}x ({out / 1e6:.0f} MB of JSON from "
                          f"{read / 1e6:.1f} MB read so far): not a trace torch.profiler wrote (those inflate 10-20x); "
                          "remove it from the folder")
        if piece:
            yield piece
        if not pending:
            break
        pending = d.unused_data if d.eof else d.unconsumed_tail
    if not d.eof:
        raise ValueError("truncated or corrupt gzip (the file ends before its compressed data does)")


_END = object()


def read_ahead(chunks: Iterator[bytes], depth: int = 2) -> Iterator[bytes]:
    """The same pieces, made `depth` ahead in a thread: inflating and reading release the GIL, so the next
    piece inflates on another core while the caller decodes this one (a 300 MB trace: ~0.7 s of 2.3 s). At
    most `depth` pieces wait; an error in the thread is raised here; the thread ends when the caller stops."""
    waiting: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                waiting.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not put(chunk):
                    return
            put(_END)
        except BaseException as exc:  # handed to the caller, which raises it
            put(exc)

    thread = threading.Thread(target=produce, name="dstrace-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := waiting.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()
        chunks.close()
