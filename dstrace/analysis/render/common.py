"""Number formatting and the per-rank table shared by the text, markdown and html renderers."""
from __future__ import annotations

from dstrace.analysis.model import Analysis, Finding


def ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.2f} ms"


def pct(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def device_label(a: Analysis) -> str:
    return {"gpu": "GPU traces", "cpu": "CPU-only traces", "none": "no traces (manifests only)"}.get(a.device, a.device)


def ranks_of(f: Finding) -> str:
    """The ranks a finding concerns, said once by every renderer (summaries do not repeat them)."""
    return ("rank " if len(f.ranks) == 1 else "ranks ") + ", ".join(map(str, f.ranks))


def ranks_line(a: Analysis) -> str:
    found = ", ".join(map(str, a.ranks_found)) or "none"
    line = f"run {a.run_id or '-'}, {device_label(a)}, world size {a.world_size}, ranks found {found}"
    return line + (f", missing {', '.join(map(str, a.missing_ranks))}" if a.missing_ranks else "")


def rank_rows(a: Analysis) -> tuple[list[str], list[list[str]]]:
    head = ["rank", "span", "idle", "compute", "comm", "exposed comm", "wait for peers", "waited for"]
    rows = []
    for r, s in sorted(a.ranks.items()):
        peer = ", ".join(f"r{p} {ms(w)}" for p, w in sorted(s.waited_for.items(), key=lambda kv: -kv[1])[:2]) or "-"
        rows.append([str(r), ms(s.span_us), f"{ms(s.idle_us)} ({pct(s.idle_us, s.span_us)})",
                     f"{ms(s.busy_us['compute'])} ({pct(s.busy_us['compute'], s.span_us)})",
                     f"{ms(s.busy_us['communication'])} ({pct(s.busy_us['communication'], s.span_us)})",
                     f"{ms(s.exposed_comm_us)}", f"{ms(s.wait_us)} ({pct(s.wait_us, s.comm_us)})", peer])
    return head, rows


def collective_rows(a: Analysis) -> tuple[list[str], list[list[str]]]:
    head = ["rank", "kind", "count", "bytes", "time", "wait", "transfer", "algbw GB/s", "busbw GB/s",
            "busbw w/o wait"]
    rows = []
    for r, s in sorted(a.ranks.items()):
        for kind, c in sorted(s.collectives.items()):
            rows.append([str(r), kind, str(c.count), size(c.bytes), ms(c.kernel_us), ms(c.wait_us), ms(c.transfer_us),
                         f"{c.algbw_GBps:.2f}", f"{c.busbw_GBps:.2f}", f"{c.busbw_transfer_GBps:.2f}"])
    return head, rows


def steps_line(a: Analysis) -> str | None:
    s = a.steps
    if s is None:
        return None
    line = f"{s.count} decode steps per call and rank, median {s.ms_median:.2f} ms/step ({s.source})"
    if s.manifest_ms_median is not None and s.source != "manifest step_ms":
        line += f"; manifest median {s.manifest_ms_median:.2f} ms/step over whole calls"
    if s.gathered_bytes_median is not None:
        line += f"; gathered {size(s.gathered_bytes_median)} per step ({s.gathered_source})"
        if s.model_bytes:
            line += f" vs model {size(s.model_bytes)}"
    return line
