#!/usr/bin/env bash
# Issue #25 on one GPU (one device command each, at most 10 minutes): the profiler's boundary steps before
# (OLD_CHECKOUT, e.g. ff03bd2) and after they were kept out of the window, alternating runs; then this
# checkout's analysis of each new run, and a step comparison across the window's steps.
#
#   bash launch/steps_device.sh dm|z3 OLD_CHECKOUT [REPEATS]
#     dm  HF device_map, launch/device_map_chat.py (the issue's first two rows)
#     z3  ZeRO-3 on one rank, launch/zero3_chat.py --load config (the issue's third row)
#   Random-weight Qwen2-7B stand-ins (launch/nvlm_standin.py), bf16, 32 new tokens, two chat() calls, the
#   window in call 2 (steps 2-4). Needs the wheel folder .whl (launch/try_device.sh). Leaves in $OUT:
#   boundary-KIND.json (launch/boundary_steps.py), analyze-KIND.txt, steps-KIND.txt and runs-KIND.tar.gz
#   (manifests, run records, kept reductions and logs; traces left out).
set -uo pipefail
cd "$(dirname "$0")/.."
KIND=$1 OLD=$2 REPEATS=${3:-2}
OUT=${OUT:-/tmp/dstrace-out}
mkdir -p "$OUT"
if [ ! -f /tmp/site/deepspeed/__init__.py ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TORCH_CUDA_ARCH_LIST=9.0
case $KIND in
  dm) JOB=(python3 launch/device_map_chat.py --size qwen2-7b --max-new-tokens 32 --repeats 2) ;;
  z3) JOB=(torchrun --nproc_per_node 1 --master_port 29512 launch/zero3_chat.py --size qwen2-7b --max-new-tokens 32
           --repeats 2 --load config) ;;
  *) echo "unknown kind $KIND" >&2; exit 2 ;;
esac
RUNS=/tmp/b25/$KIND
rm -rf "$RUNS"
RUNS=$RUNS WINDOW_CALL=2 bash launch/boundary_steps.sh "$OLD" . "$REPEATS" -- "${JOB[@]}" | tee "$OUT/boundary-$KIND.txt"
cp "$RUNS/boundary_steps.json" "$OUT/boundary-$KIND.json"
DSTRACE=(env PYTHONPATH=$PWD:/tmp/site python3 -c "import sys; from dstrace.cli import main; sys.exit(main())")
for run in "$RUNS"/new-* "$RUNS"/old-1; do
  [ -d "$run" ] || continue
  echo "=== dstrace analyze $(basename "$run")" >> "$OUT/analyze-$KIND.txt"
  "${DSTRACE[@]}" analyze "$run" --format text >> "$OUT/analyze-$KIND.txt" 2>&1
  "${DSTRACE[@]}" analyze "$run" --format json -o "$run/analysis.json" >/dev/null 2>&1
done
# The window holds call 2's steps 2, 3 and 4: what grew from the first two to the last.
"${DSTRACE[@]}" analyze "$RUNS/new-1" --steps 2:3 --against 4:4 > "$OUT/steps-$KIND.txt" 2>&1
tar czf "$OUT/runs-$KIND.tar.gz" -C "$RUNS" --exclude '*.pt.trace.json*' --exclude '.*cache*' .
ls -la "$OUT"
