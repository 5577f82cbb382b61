"""The profiler window: which forward steps of which chat()/generate() call the torch.profiler covers.

A 1024-token run profiled end to end writes gigabytes and skews itself; a few steady-state decode steps
say the same. The window opens before the forward pre-hook of step `start` of top-level call `call` and
closes after step `start + steps - 1` (or when that call ends). The trace is written only after the
call returns, so exporting it does not land inside the timed generation.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from ..runfolder.files import atomic_file
from . import ranges
from ..runfolder.records import Window

MODES = ("full", "annotate")


@dataclass
class WindowOptions:
    mode: str = "full"
    call: int = 1
    start: int = 2
    steps: int = 3

    def to_env(self) -> str:
        """`mode=full,call=1,start=2,steps=3`: no quotes or spaces, so launchers that forward the
        environment through a remote shell (DeepSpeed's pdsh/mpirun runners) pass it on unchanged."""
        return f"mode={self.mode},call={self.call},start={self.start},steps={self.steps}"

    @classmethod
    def from_env(cls, raw: str | None) -> "WindowOptions":
        if not raw:
            return cls()
        fields = dict(item.split("=", 1) for item in raw.split(","))
        return cls(mode=fields["mode"], call=int(fields["call"]), start=int(fields["start"]),
                   steps=int(fields["steps"]))


class ProfilerWindow:
    def __init__(self, options: WindowOptions, metadata: Callable[[], dict]):
        self.options = options
        self.metadata = metadata  # written into the trace as "dstrace": run id, rank, world, window
        self.record = Window(mode=options.mode, call=options.call, start=options.start, steps=options.steps)
        self._prof = None
        self._done = False

    @property
    def active(self) -> bool:
        """Collecting events now (stopped windows keep their events until export)."""
        return self._prof is not None and not self._done

    def wants(self, call: int, step: int) -> bool:
        o = self.options
        return (o.mode == "full" and not self._done and call == o.call
                and o.start <= step < o.start + o.steps)

    def before_step(self, call: int, step: int) -> None:
        if self.wants(call, step) and not self.active:
            import torch
            from torch.profiler import ProfilerActivity, profile

            gpu = torch.cuda.is_available()
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
            # NCCL kernels carry their message sizes; gloo's CPU collectives show them only as shapes.
            self._prof = profile(activities=activities, record_shapes=not gpu)
            self._prof.start()
            self._prof.add_metadata_json("dstrace", json.dumps(self.metadata()))
            ranges.set_profiling(True)

    def after_step(self, call: int, step: int) -> None:
        if self.active:
            self.record.recorded_steps.append(step)
            if step >= self.options.start + self.options.steps - 1:
                self.stop()

    def stop(self) -> None:
        """Stop collecting; the events stay in memory until `export`."""
        if self._prof is not None and not self._done:
            ranges.set_profiling(False)
            self._prof.stop()
            self._done = True

    def export(self, run_dir: str, worker: str) -> str | None:
        """Write the trace as `<worker>.<ms>.pt.trace.json.gz`, the name HTA and TensorBoard look for.

        The gzip is written under a temporary name and renamed, so a crash never leaves a file that
        looks like a whole trace. The rank's summary is made from it by `dstrace record`, once the
        command has ended, in dstrace's own environment.
        """
        if self._prof is None:
            return None
        self.stop()
        prof, self._prof = self._prof, None
        name = f"{worker}.{int(time.time() * 1000)}.pt.trace.json.gz"
        final = os.path.join(run_dir, name)
        fd, raw = tempfile.mkstemp(prefix=f".{name}.", suffix=".json.tmp", dir=run_dir)  # a name no link can hold
        os.close(fd)
        try:
            prof.export_chrome_trace(raw)
            if not _ends_a_json_object(raw):  # Kineto reports a failed write (a full disk) only in its log
                raise OSError(f"the profiler could not write its trace {raw} (is the disk full?)")
            with open(raw, "rb") as src, atomic_file(final, "wb") as packed, \
                    gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            self.record.trace_file = name
        finally:
            if os.path.exists(raw):
                os.remove(raw)
        return name


def _ends_a_json_object(path: str) -> bool:
    """Whether the file ends as a whole JSON document does: an empty or cut-off export does not."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(f.tell() - 64, 0))
        return f.read().rstrip().endswith(b"}")
