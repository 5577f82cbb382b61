#!/usr/bin/env bash
# The GPU sweep of docs/root-cause.md, for one device command (at most 10 minutes):
#
#   bash launch/device_sweep.sh [SIZE] [TOKENS] [REPEATS] [ONLY]
#     SIZE     stand-in size (launch/nvlm_standin.py): qwen2-1.5b (default), qwen2-7b, small, ...
#     TOKENS   max_new_tokens per chat() call (default 64)
#     REPEATS  runs of each configuration, alternating ABCABC (default 2)
#     ONLY     comma-separated configurations of launch/sweeps/h200x2.json (default: all)
#   environment: NPROC (GPUs, default all), LOAD (pretrained | config, how ZeRO-3 builds the model),
#     BUDGET_S (seconds the sweep may record before it stops and compares, default 330),
#     RUN_TIMEOUT_S (per run, default 240), SWEEP_DIR (default /tmp/dstrace-sweep/SIZE), OUT (results).
#
# Runs already finished in SWEEP_DIR are kept, so a second command on the same machine continues the
# sweep (more repeats, or the configurations ONLY left out). Needs the wheel folders .whl (DeepSpeed
# 0.19.8 and what dstrace needs beyond the machine's torch/transformers) and .whl016 (DeepSpeed 0.16.1).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${1:-qwen2-1.5b}
TOKENS=${2:-64}
REPEATS=${3:-2}
ONLY=${4:-}
NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}
LOAD=${LOAD:-pretrained}
BUDGET_S=${BUDGET_S:-330}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-240}
SWEEP_DIR=${SWEEP_DIR:-/tmp/dstrace-sweep/$SIZE}
OUT=${OUT:-/tmp/dstrace-out}
MAX_FILE_BYTES=$((15 * 1024 * 1024))

if [ ! -f /tmp/site/deepspeed/__init__.py ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
if [ ! -f /tmp/site016/deepspeed/__init__.py ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site016 \
    .whl016/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
export PATH=/tmp/site/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

mkdir -p "$SWEEP_DIR"
echo "sweep: size=$SIZE tokens=$TOKENS repeats=$REPEATS gpus=$NPROC load=$LOAD only=${ONLY:-all} into $SWEEP_DIR"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
status=0
timeout -s TERM -k 180 "$BUDGET_S" python3 -m dstrace.cli sweep launch/sweeps/h200x2.json -o "$SWEEP_DIR" \
  --repeats "$REPEATS" --set size="$SIZE" --set tokens="$TOKENS" --set nproc="$NPROC" --set load="$LOAD" \
  --set ds_era=/tmp/site016 --run-timeout "$RUN_TIMEOUT_S" ${ONLY:+--only "$ONLY"} > "$SWEEP_DIR.txt" || status=$?
cat "$SWEEP_DIR.txt"
echo "sweep exit status $status"

# Compact results into $OUT: at most 8 files, each under 16 MB.
mkdir -p "$OUT"
if [ ! -f "$SWEEP_DIR/compare.json" ]; then  # the sweep was killed before it compared
  python3 -m dstrace.cli compare "$SWEEP_DIR" --format json -o "$SWEEP_DIR/compare.json" || true
fi
cp "$SWEEP_DIR/compare.json" "$SWEEP_DIR/compare.md" "$OUT/" 2>/dev/null || true
cp "$SWEEP_DIR.txt" "$OUT/compare.txt" 2>/dev/null || true

# Every run's manifests and run record, and the last lines of its log: enough to compare again anywhere.
work=$(mktemp -d)
(cd "$SWEEP_DIR" && find . -name '*.manifest.json' -o -name 'run.json' -o -name 'sweep.json') > "$work/list"
for log in "$SWEEP_DIR"/*/rep*.log; do
  [ -f "$log" ] || continue
  rel=${log#"$SWEEP_DIR"/}
  mkdir -p "$work/logs/$(dirname "$rel")"
  tail -n 200 "$log" > "$work/logs/$rel"
done
tar -czf "$OUT/runs.tar.gz" -C "$SWEEP_DIR" -T "$work/list" -C "$work" logs 2>/dev/null || \
  tar -czf "$OUT/runs.tar.gz" -C "$SWEEP_DIR" -T "$work/list"

# The analysis of each configuration's first finished run.
mkdir -p "$work/analysis"
for run in "$SWEEP_DIR"/*/rep1; do
  [ -d "$run" ] || continue
  name=$(basename "$(dirname "$run")")
  timeout 60 python3 -m dstrace.cli analyze "$run" --format json -o "$work/analysis/$name.json" 2>/dev/null || true
done
tar -czf "$OUT/analysis.tar.gz" -C "$work" analysis

# One representative trace set: the report's configuration, then AutoTP, while they fit in one file.
picked=()
for name in zero3-ds016-tp autotp device-map; do
  [ -d "$SWEEP_DIR/$name/rep1" ] || continue
  tar -czf "$work/try.tar.gz" -C "$SWEEP_DIR" "${picked[@]}" "$name/rep1"
  if [ "$(stat -c %s "$work/try.tar.gz")" -lt "$MAX_FILE_BYTES" ]; then
    picked+=("$name/rep1")
    mv "$work/try.tar.gz" "$OUT/traces.tar.gz"
  fi
done
rm -rf "$work"
ls -la "$OUT"
exit 0
