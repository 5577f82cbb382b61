# Everything the project needs on a fresh machine: `make demo` and `make test` set it all up.
#
# Two environments, as the README recommends for users:
#   .venv/       dstrace's own: dstrace (editable), its analysis dependencies, and the tests' workloads
#                (torch, the current DeepSpeed and transformers).
#   .cache/era/  a job's environment of the report's era (torch, DeepSpeed 0.16.1, transformers 4.47):
#                the demo records it with dstrace from .venv, which lends it nothing.
# DeepSpeed 0.16.1 is also installed as a bare folder (.cache/deepspeed-0.16.1) that tests put on the
# PYTHONPATH of .venv's own jobs, to compare releases under one transformers.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dstrace-installed
# dstrace alone (no torch, no test tools): what `make demo` needs in .venv.
CORE_STAMP := $(VENV)/.dstrace-core
ERA := $(abspath .cache/era)
ERA_STAMP := $(ERA)/.installed
DS_ERA := $(abspath .cache/deepspeed-0.16.1)
DS_ERA_STAMP := $(DS_ERA)/deepspeed/__init__.py
# torch 2.13.0 is the CPU build that lies on this machine's disk (pip takes it from there).
TORCH := torch==2.13.0
# The tests' workloads in .venv: the current DeepSpeed release refuses the report's tp_size.
TEST_WORKLOADS := deepspeed==0.19.8 'transformers>=5.17,<6'
ERA_WORKLOADS := deepspeed==0.16.1 transformers==4.47.1 accelerate==1.2.1
# DeepSpeed's setup imports torch when DS_ACCELERATOR is set, and pip builds its source archive in an
# isolated environment without torch: every install runs with the variable unset.
PIP_INSTALL = env -u DS_ACCELERATOR DS_BUILD_OPS=0 $(1)/python -m pip install -q
# DeepSpeed on CPU compiles its shared-memory comm op at its first init_distributed. Each environment
# keeps its own build folder: two DeepSpeed releases sharing one folder rebuild each other's op.
ERA_EXTENSIONS := $(ERA)/torch-extensions
ERA_OP_STAMP := $(ERA)/.shm-op-built

.PHONY: demo demo-envs test install browser

install: $(STAMP) $(DS_ERA_STAMP) $(ERA_STAMP)

$(CORE_STAMP): pyproject.toml
	@echo "dstrace: installing dstrace and its analysis tools (HTA, TensorBoard, Perfetto) into $(VENV)" \
	  "(about 2-3 min on a fresh machine, 0.9 GB)"
	$(PYTHON) -m venv $(VENV)
	$(call PIP_INSTALL,$(BIN)) --upgrade pip
	$(call PIP_INSTALL,$(BIN)) -e .
	touch $@

$(STAMP): $(CORE_STAMP)
	$(call PIP_INSTALL,$(BIN)) $(TORCH)
	$(call PIP_INSTALL,$(BIN)) -e '.[demo,test,bench]' $(TEST_WORKLOADS)
	touch $@

$(DS_ERA_STAMP): | $(STAMP)
	$(call PIP_INSTALL,$(BIN)) --no-deps --target $(DS_ERA) deepspeed==0.16.1

$(ERA_STAMP):
	@echo "dstrace: installing the report's era (torch 2.13 CPU, DeepSpeed 0.16.1, transformers 4.47) into" \
	  "$(ERA) (about 2-3 min on a fresh machine, 1.2 GB)"
	$(PYTHON) -m venv $(ERA)
	$(call PIP_INSTALL,$(ERA)/bin) $(TORCH)
	$(call PIP_INSTALL,$(ERA)/bin) $(ERA_WORKLOADS)
	touch $@

# DeepSpeed 0.16.1 on CPU JIT-compiles its shared-memory comm op (deepspeed_shm_comm, used for CPU
# all-reduce) in every init_distributed, with no switch to skip it: compile it once here, into the era's
# own build folder, so the recording neither waits for it nor loses it to another DeepSpeed release.
$(ERA_OP_STAMP): $(ERA_STAMP)
	@echo "dstrace: DeepSpeed 0.16.1 compiles its CPU shared-memory op once (about 2-4 min; later runs reuse it)"
	@env DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$(ERA_EXTENSIONS) $(ERA)/bin/python -c \
	  "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load(verbose=False)" \
	  >$(ERA)/shm-op-build.log 2>&1 \
	  || { tail -n 20 $(ERA)/shm-op-build.log; echo "dstrace: the op's build failed; its log: $(ERA)/shm-op-build.log"; exit 1; }
	@touch $@

# The demo's two environments, built side by side (pip waits on the network while the op compiles).
demo-envs:
	@$(MAKE) --no-print-directory -j2 $(CORE_STAMP) $(ERA_OP_STAMP)

# Record the report's setup (ZeRO-3 with tensor_parallel.tp_size=2, 2 ranks on CPU) in the era's
# environment, keep the job's own output in traces/demo.log, then explain the run.
demo: demo-envs
	@rm -rf traces/demo traces/demo.log
	@mkdir -p traces
	@echo "dstrace: recording 2 ranks of launch/zero3_chat.py (DeepSpeed 0.16.1, ZeRO-3, tp_size=2) on CPU" \
	  "(about 1 min); the job's output goes to traces/demo.log"
	@DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 TORCH_EXTENSIONS_DIR=$(ERA_EXTENSIONS) $(BIN)/dstrace record -o traces/demo -- \
	  $(ERA)/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 \
	  launch/zero3_chat.py --size tiny --tp-size 2 --max-new-tokens 16 >traces/demo.log 2>&1 \
	  || { tail -n 40 traces/demo.log; echo "dstrace: the demo's recording failed; its log: traces/demo.log"; exit 1; }
	@grep '^dstrace:' traces/demo.log
	@echo "dstrace: analyzing traces/demo (about 30 s)"
	@$(BIN)/dstrace analyze traces/demo
	@echo "dstrace: run dstrace yourself with $(BIN)/dstrace (or: . $(BIN)/activate), e.g. $(BIN)/dstrace view traces/demo --report"

# Debian's Chromium for the browser tests of `dstrace view` (Playwright drives it; it downloads no browser).
browser:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

test: install browser
	DS_ACCELERATOR=cpu DSTRACE_DEEPSPEED_ERA=$(DS_ERA) DSTRACE_ERA_PYTHON=$(ERA)/bin/python $(BIN)/python -m pytest -q
