# Two entry points (README.md): `make run` (the notebook pipeline) and `make test`.
# Both create .venv on first use and install what they need into it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
comma  := ,
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
EXTRAS := dev$(if $(HAS_GPU),$(comma)gpu,)

.PHONY: run test install clean-runs

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first: on the project's machines 2.13.0 is a local CPU wheel; elsewhere any torch will do
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m workbench run $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q --nbval-lax --nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider tests notebooks

clean-runs:
	rm -rf runs
