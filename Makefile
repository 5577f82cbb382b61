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
DEMO_RUN := traces/demo/run.json

.PHONY: demo demo-envs test install browser slurm test-lowest check-newest ds-ops

install: $(STAMP) $(DS_ERA_STAMP) $(ERA_STAMP)

$(CORE_STAMP): pyproject.toml
	@echo "dstrace: installing dstrace and its analysis tools (HTA, TensorBoard, Perfetto) into $(VENV)" \
	  "(about 4 min on a fresh machine, side by side with the next step; 0.6 GB)"
	@$(PYTHON) -m venv $(VENV)
	@$(call PIP_INSTALL,$(BIN)) -e .
	@touch $@

$(STAMP): $(CORE_STAMP)
	$(call PIP_INSTALL,$(BIN)) --upgrade pip
	$(call PIP_INSTALL,$(BIN)) $(TORCH)
	$(call PIP_INSTALL,$(BIN)) -e '.[demo,test,bench]' $(TEST_WORKLOADS)
	touch $@

$(DS_ERA_STAMP): | $(STAMP)
	$(call PIP_INSTALL,$(BIN)) --no-deps --target $(DS_ERA) deepspeed==0.16.1

$(ERA_STAMP):
	@echo "dstrace: installing the report's era (torch 2.13 CPU, DeepSpeed 0.16.1, transformers 4.47) into" \
	  "$(ERA) (about 4-5 min on a fresh machine; 1.2 GB)"
	@$(PYTHON) -m venv $(ERA)
	@$(call PIP_INSTALL,$(ERA)/bin) $(TORCH)
	@$(call PIP_INSTALL,$(ERA)/bin) $(ERA_WORKLOADS)
	@touch $@

# Record the report's setup (ZeRO-3 with tensor_parallel.tp_size=2, 2 ranks on CPU) in the era's
# environment, keep the job's own output in traces/demo.log. --no-cpu-allreduce-op: DeepSpeed on CPU
# would JIT-compile its shared-memory all-reduce op (4-6 min here), which only AutoTP calls; the demo has
# no AutoTP. Recorded again only when the launch scripts change (or after rm -rf traces/demo).
$(DEMO_RUN): launch/zero3_chat.py launch/nvlm_standin.py | $(CORE_STAMP) $(ERA_STAMP)
	@rm -rf traces/demo traces/demo.log
	@mkdir -p traces
	@echo "dstrace: recording 2 ranks of launch/zero3_chat.py (DeepSpeed 0.16.1, ZeRO-3, tp_size=2) on CPU" \
	  "(15-75 s); the job's output goes to traces/demo.log"
	@DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 TORCH_EXTENSIONS_DIR=$(ERA_EXTENSIONS) $(BIN)/dstrace record -o traces/demo -- \
	  $(ERA)/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 \
	  launch/zero3_chat.py --size tiny --tp-size 2 --max-new-tokens 16 --no-cpu-allreduce-op >traces/demo.log 2>&1 \
	  || { tail -n 40 traces/demo.log; rm -rf traces/demo; echo "dstrace: the demo's recording failed; its log: traces/demo.log"; exit 1; }
	@grep '^dstrace:' traces/demo.log

# The demo's two environments, built side by side: dstrace's own (no torch) and the era's.
demo-envs:
	@$(MAKE) --no-print-directory -s -j2 $(CORE_STAMP) $(ERA_STAMP)

demo: demo-envs
	@$(MAKE) --no-print-directory -q $(DEMO_RUN) \
	  && echo "dstrace: traces/demo is recorded already (rm -rf traces/demo to record it again, about 1 min)" \
	  || $(MAKE) --no-print-directory $(DEMO_RUN)
	@echo "dstrace: analyzing traces/demo (about 15 s; a few seconds when nothing changed)"
	@$(BIN)/dstrace analyze traces/demo
	@echo "dstrace: run dstrace yourself with $(BIN)/dstrace (or: . $(BIN)/activate), e.g." \
	  "$(BIN)/dstrace view traces/demo --report; what a finding means: $(BIN)/dstrace explain FINDING"

# Debian's Chromium for the browser tests of `dstrace view` (Playwright drives it; it downloads no browser).
browser:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

# Debian's SLURM and munge for the tests that run the real srun (tests/fixtures/slurm.py starts a two-node
# cluster on this host for the test session, as root, and stops it after; about 10 s to install, 2 s to start).
SLURM_TOOLS := munged slurmctld slurmd srun sinfo
slurm:
	@(for t in $(SLURM_TOOLS); do command -v $$t || exit 1; done) >/dev/null \
	  || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	      slurmd slurmctld slurm-client munge)

# DeepSpeed on CPU JIT-builds its shared-memory all-reduce op (deepspeed_shm_comm) at a job's first
# init_distributed, 5-15 min here. The tests' jobs run two releases, each with its own build folder
# (tests/fixtures/processes.cpu_env, launch/sweeps/cpu-tiny.json): both are built here, before the tests, the way a job
# builds them, so that no test's time limit pays for a build (seconds when they are built already).
DS_EXTENSIONS := $(HOME)/.cache/torch_extensions
DS_OP_BUILD := from deepspeed.accelerator import get_accelerator as a; a().create_op_builder("ShareMemCommBuilder").load()
ds-ops: install
	@echo "dstrace: building DeepSpeed's CPU all-reduce op for 0.19.8 and 0.16.1 (5-15 min each the first time, seconds after)"
	@env DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$(DS_EXTENSIONS)/deepspeed-installed $(BIN)/python -c '$(DS_OP_BUILD)' >/dev/null
	@env DS_ACCELERATOR=cpu PYTHONPATH=$(DS_ERA) TORCH_EXTENSIONS_DIR=$(DS_EXTENSIONS)/deepspeed-0.16.1 $(BIN)/python -c '$(DS_OP_BUILD)' >/dev/null

# DSTRACE_REQUIRE_SLURM: here the srun tests fail, not skip, where the cluster cannot start.
test: install browser slurm ds-ops
	DS_ACCELERATOR=cpu DSTRACE_REQUIRE_SLURM=1 DSTRACE_DEEPSPEED_ERA=$(DS_ERA) DSTRACE_ERA_PYTHON=$(ERA)/bin/python $(BIN)/python -m pytest -q

# The analysis against the lowest releases pyproject.toml allows (constraints/lowest.txt): a second venv,
# .cache/lowest, with torch for the gloo jobs, and the tests that need no recording of a DeepSpeed job.
# test_reports_unchanged compares reports byte for byte, and the last bit of a float sum depends on the pandas
# release (kernel_us 82928.657 under pandas 3.1.1, 82928.65699999999 under 2.2.0): it runs in `make test` only.
LOWEST := $(abspath .cache/lowest)
LOWEST_STAMP := $(LOWEST)/.installed
ANALYSIS_TESTS := tests/corpus tests/analysis --ignore=tests/analysis/test_recorded_run.py \
	--ignore=tests/analysis/test_reports_unchanged.py
# The uncapped analysis dependencies whose newest release `make test` must run against (HTA is capped <0.6).
NEWEST := pandas numpy pyarrow msgspec isal xxhash rich

$(LOWEST_STAMP): pyproject.toml constraints/lowest.txt
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(call PIP_INSTALL,$(LOWEST)/bin) --upgrade pip
	$(call PIP_INSTALL,$(LOWEST)/bin) $(TORCH)
	$(call PIP_INSTALL,$(LOWEST)/bin) -c constraints/lowest.txt -e . pytest
	touch $@

test-lowest: $(LOWEST_STAMP)
	DS_ACCELERATOR=cpu $(LOWEST)/bin/python -m pytest -q -p no:cacheprovider $(ANALYSIS_TESTS)

# .venv holds the newest release of each analysis dependency (what a new user gets): fail if any is outdated.
check-newest: $(STAMP)
	$(BIN)/python .ci/check_newest.py $(NEWEST)
