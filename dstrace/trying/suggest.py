"""`--suggested RUN`: the config change a finding of the run's last analysis names as its remedy, refused
when the run's own manifests show that it cannot work."""
from __future__ import annotations

import json
import os
from collections import Counter

from dstrace.errors import UserError
from dstrace.runfolder.folder import FolderRefused, RunFolder
from dstrace.runfolder.records import Manifest
from dstrace.units import size

AUTOTP_TRAINING_KEY = (0, 16, 4)
"""DeepSpeed before 0.16.4 has no `tensor_parallel` key in its training config: it ignores the block."""


def _release(version: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in (version or "").split("+")[0].split(".")[:3])
    except ValueError:
        return None


def _autotp_size(change: dict) -> int | None:
    value = change.get("tensor_parallel.autotp_size")
    if value is None and isinstance(change.get("tensor_parallel"), dict):
        value = change["tensor_parallel"].get("autotp_size")
    return value if isinstance(value, int) else None


def why_not(change: dict, manifests: dict[int, Manifest]) -> str | None:
    """Why the change cannot work on this run, from its manifests; None when nothing recorded says so."""
    stage = change.get("zero_optimization.stage")
    if isinstance(stage, int) and stage < 3:
        model = max((m.inventory.logical_bytes for m in manifests.values() if m.inventory), default=None)
        for rank, m in sorted(manifests.items()):
            if model is None or not m.device_memory_bytes:
                continue
            sharing = Counter(x.host for x in manifests.values())[m.host] if m.device_memory_kind == "host" else 1
            if model * sharing > m.device_memory_bytes:
                where = (f"the {size(m.device_memory_bytes)} of host memory its {sharing} ranks share"
                         if sharing > 1 else f"rank {rank}'s {size(m.device_memory_bytes)} of device memory")
                return (f"zero_optimization.stage={stage} puts the whole model on every rank: its weights alone, "
                        f"{size(model)} (inventory){f' x {sharing} ranks' if sharing > 1 else ''}, exceed {where}")
    tp = _autotp_size(change)
    if tp and tp > 1:
        version = next((m.versions.get("deepspeed") for m in manifests.values() if m.versions.get("deepspeed")), None)
        release = _release(version)
        if release and release < AUTOTP_TRAINING_KEY:
            return f"DeepSpeed {version} has no tensor_parallel key in its config: it would ignore autotp_size={tp}"
        inputs: dict[int, set] = {}
        for m in manifests.values():
            for c in m.calls:
                inputs.setdefault(c.index, set()).add(tuple(c.input_sha256) or c.input_tokens)
        differ = sorted(i for i, seen in inputs.items() if len(seen) > 1)
        if differ:
            return (f"AutoTP (tensor_parallel.autotp_size={tp}) computes one sequence per group of {tp} ranks, "
                    f"each rank of a group must get the same input; the ranks got different inputs "
                    f"(call {differ[0]}: input token ids hash differently)")
    return None


def _manifests(run_dir: str) -> dict[int, Manifest]:
    try:
        records = RunFolder.scan(run_dir).records
    except FolderRefused as exc:
        raise UserError(f"--suggested {run_dir}: {exc}") from None
    for read in records.manifest_reads:
        if read.problem is not None:
            raise UserError(f"--suggested {run_dir}: cannot read {read.file.name}: {read.problem}")
    return records.manifests


def suggested(run_dir: str) -> tuple[list[tuple[str, object]], list[str]]:
    """(overrides, notes): the first finding's config change that the run shows can work; notes say which
    finding and which changes were passed over and why. The run's last analysis is its kept JSON report when
    nothing changed since, else a new one (`dstrace analyze`'s `report_of`)."""
    from dstrace.analysis import report_of

    if not os.path.isdir(run_dir):
        raise UserError(f"--suggested {run_dir}: not a folder; give a run folder that `dstrace analyze` reads")
    report, _ = report_of(run_dir, "json")
    findings = [f for f in json.loads(report).get("findings", []) if isinstance(f, dict)]
    changes = [f for f in findings if isinstance(f.get("config_change"), dict) and f["config_change"]]
    if not changes:
        raise UserError(f"--suggested {run_dir}: no finding of its analysis has a config change as its remedy "
                        f"(findings: {', '.join(str(f.get('id')) for f in findings) or 'none'}); give --set KEY=VALUE")
    manifests = _manifests(run_dir)
    passed = []
    for f in changes:
        change = f["config_change"]
        reason = why_not(change, manifests)
        text = ", ".join(f"{k}={json.dumps(v)}" for k, v in change.items())
        if reason is None:
            return list(change.items()), [f"suggested by finding {f.get('id')} of {run_dir}: {text}"] + passed
        passed.append(f"not tried: {text} (finding {f.get('id')}): {reason}")
    raise UserError(f"--suggested {run_dir}: no suggested change can work: " + "; ".join(passed))
