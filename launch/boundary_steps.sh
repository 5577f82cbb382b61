#!/bin/bash
# The profiler's boundary steps before and after they were kept out of the window (issue #25), alternating runs
# of two dstrace checkouts on one workload; then launch/boundary_steps.py prints each kind's cost.
#   launch/boundary_steps.sh OLD_CHECKOUT NEW_CHECKOUT REPEATS -- COMMAND...
# CPU (as measured for the issue):
#   launch/boundary_steps.sh /tmp/old . 3 -- python launch/device_map_chat.py --size tiny --max-new-tokens 32 --repeats 2
# GPU (left to do, one H200: random-weight Qwen2-7B stand-ins, bf16, 32 new tokens):
#   launch/boundary_steps.sh /tmp/old . 3 -- python launch/device_map_chat.py --size qwen2-7b --max-new-tokens 32 --repeats 2
#   launch/boundary_steps.sh /tmp/old . 3 -- torchrun --nproc_per_node 1 launch/zero3_chat.py --size qwen2-7b --max-new-tokens 32 --repeats 2
# OLD_CHECKOUT: e.g. `git worktree add /tmp/old ff03bd2`. Run folders go to ${RUNS:-runs/boundary}/{old,new}-N.
# WINDOW_CALL (default 1): the generate()/chat() call whose steps are recorded (2 leaves the first call's warm-up out).
set -eu
old=$1 new=$2 repeats=$3; shift 3
[ "$1" = "--" ] && shift
runs=${RUNS:-runs/boundary}
mkdir -p "$runs"
for i in $(seq 1 "$repeats"); do
  for side in old new; do
    tree=$old; [ $side = new ] && tree=$new
    # -c puts the working folder first on sys.path: taken off, so that each side's dstrace is its checkout's
    PYTHONPATH=$(cd "$tree" && pwd)${PYTHONPATH:+:$PYTHONPATH} python3 -c "import sys; sys.path.remove(''); from dstrace.cli import main; sys.exit(main())" \
      record -o "$runs/$side-$i" --window-call "${WINDOW_CALL:-1}" --window-start 2 --window-steps 3 -- "$@" > "$runs/$side-$i.log" 2>&1
  done
done
python3 "$(dirname "$0")/boundary_steps.py" --json "$runs/boundary_steps.json" "$runs"/old-*/ "$runs"/new-*/
