# vitviz: `make report` executes the notebooks and renders the figures, `make test` runs the whole suite,
# `make test-browser` drives JupyterLab and the built documentation site in headless Chromium, `make docs` builds
# the documentation site (Sphinx, offline, warnings are errors) into $(DOCS_OUT), `make test-oldest` runs the suite on the declared
# minimum version of every dependency and of the extras it installs (a second venv, $(VENV_OLDEST), pinned by
# tests/constraints-oldest.txt). All create their virtual environment when needed.
PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.vitviz-installed
BROWSER_STAMP := $(VENV)/.vitviz-browser-installed
DOCS_STAMP := $(VENV)/.vitviz-docs-installed
DOCS_OUT ?= docs/_build/html
CHROMIUM ?= /usr/bin/chromium
EXTRAS ?= dev,notebooks,hf,clip,explain
OUT    ?= reports
DATA   ?= $(if $(VITVIZ_DATA),$(VITVIZ_DATA),../shared/data/cifar10)
DEVICE ?= auto

VENV_OLDEST ?= .venv-oldest
OLDEST_STAMP := $(VENV_OLDEST)/.vitviz-installed
OLDEST_CONSTRAINTS ?= tests/constraints-oldest.txt
# what test-oldest runs: the whole suite but the browser tests (they need the browser extra and Chromium), the zoo
# and the two long checks whose result does not depend on the library versions (newest_only: pyproject.toml)
OLDEST_MARKERS ?= not browser and not zoo and not newest_only

.PHONY: install install-oldest install-browser install-docs docs report test test-fast test-oldest test-browser lint bench clean \
	train-reference study test-zoo

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# Executes notebooks/*.ipynb headless (papermill, kernel python3) and renders the package figures:
# $(OUT)/index.html, figures/, arrays/, notebooks/ (executed .ipynb + HTML), meta.json.
report: install
	VITVIZ_DATA=$(DATA) $(VPY) -m vitviz report --out $(OUT) --gallery docs/gallery

# The browser tests run only in test-browser (they need JupyterLab, Playwright and Chromium).
test: install
	$(VPY) -m pytest -m "not browser and not zoo"

test-fast: install
	$(VPY) -m pytest -m "not slow and not browser and not zoo"

# The version matrix's lower end: the same suite in $(VENV_OLDEST) with the minimum versions pinned.
install-oldest: $(OLDEST_STAMP)

$(OLDEST_STAMP): pyproject.toml $(OLDEST_CONSTRAINTS)
	@test -x $(VENV_OLDEST)/bin/python || $(PYTHON) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_OLDEST)/bin/python -m pip install --quiet -c $(OLDEST_CONSTRAINTS) -e ".[$(EXTRAS)]"
	@touch $(OLDEST_STAMP)

test-oldest: install-oldest
	$(VENV_OLDEST)/bin/python -c "import torch, torchvision, timm, transformers as t; \
		print('oldest:', 'torch', torch.__version__, 'torchvision', torchvision.__version__, 'timm', timm.__version__, 'transformers', t.__version__)"
	$(VENV_OLDEST)/bin/python -m pytest -p no:cacheprovider -m "$(OLDEST_MARKERS)"

# Debian's Chromium (apt, as root, only when $(CHROMIUM) is missing) and the `browser` extra (JupyterLab,
# Playwright's Python package; Playwright drives $(CHROMIUM): no `playwright install`, no download).
install-browser: install
	@test -x $(CHROMIUM) || { apt-get update && apt-get install -y chromium; }
	@$(MAKE) --no-print-directory $(BROWSER_STAMP)

$(BROWSER_STAMP): $(STAMP) pyproject.toml
	$(VPY) -m pip install --quiet -e ".[$(EXTRAS),browser]"
	@touch $(BROWSER_STAMP)

# The docs site's link check needs the site: test-browser builds it first (a rebuild of an unchanged tree takes
# seconds).
test-browser: install-browser docs
	VITVIZ_CHROMIUM=$(CHROMIUM) VITVIZ_REQUIRE_BROWSER=1 VITVIZ_BROWSER_OUT=$(OUT)/browser VITVIZ_DOCS_HTML=$(DOCS_OUT) \
		$(VPY) -m pytest -m browser tests/browser

# The documentation site: API reference from the docstrings (every name of vitviz._LAZY), the example gallery
# (docs/examples, executed), the five notebooks (executed with small parameters, cached), the Markdown pages.
# Offline; warnings are errors. Notebook 04 needs the CIFAR-10 test folder ($(DATA), as for `make report`).
# Prints its wall time: about 3 minutes from scratch on a 2-core CPU, seconds for a rebuild of an unchanged tree.
install-docs: $(DOCS_STAMP)

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(VPY) -m pip install --quiet -e ".[$(EXTRAS),docs]"
	@touch $(DOCS_STAMP)

docs: install-docs
	@t0=$$(date +%s); VITVIZ_DATA=$(abspath $(DATA)) MPLBACKEND=Agg $(VPY) -m sphinx -W --keep-going -q -b html \
		-d docs/_build/doctrees docs $(DOCS_OUT); status=$$?; \
		echo "docs: $(DOCS_OUT)/index.html in $$(( $$(date +%s) - t0 )) s"; exit $$status

lint: install
	$(VPY) -m ruff check vitviz tests bench

bench: install
	$(VPY) bench/import_time.py

# Trains and exports the embedded reference checkpoints (hours on a CPU). Every run resumes where it stopped.
# The ablation trio (1-D control, none, 2-D) shares one recipe and budget (REF_EPOCHS); EPOCHS_<model> sets one
# model's budget, by default those of the shipped checkpoints. `make train-MODEL` trains a single one.
REF_MODELS ?= cifar10-vit cifar10-vit-1dpos cifar10-vit-nopos cifar10-vit-2dpos cifar10-hybrid cifar10-resnet
REF_EPOCHS ?= 32
EPOCHS_cifar10-vit ?= 64
EPOCHS_cifar10-hybrid ?= 22
EPOCHS_cifar10-resnet ?= 16
train-reference: $(addprefix train-,$(REF_MODELS))
train-cifar10-%: install
	$(VPY) -m vitviz.experiments.train cifar10-$* --data $(DATA) --epochs $(or $(EPOCHS_cifar10-$*),$(REF_EPOCHS)) --out runs \
	  --resume --export vitviz/zoo/checkpoints

# The small-scale hybrid-versus-pure sweep behind data/study/hybrid_vs_pure.csv (resumable).
study: install
	$(VPY) -m vitviz.experiments.study hybrid-vs-pure --data $(DATA) --seeds 0,1,2 --epochs 2,4,8 --train-subset 5000 --full-epochs 16 --full-sizes S,M --test-subset 0 --device $(DEVICE)

clean:
	rm -rf $(OUT) .pytest_cache build *.egg-info $(VENV_OLDEST) docs/_build docs/generated docs/auto_examples \
		docs/notebooks docs/api.rst docs/plot_api.md

# Every ViT-like architecture in timm's registry (about 300, random weights, small images; tens of minutes on a
# CPU): each passes the conformance invariants or is refused clearly. Writes docs/coverage.md from the results.
ZOO_RESULTS ?= reports/zoo/results.jsonl
test-zoo: install
	rm -f $(ZOO_RESULTS)
	VITVIZ_ZOO_RESULTS=$(ZOO_RESULTS) $(VPY) -m pytest -m zoo tests/test_zoo_registry.py -q; status=$$?; \
	  $(VPY) tests/zoo_registry.py table --results $(ZOO_RESULTS) --out docs/coverage.md; exit $$status
