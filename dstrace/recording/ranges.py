"""Named ranges, emitted twice: NVTX for Nsight Systems, `record_function` for the torch.profiler trace.

`torch.cuda.nvtx` ranges never reach a Kineto trace, and DeepSpeed's own `instrument_w_nvtx` marks show
only in Nsight; so each dstrace range is both. `record_function` is only entered while the profiler
window is open: outside it the profiler records nothing anyway. NVTX ranges go out only when a tool
listens (Nsight Systems injects itself at process start through NVTX_INJECTION64_PATH; the nvtx package
then gives a live domain). The ZeRO-3 hooks open a range only when `active`: ranges that nobody recorded,
about a thousand per decode step, cost 1.6% of an H200 decode step (docs/performance.md).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

from dstrace.runfolder.range_names import PREFIX

NVTX_DOMAIN = "dstrace"
# Set by Nsight Systems (and other NVTX tools) when it injects itself; without it NVTX records nothing.
NVTX_TOOL_VARIABLES = ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH")


def _listening_domain():
    """dstrace's NVTX domain if a tool records NVTX in this process, else None.

    The nvtx package is imported only then: a job that does not import it itself finds no nvtx module
    in its process under dstrace either.
    """
    if not any(os.environ.get(name) for name in NVTX_TOOL_VARIABLES):
        return None
    try:
        import nvtx

        domain = nvtx.get_domain(NVTX_DOMAIN)
        return domain if isinstance(domain, nvtx.Domain) else None
    except Exception:  # noqa: BLE001 - no NVTX is no reason to fail the job
        return None


_domain = _listening_domain()
_attributes: dict = {}  # range name -> its NVTX event attributes, made once (nvtx's fast path)
_profiling = False
active = _domain is not None
"""Whether anything records a range now: an NVTX tool, or the open profiler window."""


def set_profiling(on: bool) -> None:
    global _profiling, active
    _profiling = on
    active = on or _domain is not None


def nvtx_available() -> bool:
    """Whether the job's environment has the nvtx package, found without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec("nvtx") is not None
    except (ImportError, ValueError):
        return False


class Range:
    """An open range; `close()` ends it. Hooks open in a pre-hook and close in the matching post-hook."""

    __slots__ = ("_rf",)

    def __init__(self, name: str):
        full = PREFIX + name
        if _domain is not None:
            attributes = _attributes.get(full)
            if attributes is None:
                attributes = _attributes[full] = _domain.get_event_attributes(message=full)
            _domain.push_range(attributes)
        self._rf = None
        if _profiling:
            import torch

            self._rf = torch.profiler.record_function(full)
            self._rf.__enter__()

    def close(self) -> None:
        if self._rf is not None:
            self._rf.__exit__(None, None, None)
            self._rf = None
        if _domain is not None:
            _domain.pop_range()


@contextmanager
def span(name: str):
    r = Range(name)
    try:
        yield
    finally:
        r.close()
