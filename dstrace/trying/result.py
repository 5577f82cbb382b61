"""What `dstrace try` concludes from the runs as-is and with the overrides: pure functions over their
manifests and the comparison of the two configurations."""
from __future__ import annotations

from dataclasses import dataclass, field

from dstrace.comparison.model import Comparison, ConfigSummary
from dstrace.comparison.stats import median
from dstrace.runfolder.records import Manifest

AS_IS, VARIANT = "as-is", "variant"
TRY_SCHEMA = "dstrace.try/1"


@dataclass
class TryRun:
    """One recorded run: which side, which repeat, how the job ended."""
    side: str
    repeat: int
    path: str
    exit_code: int | None
    status: str  # complete | incomplete | timed out | not recorded (what run.json says, else why not)
    error: str | None = None  # the job's error, one line (a rank's exit error, else the log's last line)
    wall_s: float = 0.0


@dataclass
class Side:
    """One side over its repeats, in the numbers `try` prints."""
    runs: int
    complete: int
    ms_per_step: float | None
    ms_per_step_low: float | None
    ms_per_step_high: float | None
    gathered_bytes_per_step: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str | None  # "gpu" (torch.cuda.max_memory_allocated) or "host rss"
    exit_codes: list[int | None]
    errors: list[str]
    overrides_applied: bool | None = None  # variant only: every rank of every complete run applied them
    not_applied: list[str] = field(default_factory=list)


def peak_memory(manifests: dict[int, Manifest]) -> tuple[int | None, str | None]:
    """The largest rank's peak: GPU memory allocated where there was a GPU, else the process's peak RSS."""
    gpu = [m.peak_gpu_memory_bytes for m in manifests.values() if m.peak_gpu_memory_bytes]
    if gpu:
        return max(gpu), "gpu"
    host = [m.peak_host_rss_bytes for m in manifests.values() if m.peak_host_rss_bytes]
    return (max(host), "host rss") if host else (None, None)


def not_applied(manifests: dict[int, Manifest]) -> list[str]:
    """Ranks where no config the job handed DeepSpeed took the overrides, and why."""
    out = []
    for rank, m in sorted(manifests.items()):
        records = [("HfDeepSpeedConfig", m.hf_deepspeed_config_overrides)] if m.hf_deepspeed_config_overrides else []
        records += [(c.api, c.overrides) for c in m.deepspeed_calls if c.overrides]
        if not any("applied" in r for _, r in records):
            why = "; ".join(f"{api}: {r.get('not_applied')}" for api, r in records) or \
                "the job handed DeepSpeed no config"
            out.append(f"rank {rank}: {why}")
    return out


def side(summary: ConfigSummary | None, runs: list[TryRun], manifests: list[dict[int, Manifest]],
         variant: bool) -> Side:
    peaks = [peak_memory(m) for m in manifests if m]
    peak = median(p for p, _ in peaks if p is not None)
    kinds = sorted({k for _, k in peaks if k})
    ms = summary.ms_per_step if summary is not None else None
    missing = [f"rep{r.repeat} {x}" for r, m in zip(runs, manifests) if variant and r.exit_code == 0
               for x in not_applied(m)]
    return Side(runs=len(runs), complete=sum(r.exit_code == 0 for r in runs),
                ms_per_step=ms.median if ms else None, ms_per_step_low=ms.low if ms else None,
                ms_per_step_high=ms.high if ms else None,
                gathered_bytes_per_step=summary.gathered_bytes_per_step if summary is not None else None,
                peak_memory_bytes=None if peak is None else int(peak),
                peak_memory_kind=", ".join(kinds) or None,
                exit_codes=[r.exit_code for r in runs], errors=[f"rep{r.repeat}: {r.error}" for r in runs if r.error],
                overrides_applied=(not missing if any(r.exit_code == 0 for r in runs) else None) if variant else None,
                not_applied=missing)


def _outputs(manifests: dict[int, Manifest]) -> dict[tuple[int, int], list[str | None]]:
    """(rank, call index) -> the hashes of each generate() in that call."""
    return {(rank, c.index): list(c.output_sha256) for rank, m in manifests.items() for c in m.calls
            if c.output_sha256 and not c.error}


def same_output(as_is: list[dict[int, Manifest]], variant: list[dict[int, Manifest]]) -> tuple[bool | None, list[str]]:
    """(same, what differs): every complete variant run against the first as-is run, call by call and rank by
    rank. None when there is nothing to compare (no hashes on one side, or the as-is runs disagree among
    themselves: then the answers are not deterministic and a difference says nothing about the change)."""
    reference = next((o for o in map(_outputs, as_is) if o), None)
    if reference is None:
        return None, ["the as-is runs recorded no generate() output"]
    for k, other in enumerate(map(_outputs, as_is), 1):
        if other and other != reference:
            return None, [f"as-is rep{k} answers differently from as-is rep1: the job's output is not deterministic"]
    compared, differ = 0, []
    for k, m in enumerate(variant, 1):
        out = _outputs(m)
        if not out:
            continue
        compared += 1
        for key in sorted(set(reference) | set(out)):
            rank, call = key
            if key not in out:
                differ.append(f"variant rep{k}: rank {rank} call {call}: no output recorded")
            elif key not in reference:
                differ.append(f"variant rep{k}: rank {rank} call {call}: a call the as-is run did not make")
            elif out[key] != reference[key]:
                differ.append(f"variant rep{k}: rank {rank} call {call}: different token ids")
    if not compared:
        return None, ["no variant run recorded generate() output"]
    return not differ, differ


def dtype_differences(as_is: list[dict[int, Manifest]], variant: list[dict[int, Manifest]]) -> list[str]:
    """Weights and floating-point buffers that the two sides hold in different dtypes (the first complete run of
    each, rank by rank's inventory): where a change of config also changes what is computed, e.g. ZeRO-3's
    `zero.Init` casting every floating tensor a module builds, rotary frequencies included, to the config's dtype."""
    if not as_is or not variant:
        return []
    out = []
    for rank in sorted(set(as_is[0]) & set(variant[0])):
        a, v = as_is[0][rank].inventory, variant[0][rank].inventory
        if a is None or v is None:
            continue
        tensors = [("weight", {w.name: w.dtype for w in a.weights}, {w.name: w.dtype for w in v.weights}),
                   ("buffer", a.buffer_dtypes, v.buffer_dtypes)]
        for kind, mine, theirs in tensors:
            pairs: dict[tuple[str, str], list[str]] = {}
            for name in sorted(set(mine) & set(theirs)):
                if mine[name] != theirs[name]:
                    pairs.setdefault((mine[name], theirs[name]), []).append(name)
            for (was, now), names in sorted(pairs.items()):
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                out.append(f"rank {rank}: {len(names)} {kind}{'s' if len(names) > 1 else ''} {was} as-is, {now} "
                           f"in the variant ({shown})")
        if out:
            break
    return out


def outcome(comparison: Comparison, as_is: Side, variant: Side) -> str:
    """faster | slower | indistinguishable (the comparison's rule) | variant failed | not timed."""
    if variant.complete == 0:
        return "variant failed"
    if as_is.ms_per_step is None or variant.ms_per_step is None:
        return "not timed"
    if any(set(pair) == {AS_IS, VARIANT} for pair in comparison.verdict.indistinguishable):
        return "indistinguishable"
    return "faster" if variant.ms_per_step < as_is.ms_per_step else "slower"
