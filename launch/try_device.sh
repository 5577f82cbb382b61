#!/usr/bin/env bash
# `dstrace try` on GPUs, for one device command (at most 10 minutes): the report's script (HfDeepSpeedConfig with
# ZeRO-3, from_pretrained, deepspeed.initialize, chat() calling generate(), each rank its own prompt), unchanged,
# as it is and with zero_optimization.stage=0; then the same change taken from the as-is run's own analysis
# (--suggested), which must name it.
#
#   bash launch/try_device.sh [SIZE] [TOKENS] [REPEATS]
#     SIZE     stand-in size (launch/nvlm_standin.py): qwen2-7b (default; 15.2 GB bf16, fits one H200 whole)
#     TOKENS   max_new_tokens per chat() call (default 32)
#     REPEATS  runs of each side, alternating (default 2)
#   environment: NPROC (GPUs, default all), OUT (results; default /tmp/dstrace-out).
#
# Needs the wheel folder .whl (DeepSpeed 0.19.8 and what dstrace needs beyond the machine's torch/transformers),
# as launch/device_sweep.sh. Leaves in $OUT: try.json / try.md / try.txt of the try, suggested.txt, and
# runs.tar.gz (every run's manifests, run record and log: `dstrace compare $DIR` runs on them anywhere).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${1:-qwen2-7b}
TOKENS=${2:-32}
REPEATS=${3:-2}
NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}
OUT=${OUT:-/tmp/dstrace-out}
DIR=/tmp/dstrace-try/$SIZE
mkdir -p "$OUT"

if [ ! -f /tmp/site/deepspeed/__init__.py ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0  # DeepSpeed 0.19.8's op builder cannot parse the image's '9.0a'
DSTRACE="python3 -c 'import sys; from dstrace.cli import main; sys.exit(main())'"
JOB="torchrun --nproc_per_node $NPROC --master_port 29511 launch/zero3_chat.py --size $SIZE --max-new-tokens $TOKENS --checkpoint-dir /tmp/dstrace-standin-$SIZE"

rm -rf "$DIR"
eval "$DSTRACE" try --repeats "$REPEATS" --set zero_optimization.stage=0 -o "$DIR" --run-timeout 240 -- $JOB \
  > "$OUT/try.txt" 2> "$OUT/try.stderr" || echo "try exit $?" >> "$OUT/try.stderr"
cp "$DIR/try.json" "$DIR/try.md" "$OUT/" 2>/dev/null || true
# The as-is run's analysis must suggest the same change; the try itself is not repeated (no time left for it).
eval "$DSTRACE" try --suggested "$DIR/as-is/rep1" -o /tmp/dstrace-try/suggested-refused-or-empty -- false \
  > /dev/null 2> "$OUT/suggested.txt" || true
tar czf "$OUT/runs.tar.gz" -C "$(dirname "$DIR")" --exclude '*.pt.trace.json*' "$(basename "$DIR")"
