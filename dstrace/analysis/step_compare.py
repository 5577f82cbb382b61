"""Two ranges of traced steps side by side: what each step spends, by name, in ms per step.

Answers "why is step N slower than step M" from the trace alone (`dstrace analyze RUN --steps 2:3 --against
4:5`): each range's host items (outermost CPU ops, dstrace ranges and torch.compile's compile ranges:
`reduction.step_work`) and GPU kernels by name, per step, and what changed most. A step-time shift the
window covers is explained with it too. It names what grew; why it grew (a plan built per sequence length, a
cache growing, a recompilation) is for the reader to tell from the names. Steps where the profiler started or
stopped (`steps.step_kinds`) are left out: their time is the profiler's. A rank's forwards after its last new
token (synced_gpus keeps a finished rank running forwards until every rank is done) are named, from the manifest.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from dstrace.analysis.loaded import LoadedRun
from dstrace.analysis.reduction import STEP_WORK_ITEMS
from dstrace.analysis.step_kinds import BOUNDARY_KINDS, step_kinds
from dstrace.errors import UserError

SCHEMA = "dstrace.steps/1"
TOP_ITEMS = 12
"""Items listed, largest change first: a step's top STEP_WORK_ITEMS host items and kernels on either side."""
GPU_TOTAL = "GPU kernels (all)"


@dataclass
class WorkItem:
    """One name's time per step in each range (mean over the range's steps, median over ranks)."""
    name: str
    kind: str  # "host" (a CPU op or dstrace range), "kernel", or "gpu" (all kernels together)
    steps_ms: float
    against_ms: float

    @property
    def change_ms(self) -> float:
        return self.against_ms - self.steps_ms


@dataclass
class StepComparison:
    rank: int | None  # None: every rank, each item the median of the ranks' values
    ranks: list[int]
    steps: tuple[int, int]
    against: tuple[int, int]
    steps_used: list[int]  # traced steps of the first range that were compared (on the ranks, together)
    against_used: list[int]
    left_out: dict[int, str] = field(default_factory=dict)  # step -> its kind: the profiler's start or stop
    after_last_token: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> its forwards after it
    only_in_steps: list[str] = field(default_factory=list)  # host items in each step of the first range, in none
    only_in_against: list[str] = field(default_factory=list)  # of the other's (whose kept items were all it had)
    steps_ms: float | None = None  # median traced step time of each range
    against_ms: float | None = None
    items: list[WorkItem] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "rank": self.rank, "ranks": self.ranks, "steps": list(self.steps),
                "against": list(self.against), "steps_used": self.steps_used, "against_used": self.against_used,
                "left_out": {str(k): v for k, v in sorted(self.left_out.items())},
                "after_last_token": {str(r): list(s) for r, s in sorted(self.after_last_token.items())},
                "only_in_steps": self.only_in_steps, "only_in_against": self.only_in_against,
                "steps_ms": self.steps_ms, "against_ms": self.against_ms,
                "items": [{"name": i.name, "kind": i.kind, "steps_ms": i.steps_ms, "against_ms": i.against_ms,
                           "change_ms": i.change_ms} for i in self.items]}


def parse_range(text: str, option: str) -> tuple[int, int]:
    """`A:B` (steps A to B, both in) or `A` -> (A, B)."""
    a, _, b = str(text).partition(":")
    try:
        lo, hi = int(a), int(b or a)
    except ValueError:
        raise UserError(f"{option} takes steps as A:B (e.g. 2:3), not {text!r}") from None
    if lo < 0 or hi < lo:
        raise UserError(f"{option} {text}: the first step must be >= 0 and not after the last")
    return lo, hi


def _boundary_steps(run: LoadedRun, rank: int) -> dict[int, str]:
    """The rank's traced steps that carry the profiler's start or stop, from its manifest."""
    m = run.manifests.get(rank)
    call = next((c for c in m.calls if m.window and c.index == m.window.call), None) if m else None
    if call is None:
        return {}
    return {i: k for i, k in enumerate(step_kinds(m, call)) if k in BOUNDARY_KINDS}


def _after_last_token(run: LoadedRun, rank: int) -> tuple[int, int] | None:
    """First and last of the window call's forwards that came after the rank's last new token. A forward makes
    one position of the sequence (step 0, the prefill, the first), so a call of T new tokens runs T; more
    are forwards transformers' synced_gpus ran to keep the finished rank in step with the others."""
    m = run.manifests.get(rank)
    call = next((c for c in m.calls if m.window and c.index == m.window.call), None) if m else None
    if call is None or call.new_tokens is None or len(call.step_ms) <= call.new_tokens:
        return None
    return call.new_tokens, len(call.step_ms) - 1


def _step_ms(steps, wanted: list[int]) -> list[float]:
    """Traced step times of `wanted`, from the rank's first step source (the one `step_work` follows)."""
    if steps.empty:
        return []
    first = steps[steps["source"] == steps["source"].iloc[0]]
    return [float(x) for x in first.loc[first["step"].isin(wanted), "ms"]]


def _per_step(work: list[dict], steps: list[int]) -> dict[tuple[str, str], float]:
    """(name, kind) -> ms per step over `steps` (an item outside a step's top items counts 0 there)."""
    total: dict[tuple[str, str], float] = {}
    for w in work:
        if w["step"] not in steps:
            continue
        for kind, items in (("host", w["host_us"]), ("kernel", w.get("kernels_us", {})),
                            ("gpu", {GPU_TOTAL: w["gpu_us"]} if w["gpu_us"] else {})):
            for name, us in items.items():
                total[(name, kind)] = total.get((name, kind), 0.0) + us / 1e3
    return {k: v / len(steps) for k, v in total.items()}


def _only_in(work: list[dict], mine: list[int], other: list[int]) -> set[str] | None:
    """Host items in every step of `mine` and in no step of `other`; None when a step of `other` kept only
    its top STEP_WORK_ITEMS (an item missing there may have been left out, not absent)."""
    host = {w["step"]: w["host_us"] for w in work if w["step"] in (*mine, *other)}
    if any(len(host.get(s, {})) >= STEP_WORK_ITEMS for s in other) or not mine or not other:
        return None
    every = set.intersection(*(set(host.get(s, {})) for s in mine))
    return every - set().union(*(set(host.get(s, {})) for s in other))


def compare_steps(run: LoadedRun, steps: tuple[int, int], against: tuple[int, int],
                  rank: int | None = None, top: int = TOP_ITEMS) -> StepComparison:
    """The two ranges compared on `rank`, or on every rank with traced steps (medians over them)."""
    stepped = sorted(r for r, t in run.traces.items() if t.reduced.step_work)
    ranks = [rank] if rank is not None else stepped
    if rank is not None and rank not in stepped:
        raise UserError(f"rank {rank} has no traced steps here (ranks with some: "
                        f"{', '.join(map(str, stepped)) or 'none'})")
    if not ranks:
        raise UserError("no traced steps to compare: the traces hold no dstrace/step or ProfilerStep ranges")
    left_out: dict[int, str] = {}
    after = {r: span for r in ranks if (span := _after_last_token(run, r)) is not None}
    per_rank: list[tuple[dict, dict]] = []
    only: tuple[list[set | None], list[set | None]] = ([], [])
    used: tuple[set[int], set[int]] = (set(), set())
    times: tuple[list[float], list[float]] = ([], [])
    for r in ranks:
        work = run.traces[r].reduced.step_work
        boundary = _boundary_steps(run, r)
        traced = {w["step"] for w in work}
        ranges = []
        for side, (lo, hi) in enumerate((steps, against)):
            mine = [s for s in range(lo, hi + 1) if s in traced and s not in boundary]
            left_out.update({s: boundary[s] for s in range(lo, hi + 1) if s in traced and s in boundary})
            used[side].update(mine)
            ranges.append(mine)
            times[side].extend(_step_ms(run.traces[r].reduced.steps, mine))
        if ranges[0] and ranges[1]:
            per_rank.append((_per_step(work, ranges[0]), _per_step(work, ranges[1])))
            only[0].append(_only_in(work, ranges[0], ranges[1]))
            only[1].append(_only_in(work, ranges[1], ranges[0]))
    if not per_rank:
        have = sorted({w["step"] for r in ranks for w in run.traces[r].reduced.step_work})
        raise UserError(f"steps {steps[0]}:{steps[1]} and {against[0]}:{against[1]} are not both in the traces "
                        f"(traced steps: {', '.join(map(str, have))}"
                        + (f"; left out as the profiler's own: {', '.join(map(str, sorted(left_out)))}" if left_out
                           else "") + ")")
    names = sorted({k for a, b in per_rank for k in (*a, *b)})
    items = [WorkItem(n, kind, float(statistics.median(a.get((n, kind), 0.0) for a, _ in per_rank)),
                      float(statistics.median(b.get((n, kind), 0.0) for _, b in per_rank)))
             for n, kind in names]
    items.sort(key=lambda i: (-abs(i.change_ms), i.name))
    only_in = [sorted(set.intersection(*sets)) if sets and None not in sets else [] for sets in only]
    return StepComparison(rank, ranks, steps, against, sorted(used[0]), sorted(used[1]), left_out, after,
                          *only_in, float(statistics.median(times[0])) if times[0] else None,
                          float(statistics.median(times[1])) if times[1] else None, items[:top])


def _label(steps: list[int]) -> str:
    """`step 2`, `steps 2, 3`, `steps 2-21, 30`: a run of three or more steps in a row as its ends."""
    if not steps:
        return "no step"
    if len(steps) == 1:
        return f"step {steps[0]}"
    runs: list[list[int]] = []
    for s in sorted(steps):
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    parts = [f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs]
    return "steps " + ", ".join(parts)


def render_text(c: StepComparison) -> str:
    who = f"rank {c.rank}" if c.rank is not None else (
        f"rank {c.ranks[0]}" if len(c.ranks) == 1 else f"ranks {', '.join(map(str, c.ranks))} (median over ranks)")
    head = [f"steps {c.steps[0]}:{c.steps[1]} against {c.against[0]}:{c.against[1]}, {who}",
            f"compared: {_label(c.steps_used)} against {_label(c.against_used)}"]
    if c.left_out:
        head.append("left out (the profiler's own start or stop): "
                    + ", ".join(f"step {s} ({k})" for s, k in sorted(c.left_out.items())))
    for r, (first, last) in sorted(c.after_last_token.items()):
        head.append(f"rank {r}: steps {first}-{last} came after its last new token ({first} new tokens, {last + 1} "
                    f"forwards): forwards a finished rank runs under synced_gpus until every rank is done")
    if c.steps_ms and c.against_ms is not None:
        head.append(f"traced step time: {c.steps_ms:.1f} ms against {c.against_ms:.1f} ms "
                    f"({c.against_ms / c.steps_ms:.3g}x)")
    for label, names, other in (("steps", c.only_in_steps, c.against_used), ("against", c.only_in_against, c.steps_used)):
        if names:
            head.append(f"only in the {label} range (in each of its steps, in none of {_label(other)}): "
                        + ", ".join(names))
    rows = [("item", "kind", "ms/step", "ms/step against", "change")]
    rows += [(i.name[:70], i.kind, f"{i.steps_ms:.3f}", f"{i.against_ms:.3f}", f"{i.change_ms:+.3f}") for i in c.items]
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    table = ["  ".join(cell.ljust(w) if k < 2 else cell.rjust(w) for k, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    foot = (f"each step's {STEP_WORK_ITEMS} largest host items and kernels by name; an item below a step's top "
            f"{STEP_WORK_ITEMS} counts 0 there. Host items are outermost CPU ops, dstrace ranges and torch.compile's "
            f"outermost compile ranges (they overlap).")
    return "\n".join([*head, "", *table, "", foot]) + "\n"
