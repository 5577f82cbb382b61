"""Number formatting and the per-rank table shared by the text, markdown and html renderers."""
from __future__ import annotations

from dstrace.analysis.model import Analysis, Finding
from dstrace.analysis.rankset import ranges, ranks_text


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
    if a.device == "host-only":
        return f"{' and '.join(a.accelerators)} traces, device timeline not analyzed (host times only)"
    return {"gpu": "GPU traces", "cpu": "CPU-only traces", "none": "no traces (manifests only)"}.get(a.device, a.device)


def time_scope(a: Analysis) -> str:
    """Whose clock the per-rank times are read from, for the table's title."""
    return {"gpu": "GPU", "cpu": "host, CPU-only traces"}.get(
        a.device, f"host only: the {' and '.join(a.accelerators)} device timeline is not analyzed")


def ranks_of(f: Finding) -> str:
    """The ranks a finding concerns, said once by every renderer (summaries do not repeat them)."""
    return ranks_text(f.ranks)


def ranks_line(a: Analysis) -> str:
    found = ranges(a.ranks_found) or "none"
    line = f"run {a.run_id or '-'}, {device_label(a)}, world size {a.world_size}, ranks found {found}"
    missing = a.missing_ranks
    return line + (f", missing {ranges(missing)} ({len(missing)} of {a.world_size})" if missing else "")


def rank_rows(a: Analysis) -> tuple[list[str], list[list[str]]]:
    head = ["rank", "span", "idle", "compute", "comm", "exposed comm", "wait for peers", "waited for"]
    rows = []
    for r, s in sorted(a.ranks.items()):
        peer = ", ".join(f"r{p} {ms(w)}" for p, w in sorted(s.waited_for.items(), key=lambda kv: -kv[1])[:2]) or "-"
        measured = s.comm_us - s.unsplit_us
        if s.unsplit_us and measured <= 0:
            wait = "withheld"
        else:
            wait = f"{ms(s.wait_us)} ({pct(s.wait_us, measured)})"
            if s.unsplit_us:
                wait += f", {ms(s.unsplit_us)} withheld"
        rows.append([str(r), ms(s.span_us), f"{ms(s.idle_us)} ({pct(s.idle_us, s.span_us)})",
                     f"{ms(s.busy_us['compute'])} ({pct(s.busy_us['compute'], s.span_us)})",
                     f"{ms(s.busy_us['communication'])} ({pct(s.busy_us['communication'], s.span_us)})",
                     f"{ms(s.exposed_comm_us)}", wait, peer])
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
                   f"{c.algbw_GBps:.2f}", f"{c.busbw_GBps:.2f}",
                   "-" if none_split else f"{c.busbw_transfer_GBps:.2f}"]
            rows.append(row + ([ms(c.unsplit_us)] if withheld else []))
    return head, rows


def steps_line(a: Analysis) -> str | None:
    s = a.steps
    if s is None:
        return None
    noun = ("decode step" if s.decode else "step") + ("" if s.count == 1 else "s")
    line = f"{s.count} {noun}, median {s.ms_median:.2f} ms/step ({s.source})"
    if s.manifest_ms_median is not None and s.source != "manifest step_ms":
        line += f"; manifest median {s.manifest_ms_median:.2f} ms/step over whole calls"
    if s.gathered_bytes_median is not None:
        line += f"; gathered {size(s.gathered_bytes_median)} per step ({s.gathered_source})"
        if s.model_bytes:
            line += f" vs model {size(s.model_bytes)}"
    return line
