"""A trace's top-level metadata (every key but `traceEvents`), read without decoding its events: what says
which rank wrote it before it is reduced (`dstrace reduce` names each rank's file by it).

torch.profiler writes `distributedInfo` before `traceEvents`, so the head of the file, a few kB, is read
alone. Where neither `distributedInfo` nor dstrace's block comes before the events, the rest may hold them:
the file is then scanned whole, once, within the run folder's bounds (`untrusted.json_chunks`), its events
kept as undecoded bytes. Raises ValueError saying what is wrong with the file, OSError when it is unreadable.
"""
from __future__ import annotations

import codecs
import json
import re

import msgspec

from dstrace.runfolder import untrusted

HEAD_LIMIT = 64 << 20
"""Metadata before the events is kB (deviceProperties of 8 GPUs: ~3 kB); more is not a trace's head."""
RANK_KEYS = ("distributedInfo", "dstrace")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])


class _Head:
    """The file's text from its start, decoded as it is read; more is read only where a value needs it."""

    def __init__(self, path: str):
        self.chunks = untrusted.json_chunks(path, size=1 << 16)
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text, self.done = "", False

    def more(self) -> None:
        """At least as much text again (so a long value costs a few passes, not one per piece), or the end."""
        want, got, pieces = max(len(self.text), 1 << 16), 0, [self.text]
        while not self.done and got < want and len(self.text) + got <= HEAD_LIMIT:
            piece = next(self.chunks, None)
            try:
                pieces.append(self.decoder.decode(piece or b"", final=piece is None))
            except UnicodeDecodeError as exc:
                raise ValueError(f"not a torch.profiler trace (not UTF-8 text: {exc.reason})") from None
            got += len(pieces[-1])
            self.done = piece is None
        self.text = "".join(pieces)
        if len(self.text) > HEAD_LIMIT:
            raise untrusted.Refused(f"more than {HEAD_LIMIT >> 20} MiB of metadata before its events: not a trace "
                                    "torch.profiler wrote")

    def at(self, pos: int) -> int:
        """The position of the next character that is not whitespace (len(text) at the end of the file)."""
        while True:
            pos = _WHITESPACE.match(self.text, pos).end()
            if pos < len(self.text) or self.done:
                return pos
            self.more()

    def value(self, pos: int):
        """The JSON value at `pos` and where it ends."""
        decoder = json.JSONDecoder()
        while True:
            try:
                value, end = decoder.raw_decode(self.text, pos)
                if end < len(self.text) or self.done:  # a number at the end of the text may go on
                    return value, end
            except json.JSONDecodeError as exc:
                if self.done:
                    raise ValueError(f"not a torch.profiler trace (bad JSON before its events: {exc.msg})") from None
            except RecursionError:
                raise ValueError("not a torch.profiler trace (nested too deeply)") from None
            self.more()

    def close(self) -> None:
        self.chunks.close()


def _expect(head: _Head, pos: int, chars: str) -> int:
    pos = head.at(pos)
    if pos >= len(head.text) or head.text[pos] not in chars:
        raise ValueError("not a torch.profiler trace (no traceEvents list)")
    return pos


def trace_metadata(path: str) -> dict:
    """The trace's top-level keys but `traceEvents`, decoded."""
    head = _Head(path)
    meta: dict = {}
    try:
        pos = _expect(head, 0, "{") + 1
        while True:
            pos = _expect(head, pos, '"}')
            if head.text[pos] == "}":
                raise ValueError("not a torch.profiler trace (no traceEvents list)")
            key, pos = head.value(pos)
            pos = _expect(head, pos, ":") + 1
            if key == "traceEvents":
                break
            meta[key], pos = head.value(head.at(pos))
            pos = _expect(head, pos, ",}")
            if head.text[pos] == "}":
                raise ValueError("not a torch.profiler trace (no traceEvents list)")
            pos += 1
    finally:
        head.close()
    if any(k in meta for k in RANK_KEYS):
        return meta
    return _whole_metadata(path)


def _whole_metadata(path: str) -> dict:
    """Every top-level key but `traceEvents`, from the whole file (whose events stay bytes)."""
    text = b"".join(untrusted.json_chunks(path))
    try:
        top = _TOP.decode(text)
        return {k: msgspec.json.decode(v) for k, v in top.items() if k != "traceEvents"}
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"not a torch.profiler trace ({exc})") from None
