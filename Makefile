# vitviz: `make report` renders the figures, `make test` runs the whole suite.
# Both create the virtual environment and install vitviz into it when needed.
PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.vitviz-installed
EXTRAS ?= dev,notebooks,hf
OUT    ?= reports
DATA   ?= $(if $(VITVIZ_DATA),$(VITVIZ_DATA),../shared/data/cifar10)

.PHONY: install report test test-fast lint bench clean train-reference study

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

# Trains and exports the embedded reference checkpoints (hours on a CPU). Every run resumes where it stopped.
REF_MODELS ?= cifar10-vit cifar10-hybrid cifar10-resnet cifar10-vit-nopos cifar10-vit-2dpos
REF_EPOCHS ?= 32
train-reference: install
	for m in $(REF_MODELS); do \
	  $(VPY) -m vitviz.train $$m --data $(DATA) --epochs $(REF_EPOCHS) --out runs --resume \
	    --export data/checkpoints || exit 1; \
	done

# The small-scale hybrid-versus-pure sweep behind data/study/hybrid_vs_pure.csv (resumable).
study: install
	$(VPY) -m vitviz.study hybrid-vs-pure --data $(DATA) --epochs 2,4 --train-subset 5000 --test-subset 2000

clean:
	rm -rf $(OUT) .pytest_cache build *.egg-info
