"""Named ranges, emitted twice: NVTX for Nsight Systems, `record_function` for the torch.profiler trace.

`torch.cuda.nvtx` ranges never reach a Kineto trace, and DeepSpeed's own `instrument_w_nvtx` marks show
only in Nsight; so each dstrace range is both. `record_function` is only entered while the profiler
window is open: outside it the profiler records nothing anyway, and skipping it keeps the overhead of
hundreds of ZeRO-3 fetch ranges per step out of the job.
"""
from __future__ import annotations

from contextlib import contextmanager

PREFIX = "dstrace/"
NVTX_DOMAIN = "dstrace"

try:
    import nvtx as _nvtx
except Exception:  # the nvtx wheel is optional at run time: the user's job must run without it
    _nvtx = None

_profiling = False


def set_profiling(active: bool) -> None:
    global _profiling
    _profiling = active


def nvtx_available() -> bool:
    return _nvtx is not None


class Range:
    """An open range; `close()` ends it. Hooks open in a pre-hook and close in the matching post-hook."""

    __slots__ = ("_rf",)

    def __init__(self, name: str):
        full = PREFIX + name
        if _nvtx is not None:
            _nvtx.push_range(message=full, domain=NVTX_DOMAIN)
        self._rf = None
        if _profiling:
            import torch

            self._rf = torch.profiler.record_function(full)
            self._rf.__enter__()

    def close(self) -> None:
        if self._rf is not None:
            self._rf.__exit__(None, None, None)
            self._rf = None
        if _nvtx is not None:
            _nvtx.pop_range(domain=NVTX_DOMAIN)


@contextmanager
def span(name: str):
    r = Range(name)
    try:
        yield
    finally:
        r.close()
