"""The profiler window: which part of the job the torch.profiler covers, and what opens it.

A 1024-token run profiled end to end writes gigabytes and skews itself; a few steady-state steps say the
same. What a step is depends on the workload, so the window follows the first of these triggers the job
has (`runfolder.records.TRIGGERS`, most telling first):

- `generate step`: forward steps `start .. start+steps-1` of top-level chat()/generate() call `call`;
- an iteration trigger (`ITERATION_TRIGGERS`): torch optimizer steps, DeepSpeed `engine.step()`, the
  DDP / FSDP root module's forward calls, or the job's own `torch.profiler` `step()`. The window opens at
  boundary `start` of the most telling one the job has shown and closes `steps` boundaries later; each
  iteration is a `ProfilerStep#n` range, as torch's own `profile.step()` writes it;
- `time`: a job with none of those (an inference loop of its own, a loop of bare collectives) gets a window
  `seconds` long, due `after` seconds after `record` started (one moment for every rank of a node), made
  ready at the first nn.Module call then, or the first torch.distributed collective call in a process that
  has built no model (one without a parameter), and opened at one wall-clock moment on every rank once the
  profilers are ready (`time_tick`). A trigger above, arriving later, replaces it: the time window is
  written only at exit.

The profiler can only be started and stopped on the thread the job runs its work on (Kineto records the
starting thread), so every opening and closing happens inside a hook on the job's own thread.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable

from dstrace.runfolder.files import atomic_file
from dstrace.recording import ranges
from dstrace.runfolder import range_names
from dstrace.runfolder.records import GENERATE_TRIGGER, ITERATION_TRIGGERS, STEP_KINDS, TIME_TRIGGER, Window

MODES = ("full", "annotate")
GPU_READYING_S = 8.0
"""Time a time-based window waits after falling due on a GPU, for every rank's profiler to be ready: on 2 x
H200, CUPTI took ~2.5 s on each rank, one after the other (a rank readying holds up the peers waiting on it
in a collective, which ready theirs once released)."""
MARKER = "dstrace/window.open"
"""A range opened right after the profiler starts, between two perf_counter readings: where perf_counter's
clock meets the trace's. Its end is the meeting point: the first range of a profiler spends a millisecond or
so inside itself."""
_MARKER_EVENT = re.compile(rb'"name": "' + re.escape(MARKER.encode()) + rb'",\s*"pid": (\d+),\s*"tid": (\d+),\s*"ts": ([\d.]+),\s*"dur": ([\d.]+)')
_EVENTS_OPEN = re.compile(rb'"traceEvents":\s*\[')
_UNSAFE_FOR_KINETO = re.compile(r'[\x00-\x1f\x7f"\\]')
"""Characters Kineto does not keep in a trace's path (it escapes them, and renames to the escaped name)."""

kineto_started = False
"""Whether dstrace made a profiler ready in this process: Kineto's config loader then runs a thread that a
fork's child does not have, and the child hangs at exit joining it (`session` works around it)."""


@dataclass
class WindowOptions:
    mode: str = "full"
    call: int = 1
    start: int = 2
    steps: int = 3
    after: float = 30.0
    seconds: float = 2.0
    due: float | None = None  # unix time the time-based window falls due on every rank: `record`'s start + after

    def to_env(self) -> str:
        """`mode=full,call=1,start=2,steps=3,after=30,seconds=2,due=...`: no quotes or spaces, so launchers that
        forward the environment through a remote shell (DeepSpeed's pdsh/mpirun runners) pass it on unchanged."""
        due = "" if self.due is None else f",due={self.due:.3f}"
        return (f"mode={self.mode},call={self.call},start={self.start},steps={self.steps},"
                f"after={self.after:g},seconds={self.seconds:g}{due}")

    @classmethod
    def from_env(cls, raw: str | None) -> "WindowOptions":
        if not raw:
            return cls()
        fields = dict(item.split("=", 1) for item in raw.split(","))
        default = cls()
        return cls(mode=fields["mode"], call=int(fields["call"]), start=int(fields["start"]),
                   steps=int(fields["steps"]), after=float(fields.get("after", default.after)),
                   seconds=float(fields.get("seconds", default.seconds)),
                   due=float(fields["due"]) if "due" in fields else None)


@dataclass
class Span:
    """A call around the window (generate, chat, deepspeed.initialize...), on time.perf_counter's clock."""
    name: str
    start: float
    end: float | None = None  # None while it runs
    clip: bool = False  # shown clipped to the window (a generation call); else at its real start and duration


class ProfilerWindow:
    def __init__(self, options: WindowOptions, metadata: Callable[[], dict],
                 held: Callable[[], AbstractContextManager] = nullcontext):
        self.options = options
        self.metadata = metadata  # written into the trace as "dstrace": run id, rank, world, window
        self.held = held  # around stopping the profiler: the rank's signals wait (`session.signals_held`)
        full = options.mode == "full"
        self.record = Window(mode=options.mode, call=options.call, start=options.start, steps=options.steps,
                             after_s=options.after if full else None, seconds=options.seconds if full else None)
        self._prof = None
        self._started = False  # the profiler records (a time-based window's is made ready first: `time_tick`)
        self._open_at: float | None = None  # unix time the ready time-based window starts recording
        self._gpu = False
        self._done = False
        self._opened = self._closed = None  # perf_counter at the profiler's start and stop
        self._marker_slack_us = 0.0
        self._step_range = None  # the open ProfilerStep#n of an iteration window
        self._warmed = False  # made ready in a generation call's warm-up step, not recording yet

    @property
    def active(self) -> bool:
        """Collecting events now (stopped windows keep their events until export)."""
        return self._prof is not None and self._started and not self._done

    @property
    def recorded(self) -> bool:
        """Holds a recording not yet written (open, or stopped awaiting `export`)."""
        return self._prof is not None and self._started

    @property
    def taken(self) -> bool:
        """A window opened by a trigger other than time: nothing else may open one."""
        return self.record.trigger not in (None, TIME_TRIGGER) or self.record.stood_aside is not None

    def _prepare(self) -> bool:
        """Make the profiler ready (Kineto and, on a GPU, CUPTI: seconds the first time on an H200) without
        recording; False when the job's own profiler is recording (only one may run)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        if torch.autograd.profiler._is_profiler_enabled:
            return False
        global kineto_started
        kineto_started = True
        gpu = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        # NCCL kernels carry their message sizes; gloo's CPU collectives show them only as shapes.
        self._prof = profile(activities=activities, record_shapes=not gpu)
        self._prof.prepare_trace()
        self._gpu = gpu
        return True

    def _open(self, trigger: str) -> bool:
        """Start recording, the profiler made ready first unless the time-based window made it ready; False
        when the job's own profiler is recording (only one may run)."""
        import torch

        if self.record.trigger == TIME_TRIGGER:
            if self.active:  # the time-based window becomes this one: a second profiler in one process may see
                self.record.trigger = trigger  # no device activity once CUPTI was torn down (TEARDOWN_CUPTI=1)
                self.record.recorded_steps = []
                return True
            self._discard()
        if self._prof is None and not self._prepare():
            return False
        self._prof.start_trace()
        self._started = True
        before = time.perf_counter()
        with torch.profiler.record_function(MARKER):
            pass
        self._opened = time.perf_counter()
        self._marker_slack_us = (self._opened - before) * 1e6  # less the marker's own duration: the clock's play
        self.record.trigger = trigger
        self._prof.add_metadata_json("dstrace", json.dumps(self.metadata()))
        ranges.set_profiling(True)
        return True

    def owns(self, profiler) -> bool:
        """Whether `profiler` (a torch.profiler.profile) is this window's: the job's own are the others."""
        return profiler is not None and profiler is self._prof

    def stand_aside(self, reason: str) -> bool:
        """The job starts a torch.profiler of its own: only one may run in a process (two end in a segfault),
        so dstrace's window ends here and never opens again. True when it had recorded, to be written now."""
        if self.record.stood_aside is not None:
            return False
        self.record.stood_aside = reason
        if self._prof is None:
            return False
        recorded = self._started
        self.stop()
        if not recorded:  # made ready for a time-based window, never recording: nothing to write
            self._prof = None
            self.record.trigger = None
        return recorded

    def abandon(self) -> None:
        """In a fork's child: the profiler is the parent's; the child neither stops nor writes it."""
        self._prof = self._step_range = None
        self._done = True
        ranges.set_profiling(False)

    def _discard(self) -> None:
        """Drop the time-based window, unwritten: a better trigger came."""
        if self._prof is not None:
            self.stop()
            self._prof = None
        self._done = self._started = False
        self.record.trigger = None
        self.record.recorded_steps = []

    # ---- generate steps ------------------------------------------------------------------------
    # torch.profiler's schedule (wait, warmup, active) done by hand on the step hooks, so that neither the start
    # nor the stop lands in a recorded step: prepare_trace (warm-up) at the end of step start-2, start_trace at
    # the end of step start-1 (after its step range closed: the trace holds the window's steps only), steps
    # start..start+steps-1 recorded, stop_trace at the beginning of step start+steps (before its range opens), or
    # after the call when it ends first. A step's time runs from its start to the next step's start, so each
    # cost falls in the step it runs in, which the manifest marks (`step_kinds`). Not `profile(schedule=...)`
    # itself: its `step()` is the job's own profiler's trigger, and it exports inside the stop step. A window
    # from step 0 has no step before it: the profiler starts in step 0, which is then both started and recorded.
    def wants(self, call: int, step: int) -> bool:
        o = self.options
        return (o.mode == "full" and not self.taken and call == o.call and o.start <= step < o.start + o.steps)

    def before_step(self, call: int, step: int) -> str:
        """What the profiler does as this step begins, done now: the step's kind (one of STEP_KINDS)."""
        o = self.options
        if self.record.trigger == GENERATE_TRIGGER and self.active and step >= o.start + o.steps:
            self.stop()
            return STEP_KINDS[4]
        if step == 0 and o.start == 0 and self.wants(call, step) and self._open(GENERATE_TRIGGER):
            return STEP_KINDS[2]
        return STEP_KINDS[3] if self.active else STEP_KINDS[0]

    def after_step(self, call: int, step: int) -> str | None:
        """What the profiler does as this step ends, done now: the step's kind when it did something."""
        o = self.options
        if self.active and self.record.trigger == GENERATE_TRIGGER:
            if o.start <= step < o.start + o.steps:
                self.record.recorded_steps.append(step)
            return None
        if not self.wants(call, step + 1) and not self.wants(call, step + 2):
            return None
        if step + 2 == o.start and self._prof is None and self._prepare():
            self._warmed = True
            return STEP_KINDS[1]
        if step + 1 == o.start and self._open(GENERATE_TRIGGER):
            return STEP_KINDS[2]
        return None

    def call_ended(self) -> bool:
        """At the end of a generation call: stop the generate window (True: the caller exports it now), or drop
        a profiler made ready for a window the call did not reach."""
        if self.record.trigger == GENERATE_TRIGGER:
            self.stop()
            return True
        if self._warmed and not self._started:
            self._discard()
        self._warmed = False
        return False

    # ---- iterations ----------------------------------------------------------------------------
    def iteration(self, trigger: str, index: int) -> bool:
        """Boundary `index` (0-based) of the iteration trigger the job's window follows; True when this
        boundary closed the window (the caller writes it now)."""
        o = self.options
        if o.mode != "full":
            return False
        if self.active and self.record.trigger in ITERATION_TRIGGERS:
            if self.record.trigger != trigger:  # a more telling trigger showed up while open: end here
                self.stop()
                return True
            self.record.recorded_steps.append(index - 1)
            if index >= o.start + o.steps:
                self.stop()
                return True
            self._next_step(index)
        elif not self.taken and index == o.start and self._open(trigger):
            self._next_step(index)
        return False

    def _next_step(self, index: int) -> None:
        import torch

        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
        self._step_range = torch.profiler.record_function(f"ProfilerStep#{index}")
        self._step_range.__enter__()

    # ---- time ----------------------------------------------------------------------------------
    def time_tick(self, now: float) -> bool:
        """At a module or collective call on the job's thread once the time-based window is due; False once
        it is over.

        The first tick makes the profiler ready, which on a GPU takes seconds (CUPTI) and holds up every peer
        waiting on this rank in a collective; those peers make theirs ready once released, holding this rank
        up in turn. A window opened at once would spend its seconds waiting for the peers' profilers and
        cover other calls than theirs (seen on 2 x H200: rank 0's 1 s window held 2.5 s of waiting and one
        iteration, rank 1's the next 1000). So recording starts at one wall-clock moment on every rank,
        GPU_READYING_S after the window fell due (`options.due`, the same on every rank of a node), by when
        every profiler is ready (on a CPU, twice this rank's readying: milliseconds), and ends `seconds`
        later on every rank, so that one rank's closing (CUPTI's teardown, a second or so) does not stall
        another's window either."""
        if self.taken or self.options.mode != "full":
            return False
        if self._prof is None and not self._done:
            began = time.time()
            if not self._prepare():
                return False
            ready = time.time()
            readying = GPU_READYING_S if self._gpu else 2 * (ready - began)
            self._open_at = max(ready, (self.options.due or began) + readying)
            return True
        if self._prof is not None and not self._started and not self._done:
            return time.time() < self._open_at or self._open(TIME_TRIGGER)
        if self.active and self.record.trigger == TIME_TRIGGER:
            if now - self._opened < self.options.seconds:
                return True
            self.stop()
        return False

    def stop(self) -> None:
        """Stop collecting; the events stay in memory until `export`. Signals wait (`held`): a Ctrl-C or SIGTERM
        handled inside `stop_trace` (seconds for a large window) left Kineto half stopped, and the export at exit
        then died writing the trace (0 bytes, the rank gone without a word)."""
        if self._prof is not None and not self._done:
            with self.held():
                self._stop()

    def _stop(self) -> None:
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        self._closed = time.perf_counter()
        ranges.set_profiling(False)
        if not self._started:  # made ready, never recording: start it so that it can be stopped
            self._prof.start_trace()
        self._prof.stop_trace()
        self._done = True

    def export(self, run_dir: str, worker: str, around: list[Span] = ()) -> str | None:
        """Write the trace as `<worker>.<ms>.pt.trace.json.gz`, the name HTA and TensorBoard look for, with the
        calls `around` the window added as ranges on the trace's clock.

        The gzip is written under a temporary name and renamed, so a crash never leaves a file that
        looks like a whole trace. The rank's kept reduction is made from it by `dstrace record`, once the
        command has ended, in dstrace's own environment.
        """
        if self._prof is None:
            return None
        self.stop()
        prof, self._prof = self._prof, None
        if not self._started:  # a time-based window made ready that the job ended before it opened
            return None
        name = f"{worker}.{int(time.time() * 1000)}.pt.trace.json.gz"
        final = os.path.join(run_dir, name)
        fd, raw = tempfile.mkstemp(prefix=f".{name}.", suffix=".json.tmp", dir=run_dir)  # a name no link can hold
        os.close(fd)
        try:
            with _kineto_safe_dir(run_dir) as where:
                prof.export_chrome_trace(os.path.join(where, os.path.basename(raw)))
            if not _ends_a_json_object(raw):  # Kineto reports a failed write (a full disk) only in its log
                raise OSError(f"the profiler could not write its trace {raw} (is the disk full?)")
            extra = self._around_events(_marker_event(raw), around)
            with open(raw, "rb") as src, atomic_file(final, "wb") as packed, \
                    gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=6) as dst:
                _copy_with_events(src, dst, extra)
            self.record.trace_file = name
        finally:
            if os.path.exists(raw):
                os.remove(raw)
        return name

    def _around_events(self, marker: tuple[int, int, float, float] | None, around: list[Span]) -> list[dict]:
        """The calls around the window as complete ("X") ranges on the marker's process and thread: a
        generation call clipped to the window (it began before the window opened), DeepSpeed's entry points
        at their real start and duration, before the window on the same clock."""
        if marker is None or self._opened is None:
            return []
        pid, tid, marker_ts, marker_dur = marker
        closed = self._closed if self._closed is not None else time.perf_counter()
        # The marker ran between two perf_counter readings `slack` apart: its end is mapped to the middle of
        # where it can lie, so the mapping is off by at most half the slack (a preempted thread widens it).
        uncertainty = round(max(self._marker_slack_us - marker_dur, 0.0) / 2, 3)

        def trace_us(t: float) -> float:
            return round(marker_ts + marker_dur + uncertainty + (t - self._opened) * 1e6, 3)

        out = []
        for span in around:
            end = span.end if span.end is not None else closed
            if span.clip:
                if end <= self._opened or span.start >= closed:
                    continue
                lo, hi = max(span.start, self._opened), min(end, closed)
                args = {"dstrace": "clipped to the profiler window", "clipped": lo > span.start or hi < end,
                        "call start us": trace_us(span.start), "call dur us": round((end - span.start) * 1e6, 3)}
            else:
                if span.start >= closed:
                    continue
                lo, hi = span.start, end
                args = {"dstrace": "outside the profiler window, at its real start and duration"}
            args["clock uncertainty us"] = uncertainty
            out.append({"ph": "X", "cat": "user_annotation", "name": range_names.PREFIX + span.name, "pid": pid,
                        "tid": tid, "ts": trace_us(lo), "dur": round((hi - lo) * 1e6, 3), "args": args})
        return out


@contextmanager
def _kineto_safe_dir(run_dir: str):
    """The run folder as a path Kineto writes to unchanged: a folder whose path holds a newline, a quote or
    a backslash is reached through /proc/self/fd (Kineto would write its trace elsewhere, under the escaped
    name)."""
    if not _UNSAFE_FOR_KINETO.search(run_dir):
        yield run_dir
        return
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _marker_event(raw: str) -> tuple[int, int, float, float] | None:
    """pid, tid, start and duration of the window's marker range in Kineto's JSON, read in chunks (traces run to GBs)."""
    tail = b""
    with open(raw, "rb") as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                return None
            m = _MARKER_EVENT.search(tail + chunk)
            if m:
                return int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4))
            tail = chunk[-512:]


def _copy_with_events(src, dst, events: list[dict]) -> None:
    """Copy the trace, the events put first in its traceEvents list."""
    head = src.read(1 << 20)
    m = _EVENTS_OPEN.search(head) if events else None
    if m is None:
        dst.write(head)
    else:
        rest = head[m.end():]
        empty = rest.lstrip().startswith(b"]")
        added = ",\n".join(json.dumps(e) for e in events).encode()
        dst.write(head[:m.end()] + b"\n" + added + (b"" if empty else b",") + rest)
    shutil.copyfileobj(src, dst, 1 << 20)


def _ends_a_json_object(path: str) -> bool:
    """Whether the file ends as a whole JSON document does: an empty or cut-off export does not."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(f.tell() - 64, 0))
        return f.read().rstrip().endswith(b"}")
