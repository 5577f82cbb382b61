"""Findings: conclusions a DeepSpeed user can act on, each stated only when its evidence holds.

Every finding is one check, `check(inputs: FindingInputs) -> Finding | None`, in the module of its domain
(parallelism, communication, host, steps), with its `DOCS` entry beside it; `FINDINGS` lists the checks in the
order the reports print them. A finding has a stable id (documented in docs/analysis-schema.md), the ranks it
concerns, a one-line summary with the numbers (written by `dstrace.units`, as the tables write them), the
evidence those numbers come from, its cause and its remedy (built from what the run recorded: versions, the
config as passed, the measurements). Thresholds are named constants; each says why it has the value it has.

`FindingInputs` lives in `inputs.py`, which the domain modules import: defined here, it would make a circle.
"""
from __future__ import annotations

from dstrace.analysis.findings import communication, host, parallelism, steps
from dstrace.analysis.findings.host import blocking_call_notes
from dstrace.analysis.findings.inputs import FindingInputs, Mechanisms
from dstrace.analysis.results import Finding

FINDINGS = (
    communication.ddp_allreduce_exposed,
    parallelism.tp_config_rejected,
    parallelism.tp_not_applied,
    parallelism.zero3_gathers_model,
    parallelism.fsdp_gathers_model,
    communication.communication_bound,
    communication.waiting_for_peers,
    host.host_bound,
    steps.step_time_shift,
    steps.window_not_representative,
)
"""Every check, in the order the reports print their findings. `zero3_gathers_model` and `fsdp_gathers_model`
share one gate (`parallelism.gathered_model`) and exclude each other; `waiting_for_peers` states `peer-wait` or
`mutual-wait`."""

DOCS = {**parallelism.DOCS, **communication.DOCS, **host.DOCS, **steps.DOCS}
"""Every finding id -> where it is explained at length (`dstrace explain`, the reports' docs links)."""

__all__ = ["DOCS", "FINDINGS", "FindingInputs", "Mechanisms", "all_findings", "blocking_call_notes"]


def all_findings(inputs: FindingInputs) -> list[Finding]:
    return [f for f in (check(inputs) for check in FINDINGS) if f is not None]
