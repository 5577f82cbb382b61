"""dstrace's ZeRO-3 hooks on and off in alternate decode steps of one process: what annotate mode adds to
a decode step, and what a full-mode profiler window leaves behind, each paired within one process.

`record_overhead.py` compares whole runs, and identical plain runs on the H200 machine differ by up to
2x from one process launch to the next; within one process, whole chat() calls still differ by 10-30%
from one to the next (seen with this script alternating whole calls: 259-437 ms per token). So 3% drowns
unless the two arms alternate faster than the machine drifts. Here they alternate step by step: the
report's workload (`launch/zero3_chat.py`) runs under `dstrace record`, and a forward pre-hook on the
language model swaps the wrappers around ZeRO-3's `fetch_sub_module`, `release_sub_module` and
`__all_gather_params` (the code annotate mode, and full mode outside its window, adds per parameter
fetch) for the functions they wrap and back before each decode step, in ABBA order. A step is timed from
its pre-hook to the next step's. The generation and step hooks stay in both arms: they run once per call
and per step.

Call 1 warms up. The recording's window call (`dstrace record --window-call W`) splits the rest into the
calls before it and those after it; call W itself keeps the hooks on and is left out (in full mode it
holds the profiler). Under `--mode full` the calls after W run with whatever the profiler session left
in the process, so the pairs there are full mode's hooks outside its window. What the session leaves
behind cannot be switched off and on inside a process: `cupti_residue.py` measures it. (Comparing the
parts with each other does not work: an A/A run here moved 1.38x from the first part to the second.)

    dstrace record --mode annotate --window-call 7 -o /tmp/ab -- deepspeed --num_gpus 2 \\
        bench/hooks_ab.py --size qwen2-1.5b --load config --max-new-tokens 32 --repeats 12 --json ann.json
    dstrace record --window-call 7 -o /tmp/ab-full -- deepspeed --num_gpus 2 \\
        bench/hooks_ab.py --size qwen2-1.5b --load config --max-new-tokens 32 --repeats 12 --json full.json
    python bench/hooks_ab.py --summarize ann.json full.json     # every step pair of both runs together
    DS_ACCELERATOR=cpu dstrace record --mode annotate --window-call 4 -o /tmp/ab -- \\
        torchrun --nproc_per_node 1 bench/hooks_ab.py --size tiny --max-new-tokens 16 --repeats 6

Each rank prints one JSON line per call; rank 0 prints and writes (`--json`) the summary: each ratio's
median and a bootstrap 90% interval; `--result FILE` keeps every call's line with its steps as it ends.
`--same` leaves the hooks on in both arms: an A/A check that the design itself shows no difference.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "launch"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from record_overhead import described  # noqa: E402

PER_FETCH_HOOKS = ("fetch_sub_module", "release_sub_module", "_PartitionedParameterCoordinator__all_gather_params")


def hook_switch():
    """A function that puts dstrace's per-fetch wrappers in place (True) or the wrapped originals (False)."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as owner
    from dstrace.recording.hooks import WRAPPED

    wrappers = {name: owner.__dict__.get(name) for name in PER_FETCH_HOOKS}
    if not all(getattr(w, WRAPPED, False) for w in wrappers.values()):
        raise SystemExit("the ZeRO-3 hooks are not installed: run this under `dstrace record`")

    def switch(on: bool) -> None:
        for name, wrapper in wrappers.items():
            setattr(owner, name, wrapper if on else wrapper.__wrapped__)
    return switch


def abba(i: int) -> bool:
    """Whether the i-th measured step has the hooks on: on off off on on off ..., each pair's order
    alternates, so a drift in time cancels."""
    return ((i // 2) % 2 == 0) == (i % 2 == 0)


def schedule(calls: int, window_call: int) -> list[tuple[int, str]]:
    """(call, part) for calls 1..calls: call 1 warms up; the window call holds the profiler (full mode)
    and, like the warm-up, keeps the hooks on throughout; the others are "before" or "after" it."""
    def part(call: int) -> str:
        if call == 1:
            return "warm-up"
        if call == window_call:
            return "window"
        return "before" if call < window_call else "after"
    return [(call, part(call)) for call in range(1, calls + 1)]


class StepSwitch:
    """A forward pre-hook on the generating model that sets the hooks for each decode step in ABBA order
    and notes when each step began: a step's time is from its pre-hook to the next one's, so the token
    sampling between two forwards counts with the step before it. Step 0 (the prefill) keeps them on."""

    def __init__(self, switch, same: bool):
        self.switch, self.same = switch, same
        self.alternate = True
        self.starts: list[float] = []

    def begin_call(self, alternate: bool) -> None:
        self.alternate, self.starts = alternate, []
        self.switch(True)

    def __call__(self, module, inputs) -> None:
        import time

        step = len(self.starts)
        on = step == 0 or not self.alternate or abba(step - 1)
        self.switch(on or self.same)
        self.starts.append(time.perf_counter())

    def steps(self) -> list[tuple[str, float]]:
        """(hooks, ms) of each decode step that a next step's start closes: whole ABBA pairs only."""
        decode = [("on" if abba(step - 1) else "off", (b - a) * 1e3)
                  for step, (a, b) in enumerate(zip(self.starts, self.starts[1:])) if step > 0]
        return decode[:len(decode) // 2 * 2]


def step_pairs(lines: list[dict], part: str) -> list[float]:
    """on / off of each adjacent pair of decode steps, over the part's calls."""
    out = []
    for ln in lines:
        if ln.get("part") == part:
            steps = ln["steps"]
            out += [a / b if ha == "on" else b / a for (ha, a), (_, b) in zip(steps[::2], steps[1::2])]
    return out


def arm_ms(lines: list[dict], part: str, hooks: str) -> list[float]:
    return [ms for ln in lines if ln.get("part") == part for h, ms in ln["steps"] if h == hooks]


def summary(lines: list[dict]) -> dict:
    """Step pairs per part and all together; step times per part and arm (rank 0's lines)."""
    parts = ("before", "after")
    pairs = {part: step_pairs(lines, part) for part in parts}
    out: dict = {"step pairs, hooks on / off": {**{part: described(v) for part, v in pairs.items()},
                                                "all": described(pairs["before"] + pairs["after"])}}
    out["step ms"] = {f"{part}, hooks {hooks}": described(arm_ms(lines, part, hooks))
                      for part in parts for hooks in ("on", "off")}
    return out


def render(result: dict) -> str:
    rows = []
    for part, r in result["step pairs, hooks on / off"].items():
        if r:
            where = "all parts" if part == "all" else f"{part} the window call"
            rows.append(f"hooks on / off, {where}, {r['n']} step pairs: median {r['median']:.4f} "
                        f"(min {r['min']:.4f}, max {r['max']:.4f}; bootstrap 90% interval "
                        f"{r['interval90'][0]:.4f}-{r['interval90'][1]:.4f})")
    for name, r in result["step ms"].items():
        if r:
            rows.append(f"step ms, {name}: median {r['median']:.2f} (min {r['min']:.2f}, max {r['max']:.2f}, {r['n']} steps)")
    return "\n".join(rows)


def measure(argv: list[str]) -> list[dict]:
    from dstrace.recording.session import ENV_WINDOW
    from dstrace.recording.window import WindowOptions
    from nvlm_standin import timed_chat
    from zero3_chat import build, parse_args

    same = "--same" in argv
    args = parse_args([a for a in argv if a != "--same"])
    window_call = WindowOptions.from_env(os.environ.get(ENV_WINDOW)).call
    model, tokenizer, pixels, prompt, place = build(args)
    steps = StepSwitch(hook_switch(), same)
    handle = model.language_model.register_forward_pre_hook(steps)
    lines = []
    for call, part in schedule(args.repeats, window_call):
        steps.begin_call(alternate=part in ("before", "after"))
        line = timed_chat(model, tokenizer, pixels, prompt, args.max_new_tokens, place.rank, call, part=part, same=same)
        line["steps"] = steps.steps() if part in ("before", "after") else []
        lines.append(line)
        if args.result:
            with open(args.result, "a") as f:
                f.write(json.dumps(line) + "\n")
    handle.remove()
    steps.switch(True)
    return lines if place.rank == 0 else []


def read(path: str) -> list[dict]:
    """A `--json` file, or the `--result` lines of a run stopped before its summary (rank 0's)."""
    with open(path) as f:
        if not path.endswith(".jsonl"):
            return json.load(f)["lines"]
        return [ln for ln in map(json.loads, filter(str.strip, f)) if ln.get("rank") == 0 and "part" in ln]


def main() -> None:
    argv = sys.argv[1:]

    def take(flag: str) -> str | None:
        if flag not in argv:
            return None
        i = argv.index(flag)
        value = argv[i + 1]
        del argv[i:i + 2]
        return value

    out = take("--json")
    if "--summarize" in argv:
        lines = [ln for path in argv[argv.index("--summarize") + 1:] for ln in read(path)]
    else:
        lines = measure(argv)
    if not lines:
        return
    result = summary(lines)
    print(render(result), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"argv": sys.argv[1:], "summary": result, "lines": lines}, f, indent=2)


if __name__ == "__main__":
    main()
