"""dstrace's ZeRO-3 hooks on and off in alternate chat() calls of one process: what annotate mode adds to
a decode step, paired call by call.

`record_overhead.py` compares whole runs, and identical plain runs on the H200 machine differ by up to
2x from one process launch to the next (CPU placement, GPU clocks), so 3% drowns. Here both arms share
the process, the model, the CUDA context and the cores: the report's workload (`launch/zero3_chat.py`)
runs under `dstrace record --mode annotate`, and between calls the wrappers around ZeRO-3's
`fetch_sub_module`, `release_sub_module` and `__all_gather_params` (the code annotate mode adds per
parameter fetch) are swapped for the functions they wrap and back. The generation and step hooks stay in
both arms: they run once per call and per step.

    dstrace record --mode annotate -o /tmp/ab -- deepspeed --num_gpus 2 bench/hooks_ab.py \\
        --size qwen2-1.5b --load config --max-new-tokens 32 --repeats 21
    DS_ACCELERATOR=cpu dstrace record --mode annotate -o /tmp/ab -- \\
        torchrun --nproc_per_node 2 bench/hooks_ab.py --size tiny --repeats 9

Call 1 warms up (hooks on) and is left out; the rest go in ABBA order (on off, off on, ...). Each rank
prints one JSON line per call with `"hooks": "on"|"off"`; rank 0 prints each pair's ratio (on over off,
ms per token), their median and a bootstrap 90% interval of the median. `--same` leaves the hooks on in
both arms: an A/A check that the design itself shows no difference.
"""
from __future__ import annotations

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "launch"))
sys.path.insert(0, HERE)
from record_overhead import interval90  # noqa: E402
from zero3_chat import build, parse_args  # noqa: E402
from nvlm_standin import timed_chat  # noqa: E402

PER_FETCH_HOOKS = ("fetch_sub_module", "release_sub_module", "_PartitionedParameterCoordinator__all_gather_params")


def hook_switch():
    """A function that puts dstrace's per-fetch wrappers in place (True) or the wrapped originals (False)."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as owner
    from dstrace.recording.hooks import WRAPPED

    wrappers = {name: owner.__dict__.get(name) for name in PER_FETCH_HOOKS}
    if not all(getattr(w, WRAPPED, False) for w in wrappers.values()):
        raise SystemExit("the ZeRO-3 hooks are not installed: run this under `dstrace record --mode annotate`")

    def switch(on: bool) -> None:
        for name, wrapper in wrappers.items():
            setattr(owner, name, wrapper if on else wrapper.__wrapped__)
    return switch


def abba(n: int) -> list[bool]:
    """on off off on on off ...: each pair's order alternates, so a drift in time cancels."""
    return [((i // 2) % 2 == 0) == (i % 2 == 0) for i in range(n)]


def main() -> None:
    same = "--same" in sys.argv
    args = parse_args([a for a in sys.argv[1:] if a != "--same"])
    model, tokenizer, pixels, prompt, place = build(args)
    switch = hook_switch()
    timed_chat(model, tokenizer, pixels, prompt, args.max_new_tokens, place.rank, 1, args.result, hooks="warm-up")
    ms = {True: [], False: []}
    order = abba(2 * ((args.repeats - 1) // 2))
    for i, on in enumerate(order):
        switch(on or same)
        line = timed_chat(model, tokenizer, pixels, prompt, args.max_new_tokens, place.rank, i + 2, args.result,
                          hooks="on" if on else "off")
        ms[on].append(line["ms_per_token"])
    switch(True)
    if place.rank == 0 and ms[True]:
        ratios = [a / b for a, b in zip(ms[True], ms[False])]
        low, high = interval90(ratios)
        print(f"hooks on / off, ms per token, {len(ratios)} pairs: median {statistics.median(ratios):.4f} "
              f"(min {min(ratios):.4f}, max {max(ratios):.4f}; bootstrap 90% interval {low:.4f}-{high:.4f}); "
              f"on {statistics.median(ms[True]):.2f} ms, off {statistics.median(ms[False]):.2f} ms", flush=True)


if __name__ == "__main__":
    main()
