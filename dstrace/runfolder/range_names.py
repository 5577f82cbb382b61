"""The names of dstrace's own ranges in a trace: the recording writes them (`recording.ranges`, inside the job)
and the analysis reads them, so both take them from here and cannot drift apart. Standard library only.

    dstrace/step#<n>                       one forward of generate() (n = 0 is the prefill)
    dstrace/generate, dstrace/chat         one top-level call
    dstrace/zero3.allgather bytes=<n>      one ZeRO-3 all-gather of n bytes
    dstrace/zero3.fetch <Module>#<id>      one ZeRO-3 parameter fetch (and `zero3.release`) of a submodule
"""
from __future__ import annotations

import re

PREFIX = "dstrace/"
WHOLE_CALLS = ("generate", "chat")
ZERO3_KINDS = ("fetch", "release")


def step(n: int) -> str:
    return f"step#{n}"


def allgather(nbytes: int) -> str:
    return f"zero3.allgather bytes={nbytes}"


def zero3(kind: str, module_label: str) -> str:
    """A fetch or release range (`ZERO3_KINDS`) of the submodule `module_label` (`<class>#<id>`)."""
    return f"zero3.{kind} {module_label}"


_P = re.escape(PREFIX)
DSTRACE_STEP = re.compile(rf"^{_P}step#(\d+)$")
ALLGATHER_RANGE = re.compile(rf"^{_P}zero3\.allgather bytes=(\d+)")
WHOLE_CALL_RANGES = re.compile(rf"^{_P}(?:step#\d+|{'|'.join(WHOLE_CALLS)})$")


def range_label(name: str) -> str:
    """`dstrace/zero3.fetch LlamaDecoderLayer#12` -> `zero3.fetch LlamaDecoderLayer`; sizes and ids dropped
    (also `#?`, the id of a parameter DeepSpeed had not numbered)."""
    label = re.sub(r"#[^#\s]*$", "", name.removeprefix(PREFIX))
    return re.sub(r"\s*bytes=\d+", "", label)
