"""What identifies a file's content and the code that read it, for what stands in for a decode (a kept
reduction, `kept`) or a whole report (`report_cache`), and what makes a kept report dstrace's own.

Either may answer only for the very bytes it was made from: the key is a hash of each whole file
(`untrusted.content`, xxh3-128, taken once per analysis on the folder's `RunFolder` entry), never its size,
time or a part of it. A kept report sits in a
folder anyone may have written, so one that dstrace did not write itself must never be shown: it is
sealed with a keyed hash (BLAKE2b) under a secret kept in the user's own cache folder, and one whose seal
does not verify is no report. (A kept reduction is validated instead, as every run-folder file: see
`kept`.) Standard library and xxhash only: a report-cache hit imports no pandas.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from functools import lru_cache
from importlib import metadata

from dstrace.runfolder.untrusted import open_regular

SEAL_BYTES = 32
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@lru_cache(maxsize=1)
def code() -> str:
    """A hash of dstrace's own source: any change to the code that made a cached result makes it stale,
    also in a development checkout whose version number does not move."""
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(PACKAGE)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, PACKAGE).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


@lru_cache(maxsize=1)
def versions() -> dict:
    """dstrace's version and code, and the versions of the libraries whose results get cached: looked up
    once per process, not for each trace's cache (callers read it, never change it)."""
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    from dstrace import __version__

    return {"dstrace": __version__, "code": code(), "hta": version("holistictraceanalysis"),
            "pandas": version("pandas")}


def _key_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dstrace", "cache-seal.key")


@lru_cache(maxsize=1)
def _secret() -> bytes:
    """The user's sealing key, made on first use (readable by the user alone). Where none can be kept, a key
    for this process only: caches are then written but never believed later, which costs speed, not answers."""
    path = _key_path()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(SEAL_BYTES))
            try:
                os.link(tmp, path)  # never replaces a key another process made meanwhile
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        with open_regular(path) as f:
            key = f.read(SEAL_BYTES + 1)
        if len(key) == SEAL_BYTES:
            return key
    except OSError:
        pass
    return secrets.token_bytes(SEAL_BYTES)


def seal(data: bytes) -> bytes:
    """The keyed hash that shows dstrace, for this user, wrote `data`."""
    return hashlib.blake2b(data, key=_secret(), digest_size=SEAL_BYTES).digest()


def sealed(data: bytes, mark: bytes) -> bool:
    return hmac.compare_digest(seal(data), mark)
