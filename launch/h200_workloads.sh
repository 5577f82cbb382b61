#!/bin/bash
# The workloads of docs/workloads.md on 2 x H200, each recorded by dstrace unchanged; one run folder per workload,
# packed with the job's output (<name>.log) as $OUT/<name>.tar.gz. Arguments: the workloads to run (default all). Run from a folder holding dstrace/,
# launch/ and .whl/ (msgspec, DeepSpeed 0.19.8 and its needs: /work/shared/device/wheels.sh .whl msgspec).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p runs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpus.txt"
python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)" >> "$OUT/gpus.txt"
ONLY=" $* "  # names of the workloads to run; all when none is given
record() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $name "* ]] || return 0
  timeout "$limit" python3 -c "import sys; from dstrace.cli import main; sys.exit(main())" record -o "runs/$name" "$@" \
    > "runs/$name.log" 2>&1
  echo "$name exit $?" >> "$OUT/gpus.txt"
  tar czf "$OUT/$name.tar.gz" -C runs "$name" "$name.log" 2>/dev/null
}
TR="torchrun --nproc_per_node 2"
record ddp-resnet50 100 -- $TR --master_port 29501 launch/ddp_train.py --timm resnet50 --image 224 --batch 64 --bucket-mb 25 --steps 12
record fsdp2 80 -- $TR --master_port 29502 launch/fsdp2_train.py --dim 2048 --layers 8 --batch 16 --steps 10
record torch-tp 80 --window-after 5 --window-seconds 1 -- $TR --master_port 29503 launch/tp_mlp.py --dim 4096 --hidden 16384 --layers 8 --steps 4000
record comm-bench 90 --window-after 5 --window-seconds 1 -- $TR --master_port 29507 launch/comm_bench.py --seconds 15 --numel 16777216
record accelerate 80 -- accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no --main_process_port 29504 launch/accelerate_generate.py --hidden 1024 --layers 8 --prompts 4 --max-new-tokens 32
# DeepSpeed 0.19.8's op builder cannot parse the image's arch list ('9.0a'): name the H200's plainly.
export TORCH_CUDA_ARCH_LIST=9.0
record ds-kernel-inject 300 -- torchrun --nproc_per_node 1 --master_port 29505 launch/ds_kernel_inject.py --calls 2
# The same with the transformers of DeepSpeed kernel injection's era (transformers 5 passes the KV cache where the
# injected attention expects the mask): .whl-era holds transformers 4.47.1, tokenizers 0.21.0, huggingface-hub 0.27.1.
if [ -d .whl-era ] && { [ "$ONLY" = "  " ] || [[ "$ONLY" == *" ds-kernel-inject-tf447 "* ]]; }; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/era .whl-era/*.whl || exit 1
  PYTHONPATH=/tmp/era:$PYTHONPATH record ds-kernel-inject-tf447 300 -- torchrun --nproc_per_node 1 --master_port 29506 launch/ds_kernel_inject.py --calls 2
fi
