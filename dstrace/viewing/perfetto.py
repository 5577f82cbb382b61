"""The merged timeline as a Perfetto protobuf trace (`.pftrace`), which ui.perfetto.dev opens as it is.

Protobuf rather than Chrome JSON because it says what the JSON format can only approximate: one
process track per rank with its threads and GPU streams as child tracks in a fixed order (pids and
tids from different hosts cannot collide), flows with explicit start and end ids, and typed
arguments. The `perfetto` package's trace builder writes it offline; nothing is downloaded.

Each slice becomes a begin and an end event. Events of one track are emitted properly nested (a
child that outlives its parent is cut at the parent's end, as Kineto's rounding sometimes makes
it) and the whole file is in timestamp order, each track's own order kept for equal timestamps.
`write_merged_trace` is the whole view: a run loaded, its timeline built, the file written.
"""
from __future__ import annotations

import heapq
import os
import sys
from typing import IO, Iterator

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackDescriptor, TrackEvent
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from dstrace.errors import UserError
from dstrace.runfolder.names import MERGED_NAME, beside
from dstrace.viewing.timeline import Timeline

SEQUENCE_ID = 1  # every packet is written by this one writer
BEGIN, END = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END


def _track_events(rows: list[tuple]) -> Iterator[tuple]:
    """(ts, BEGIN/END, row) of one track, properly nested, in order."""
    rows = sorted(rows, key=lambda r: (r[0], -r[1]))
    stack: list[int] = []  # end times of open slices
    for ts, dur, row in rows:
        while stack and stack[-1] <= ts:
            yield stack.pop(), END, None
        end = ts + dur
        if stack and end > stack[-1]:
            end = stack[-1]
        yield ts, BEGIN, row
        stack.append(end)
    while stack:
        yield stack.pop(), END, None


def _keyed(track: int, rows: list[tuple]) -> Iterator[tuple]:
    """A track's events keyed for merging: by time, then track, then the track's own order."""
    for i, (ts, kind, row) in enumerate(_track_events(rows)):
        yield ts, track, i, kind, row


def _annotate(event: TrackEvent, args: dict) -> None:
    for key, value in args.items():
        ann = event.debug_annotations.add()
        ann.name = key
        if isinstance(value, bool):
            ann.bool_value = value
        elif isinstance(value, int):
            ann.int_value = value
        elif isinstance(value, float):
            ann.double_value = value
        else:
            ann.string_value = str(value)


def _descriptors(timeline: Timeline) -> Iterator[TrackDescriptor]:
    for proc in timeline.processes:
        desc = TrackDescriptor(uuid=proc.uuid, sibling_order_rank=proc.rank,
                               child_ordering=TrackDescriptor.ChildTracksOrdering.EXPLICIT)
        desc.process.pid = proc.pid
        desc.process.process_name = proc.name
        yield desc
        for track in proc.tracks:
            yield TrackDescriptor(uuid=track.uuid, parent_uuid=proc.uuid, name=track.name,
                                  sibling_order_rank=track.order)


def write_perfetto(timeline: Timeline, out: IO[bytes]) -> int:
    """Write the trace; returns the number of slices written."""
    builder = StreamingTraceProtoBuilder(out)
    for desc in _descriptors(timeline):
        packet = builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        packet.track_descriptor.CopyFrom(desc)
        builder.write_packet(packet)
    s = timeline.slices
    per_track: dict[int, list[tuple]] = {}
    for row in zip(s["track"], s["ts_ns"], s["dur_ns"], s["name"], s["cat"], s["args"], s["flow_out"], s["flow_in"]):
        per_track.setdefault(int(row[0]), []).append((int(row[1]), int(row[2]), row))
    streams = [_keyed(track, rows) for track, rows in per_track.items()]
    for ts, track, _, kind, row in heapq.merge(*streams):
        packet = builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        packet.timestamp = ts
        event = packet.track_event
        event.type = kind
        event.track_uuid = track
        if kind == BEGIN:
            _, _, _, name, cat, args, flow_out, flow_in = row
            event.name = name
            event.categories.append(cat)
            event.flow_ids.extend(flow_out)
            event.terminating_flow_ids.extend(flow_in)
            if args:
                _annotate(event, args)
        builder.write_packet(packet)
    return len(s)


def write_merged_trace(run_dir: str, output: str | None = None, steps: str | None = None, cpu_ops: bool = True,
                       clock_policy: str = "auto") -> str:
    """Load the run, build the merged timeline and write it as a Perfetto trace; returns the path."""
    from dstrace.analysis.loading import load_run
    from dstrace.runfolder.files import atomic_file, output_file
    from dstrace.viewing.timeline import build_timeline, parse_step_window

    window = parse_step_window(steps)
    run = load_run(run_dir, events=True)
    if not run.traces:
        raise UserError(f"no traces in {run_dir}: the ranks ended before their profiling window")
    timeline = build_timeline(run, window=window, cpu_ops=cpu_ops, clock_policy=clock_policy)
    path = os.path.abspath(output or beside(run_dir, MERGED_NAME))
    try:
        with (output_file if output else atomic_file)(path, "wb") as f:
            count = write_perfetto(timeline, f)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    shifted = ", ".join(f"rank {p.rank} {p.clock_shift_us / 1e3:+.3f} ms" for p in timeline.processes if p.clock_shift_us)
    print(f"dstrace: {count} slices of {len(timeline.processes)} rank(s), {timeline.flow_count} collective links"
          + (f", clocks shifted: {shifted}" if shifted else "") + "; open it at https://ui.perfetto.dev",
          file=sys.stderr)
    print(path)
    return path
