# vitviz: `make report` renders the figures, `make test` runs the whole suite.
# Both create the virtual environment and install vitviz into it when needed.
PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.vitviz-installed
EXTRAS ?= dev,notebooks,hf
OUT    ?= reports
DATA   ?= $(if $(VITVIZ_DATA),$(VITVIZ_DATA),../shared/data/cifar10)

.PHONY: install report test test-fast lint bench clean train-reference

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

report: install
	$(VPY) -m vitviz report --out $(OUT)

test: install
	$(VPY) -m pytest

test-fast: install
	$(VPY) -m pytest -m "not slow"

lint: install
	$(VPY) -m ruff check vitviz tests bench

bench: install
	$(VPY) bench/import_time.py

# Trains the embedded reference checkpoints (hours on a CPU; resumable with RESUME=--resume).
train-reference: install
	VITVIZ_DATA=$(DATA) $(VPY) -m vitviz.train all --out runs $(RESUME)

clean:
	rm -rf $(OUT) .pytest_cache build *.egg-info
