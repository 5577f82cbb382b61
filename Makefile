# Everything the project needs on a fresh machine: `make demo` and `make test` set it all up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dstrace-installed
# DeepSpeed of the report's era (0.16.x: the tensor_parallel block is accepted and ignored),
# installed beside the current release and put first on PYTHONPATH where a run needs it.
DS_ERA := $(abspath .cache/deepspeed-0.16.1)
DS_ERA_STAMP := $(DS_ERA)/deepspeed/__init__.py
export DS_ACCELERATOR ?= cpu

.PHONY: demo test install browser

install: $(STAMP) $(DS_ERA_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0  # the CPU build that lies on this machine's disk
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

$(DS_ERA_STAMP): $(STAMP)
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-deps --target $(DS_ERA) deepspeed==0.16.1

demo: install
	rm -rf traces/demo
	PYTHONPATH=$(DS_ERA) $(BIN)/dstrace record -o traces/demo -- \
	  $(BIN)/torchrun --nproc_per_node 2 launch/zero3_chat.py --size tiny --tp-size 2 --max-new-tokens 16
	$(BIN)/dstrace analyze traces/demo

# Debian's Chromium for the browser tests of `dstrace view` (Playwright drives it; it downloads no browser).
browser:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

test: install browser
	DSTRACE_DEEPSPEED_ERA=$(DS_ERA) $(BIN)/python -m pytest -q
