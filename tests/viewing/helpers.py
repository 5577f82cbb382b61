"""Read a merged Perfetto trace back into plain structures the tests can check."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent


@dataclass
class Slice:
    track: int
    name: str
    category: str
    begin: int
    end: int
    args: dict
    flow_out: list
    flow_in: list


@dataclass
class Merged:
    processes: dict = field(default_factory=dict)  # uuid -> (pid, name)
    tracks: dict = field(default_factory=dict)  # uuid -> (parent uuid, name)
    slices: list = field(default_factory=list)
    nesting_errors: list = field(default_factory=list)
    out_of_order: int = 0

    def rank_of_track(self, uuid: int) -> str:
        return self.processes[self.tracks[uuid][0]][1]

    def by_process(self) -> dict[str, list[Slice]]:
        out = defaultdict(list)
        for s in self.slices:
            out[self.rank_of_track(s.track)].append(s)
        return out


def _arg(a):
    for kind in ("int_value", "double_value", "string_value", "bool_value"):
        if a.HasField(kind):
            return getattr(a, kind)
    return None


def read_merged(path: str) -> Merged:
    """Parse the file as Perfetto's Trace proto and replay each track's begin/end events."""
    trace = Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    m = Merged()
    open_slices: dict[int, list[Slice]] = defaultdict(list)
    last_ts = 0
    for packet in trace.packet:
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            if d.HasField("process"):
                m.processes[d.uuid] = (d.process.pid, d.process.process_name)
            else:
                m.tracks[d.uuid] = (d.parent_uuid, d.name)
            continue
        e = packet.track_event
        if packet.timestamp < last_ts:
            m.out_of_order += 1
        last_ts = packet.timestamp
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            s = Slice(e.track_uuid, e.name, ",".join(e.categories), packet.timestamp, -1, {a.name: _arg(a) for a in e.debug_annotations},
                      list(e.flow_ids), list(e.terminating_flow_ids))
            open_slices[e.track_uuid].append(s)
            m.slices.append(s)
        elif e.type == TrackEvent.TYPE_SLICE_END:
            if not open_slices[e.track_uuid]:
                m.nesting_errors.append(f"end without begin on track {e.track_uuid} at {packet.timestamp}")
                continue
            open_slices[e.track_uuid].pop().end = packet.timestamp
    m.nesting_errors += [f"unclosed {s.name} on track {t}" for t, stack in open_slices.items() for s in stack]
    return m
