"""The tables and lines shared by the text, markdown and html renderers (their numbers written by `dstrace.units`)."""
from __future__ import annotations

from dstrace.analysis.results import SPAN_PARTS, Analysis, Finding, shares, span_parts
from dstrace.analysis.steps import MANIFEST_COVERS
from dstrace.rankset import ranges, ranks_text
from dstrace.units import gbps, ms, size, step_ms


def device_label(a: Analysis) -> str:
    if a.device == "host-only" and not a.accelerators:
        return "GPU job profiled without its GPU activity (host times only)"
    if a.device == "host-only":
        return f"{' and '.join(a.accelerators)} traces, device timeline not analyzed (host times only)"
    return {"gpu": "GPU traces", "cpu": "CPU-only traces", "none": "no traces (manifests only)"}.get(a.device, a.device)


def time_scope(a: Analysis) -> str:
    """Whose clock the per-rank times are read from, for the table's title."""
    if a.device == "host-only" and not a.accelerators:
        return "host only: the GPU activity is not in the traces"
    return {"gpu": "GPU", "cpu": "host, CPU-only traces"}.get(
        a.device, f"host only: the {' and '.join(a.accelerators)} device timeline is not analyzed")


def ranks_of(f: Finding) -> str:
    """The ranks a finding concerns, said once by every renderer (summaries do not repeat them)."""
    return ranks_text(f.ranks)


def finding_details(f: Finding) -> list[tuple[str, str]]:
    """(label, text) of what follows a finding's summary: its cause, its remedy and where it is explained."""
    return [(label, text) for label, text in (("why", f.cause), ("what to do", f.remedy), ("docs", f.docs)) if text]


def ranks_line(a: Analysis) -> str:
    found = ranges(a.ranks_found) or "none"
    line = f"run {a.run_id or '-'}, {device_label(a)}, world size {a.world_size}, ranks found {found}"
    missing = a.missing_ranks
    return line + (f", missing {ranks_text(missing)} ({len(missing)} of {a.world_size} ranks)" if missing else "")


LEGEND = (
    ("span", "first to last kernel on the rank's GPU(s) in the profiled window (traces without GPU kernels: "
             "the extent of its steps); the columns after it split it into parts that add up to 100%"),
    ("compute", "time any compute kernel runs"),
    ("transfer", "collective kernel time, not overlapped by compute, after every rank of the group arrived: data "
                 "moving"),
    ("wait for peers", "collective kernel time, not overlapped by compute, before the last rank of the group "
                       "arrived: the kernel spins, no data moves"),
    ("split withheld", "collective kernel time, not overlapped by compute, whose wait/transfer split the traces "
                       "cannot support (a peer without a trace, a point-to-point call without its peer, clocks "
                       "too far apart): it may be either; the warnings say why"),
    ("other busy", "memory copies and other kernels running alone"),
    ("idle", "nothing runs on the GPU (host-bound when the host had not launched the next kernel yet)"),
    ("waited for", "the peers this rank waited on, longest first"),
    ("time / wait / transfer", "a collective kind's summed kernel time, split as above (overlap with compute "
                               "included)"),
    ("algbw", "bytes / kernel time, wait included (nccl-tests' algorithm bandwidth, GB = 1e9 B)"),
    ("busbw", "algbw x the nccl-tests factor of the kind ((n-1)/n for AllGather, 2(n-1)/n for AllReduce): "
              "comparable with the link's bandwidth, but lowered by any waiting"),
    ("busbw w/o wait", "the same over transfer time only: what the link did once everyone had arrived"),
)
"""What each column of the reports means, for GPU traces."""

HOST_LEGEND = dict(LEGEND) | {
    "span": "the extent of the rank's steps in the profiled window on its host timeline (traces without steps: of "
            "all its events); the columns after it split it into parts that add up to 100%",
    "compute": "time any outermost CPU op other than a collective runs",
    "transfer": "collective op time (gloo, c10d), not overlapped by compute, after every rank of the group "
                "arrived: data moving",
    "wait for peers": "collective op time, not overlapped by compute, before the last rank of the group arrived: "
                      "the op waits, no data moves",
    "other busy": "other host work counted as busy",
    "idle": "no CPU op runs on the rank's traced threads (Python, the framework and the launcher between ops)",
    "time / wait / transfer": "a collective kind's summed op time, split as above (overlap with compute included)",
    "split withheld": "collective op time, not overlapped by compute, whose wait/transfer split the traces "
                      "cannot support (a peer without a trace, a point-to-point call without its peer, clocks too "
                      "far apart): it may be either; the warnings say why",
    "algbw": "bytes / op time, wait included (nccl-tests' algorithm bandwidth, GB = 1e9 B)",
    "busbw": "algbw x the nccl-tests factor of the kind ((n-1)/n for AllGather, 2(n-1)/n for AllReduce), n = the "
             "group size the trace records (the op's Group size arg, else the world size), not the ranks found "
             "here; over host op time, so any waiting and host work lower it",
}
"""The same terms for CPU-only and host-only traces, where every time is a host time."""


COLLECTIVE_TERMS = ("time / wait / transfer", "algbw", "busbw", "busbw w/o wait")
"""The terms of the Collectives table, besides its own `split withheld` column when it has one."""


def used_terms(a: Analysis, parts: tuple[str, ...]) -> set[str]:
    """The legend terms of the tables a report shows: the time-per-rank table with span parts `parts`, and
    the Collectives table with its columns, where there is one (the renderers' one rule for a short legend)."""
    if not a.ranks:
        return set()
    terms = {"span", "waited for", *parts}
    head, rows = collective_rows(a)
    if rows:
        terms |= set(COLLECTIVE_TERMS) | ({"split withheld"} & set(head))
    return terms


def library_rows(a: Analysis) -> tuple[list[str], list[list[str]]]:
    """Communication time per library (`comm_libraries_us`) per rank, only where a library other than NCCL
    has time: NCCL alone is what the Collectives table shows. (head, rows), rows empty when none."""
    libraries = sorted({lib for s in a.ranks.values() for lib, us in s.comm_libraries_us.items() if us > 0})
    if not set(libraries) - {"NCCL"}:
        return [], []
    rows = [[str(r)] + [ms(s.comm_libraries_us.get(lib)) if lib in s.comm_libraries_us else "-"
                        for lib in libraries]
            for r, s in sorted(a.ranks.items())]
    return ["rank", *libraries], rows


def legend(a: Analysis, terms: set[str] | None = None) -> list[tuple[str, str]]:
    """(term, meaning) in the words of the run's trace kind; only `terms` when given (those a report used)."""
    words = dict(LEGEND) if a.device == "gpu" else HOST_LEGEND
    return [(t, m) for t, m in words.items() if terms is None or t in terms]


def shown_parts(a: Analysis, every: bool = False) -> tuple[str, ...]:
    """The span parts a table shows: every part, or those some rank spent time in."""
    if every:
        return SPAN_PARTS
    spent = {k for s in a.ranks.values() for k, v in span_parts(s).items() if v > 0}
    return tuple(k for k in SPAN_PARTS if k in spent) or SPAN_PARTS


def evidence_line(f: Finding) -> str | None:
    """The finding's evidence as one line: its plain numbers (thresholds left out), or those of the first
    entry of its first per-rank / per-call table when it has no plain number."""
    def plain(items) -> list[tuple[str, object]]:
        return [(k, v) for k, v in items if isinstance(v, (int, float, str)) and not isinstance(v, bool)
                and not str(k).startswith("threshold")]

    def fmt(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    items, prefix = plain(f.evidence.items()), ""
    if not items:
        for key, table in f.evidence.items():
            if isinstance(table, dict) and table and isinstance(first := next(iter(table.values())), dict):
                items, prefix = plain(first.items()), f"{key} {next(iter(table))}: "
                break
    return prefix + ", ".join(f"{k} {fmt(v)}" for k, v in items) if items else None


def rank_rows(a: Analysis, parts_shown: tuple[str, ...] = SPAN_PARTS) -> tuple[list[str], list[list[str]]]:
    head = ["rank", "span", *parts_shown, "waited for"]
    rows = []
    for r, s in sorted(a.ranks.items()):
        peer = ", ".join(f"r{p} {ms(w)}" for p, w in sorted(s.waited_for.items(), key=lambda kv: -kv[1])[:2]) or "-"
        parts = span_parts(s)
        share = shares(parts)
        rows.append([str(r), ms(s.span_us)] + [ms(parts[k]) + ("" if s.sparse else f" ({share[k]}%)")
                                                for k in parts_shown] + [peer])
    return head, rows


def collective_rows(a: Analysis) -> tuple[list[str], list[list[str]]]:
    """Per rank and kind; a `split withheld` column only when some call's split is withheld."""
    withheld = any(c.unsplit_us for s in a.ranks.values() for c in s.collectives.values())
    head = ["rank", "kind", "count", "bytes", "time", "wait", "transfer", "algbw GB/s", "busbw GB/s",
            "busbw w/o wait"] + (["split withheld"] if withheld else [])
    rows = []
    for r, s in sorted(a.ranks.items()):
        for kind, c in sorted(s.collectives.items()):
            none_split = c.busbw_transfer_GBps is None
            row = [str(r), kind, str(c.count), size(c.bytes), ms(c.kernel_us),
                   "-" if none_split else ms(c.wait_us), "-" if none_split else ms(c.transfer_us),
                   gbps(c.algbw_GBps), gbps(c.busbw_GBps), gbps(c.busbw_transfer_GBps)]
            rows.append(row + ([ms(c.unsplit_us)] if withheld else []))
    return head, rows


def step_time_line(a: Analysis) -> str | None:
    """The run's one ms per decode step (`steps.step_time`), with what it covers."""
    s = a.steps
    if s is None or s.ms_per_step is None:
        return None
    noun = "decode step" if s.decode else "step"
    times = "median of " + (f"{s.ms_per_step_samples} step times" if s.ms_per_step_samples != 1 else "1 step time")
    counted = (f"{times} ({s.ms_per_step_per_rank} per rank, {s.ms_per_step_ranks} "
               f"rank{'' if s.ms_per_step_ranks == 1 else 's'})" if s.ms_per_step_ranks else times)
    return f"{step_ms(s.ms_per_step)} per {noun}: {counted}: {s.ms_per_step_covers}"


def steps_line(a: Analysis) -> str | None:
    s = a.steps
    if s is None:
        return None
    noun = ("decode step" if s.decode else "step") + ("" if s.count == 1 else "s")
    if s.source == "manifest step_ms":
        line = "no profiled steps in the traces"
    else:
        # from the traces alone, as many steps timed as traced: no manifest marked the start and stop steps
        kept_all = s.ms_per_step_covers not in (None, MANIFEST_COVERS) and s.ms_per_step_per_rank >= s.count
        left = ("every traced step in the median" if kept_all else
                "steps where it started or stopped left out of the median")
        line = (f"profiled window: {s.count} {noun} per call and rank, median {step_ms(s.ms_median)}/step "
                f"({s.source}, profiler overhead included; {left})")
    if s.profiler_cost:
        line += f"; {s.profiler_cost['line']}"
    if s.gathered_bytes_median is not None:
        line += f"; gathered {size(s.gathered_bytes_median)} per step ({s.gathered_source})"
        if s.model_bytes:
            line += f" vs model {size(s.model_bytes)}"
    return line
