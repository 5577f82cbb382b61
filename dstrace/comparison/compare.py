"""The comparison of recorded runs: configurations side by side over their repeats, and the verdict.

`compare_runs` is the whole of it: run folders found and read by `collect`, summarized by `summary`,
judged by `verdict`; `render` writes it. The `dstrace compare` verb is `dstrace.commands.compare`.
"""
from __future__ import annotations

from collections.abc import Callable

from dstrace.errors import UserError
from dstrace.say import say


def compare_runs(run_dirs: list[str], baseline: str | None = None,
                 progress: Callable[[str], None] = say):
    """Find, read, summarize and judge: the whole comparison of the runs under `run_dirs`."""
    from dstrace.comparison.collect import find_runs, read_facts, sweep_record
    from dstrace.comparison.model import Comparison
    from dstrace.comparison.summary import summarize
    from dstrace.comparison.verdict import verdict

    refs = find_runs(run_dirs)
    sweep = sweep_record(run_dirs)
    order = list(sweep.configurations) if sweep else []
    order += sorted({r.config for r in refs} - set(order))
    present = {r.config for r in refs}
    order = [name for name in order if name in present]
    if baseline is None and sweep and sweep.baseline in present:
        baseline = sweep.baseline
    if baseline is not None and baseline not in present:
        raise UserError(f"no configuration named {baseline!r} to use as the baseline; "
                        f"the configurations are: {', '.join(order)}")
    facts = [read_facts(ref, progress) for ref in refs]
    configs = [summarize(name, [f for f in facts if f.config == name]) for name in order]
    warnings = [w for f in facts for w in f.warnings]
    return Comparison(configs=configs, verdict=verdict(configs, baseline), warnings=warnings)
