# Two commands a reader needs: `make book` and `make test`. Each creates .venv and installs
# what it needs on first use (and again whenever a requirements file changes).
# `make browser-test` then checks the built site in headless Chromium (tests/browser).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A GPU listed by nvidia-smi selects the CUDA 12 requirements; anything else gets the CPU set.
REQUIREMENTS := $(shell if nvidia-smi -L 2>/dev/null | grep -q GPU; then echo requirements-cuda12.txt; else echo requirements.txt; fi)

# MathJax is served from the site itself, not from a CDN: `make book` fetches this exact npm
# package (checked against its SHA-256) and unpacks its browser build into a git-ignored folder
# that _config.yml copies into the site (html_static_path, mathjax_path).
MATHJAX_VERSION := 3.2.2
MATHJAX_SHA256 := 1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09
MATHJAX_DIR := book/_static/mathjax
MATHJAX_STAMP := $(MATHJAX_DIR)/VERSION-$(MATHJAX_VERSION)
MATHJAX_TMP := _build/mathjax-download

# The browser suite's inputs: the built site and Debian's Chromium (no browser download).
HTML ?= _build/html
CHROMIUM ?= /usr/bin/chromium

.PHONY: book test clean venv mathjax browser-test chapter lab lint bench

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-cuda12.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r $(REQUIREMENTS)
	touch $@

$(VENV)/.browser-installed: requirements-browser.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -r requirements-browser.txt
	touch $@

mathjax: $(MATHJAX_STAMP)

# The browser build (es5/) without what this site never loads: the SVG output, the other
# combined entry points, and latest.js (which would fetch MathJax from a CDN).
$(MATHJAX_STAMP):
	@command -v npm >/dev/null || { echo "npm (Node.js) is needed to fetch MathJax from the npm registry"; exit 1; }
	rm -rf $(MATHJAX_DIR) $(MATHJAX_TMP)
	mkdir -p $(dir $(MATHJAX_DIR))
	mkdir -p $(MATHJAX_TMP)
	cd $(MATHJAX_TMP) && npm pack --silent mathjax@$(MATHJAX_VERSION) >/dev/null
	echo "$(MATHJAX_SHA256)  $(MATHJAX_TMP)/mathjax-$(MATHJAX_VERSION).tgz" | sha256sum --check --quiet
	tar -xzf $(MATHJAX_TMP)/mathjax-$(MATHJAX_VERSION).tgz -C $(MATHJAX_TMP) --strip-components=2 package/es5
	cd $(MATHJAX_TMP) && rm -rf mathjax-$(MATHJAX_VERSION).tgz latest.js node-main.js output/svg output/svg.js \
	  tex-chtml.js tex-chtml-full.js tex-chtml-full-speech.js tex-svg.js tex-svg-full.js tex-mml-svg.js mml-chtml.js mml-svg.js
	test -f $(MATHJAX_TMP)/tex-mml-chtml.js
	mv $(MATHJAX_TMP) $(MATHJAX_DIR)
	touch $@

# One worker per core: the time is mostly XLA compiling. JAX's persistent compilation cache
# (chapter 1) keeps compiled programs in _build/jax-cache, so a second run compiles less.
# XLA_PYTHON_CLIENT_PREALLOCATE=false: on a GPU each worker (and each notebook kernel of the book)
# takes memory as it needs it, instead of 75 % of the GPU each, which starves all but the first.
# Float32 precision is pinned to HIGHEST for the tests by tests/conftest.py, for the book below.
test: venv
	XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_COMPILATION_CACHE_DIR=$(CURDIR)/_build/jax-cache \
	  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
	  $(BIN)/python -m pytest -n auto --dist worksteal --durations=10

# ruff, configured in pyproject.toml: lint and format check of the package, tests and scripts.
# The goals the issues set (jaxloops/pages/goals.py), measured and recorded per machine in
# results/bench/; fails when one that applies here is missed. BENCH_ARGS=--rates adds the
# transformer step's tokens/s table. A benchmark, not a test. requirements-bench.txt adds
# PyTorch (CPU) for the goal against PyTorch eager.
bench: $(VENV)/.bench-installed
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

$(VENV)/.bench-installed: requirements-bench.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	touch $@

lint: $(VENV)/.lint-installed
	$(BIN)/ruff check code tests scripts .ci
	$(BIN)/ruff format --check code tests scripts .ci
	$(BIN)/actionlint .github/workflows/*.yml

$(VENV)/.lint-installed: requirements-lint.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -r requirements-lint.txt
	touch $@

# One chapter, executed in the terminal: `make chapter N=05` writes _build/chapters/05_*.ipynb.
chapter: venv
	@test -n "$(N)" || { echo "usage: make chapter N=05 (the number of a chapter in book/)"; exit 1; }
	env -u MPLBACKEND JAXLOOPS_STRICT=1 $(BIN)/python scripts/run_chapter.py $(N) --out _build/chapters

# JupyterLab on the project's environment: open any book/*.md as a notebook (jupytext).
lab: $(VENV)/.lab-installed
	$(BIN)/jupyter lab --notebook-dir=$(CURDIR)/book $(if $(filter 0,$(shell id -u)),--allow-root)

$(VENV)/.lab-installed: requirements-lab.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -r requirements-lab.txt
	touch $@

book: venv mathjax
	rm -rf _build/html _build/.doctrees _build/jupyter_execute _build/roofline.json _build/goals
	# MPLBACKEND=Agg in the environment would stop figures from reaching the pages: unset it.
	# JAXLOOPS_ROOFLINE: the first chapter that needs the roofline measures it; the rest read it.
	# JAX_DEFAULT_MATMUL_PRECISION=highest: float32 means float32 (not TF32 on NVIDIA GPUs).
	env -u MPLBACKEND JAXLOOPS_STRICT=1 JAXLOOPS_ROOFLINE=$(CURDIR)/_build/roofline.json \
	  XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest \
	  $(BIN)/jupyter-book build . --warningiserror --nitpick --keep-going
	@echo "Open _build/html/index.html in a browser."

# Serves $(HTML) on localhost and drives headless Chromium over every page; also checks every
# internal link and anchor. Build first (`make book`); HTML=... points it at another build.
browser-test: $(VENV)/.browser-installed
	@test -f $(HTML)/index.html || { echo "no built book in $(HTML): run 'make book' first (or pass HTML=...)"; exit 1; }
	@test -x $(CHROMIUM) || { echo "no Chromium at $(CHROMIUM): 'apt-get install chromium' (Debian), or pass CHROMIUM=..."; exit 1; }
	BOOK_HTML=$(HTML) CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests/browser

clean:
	rm -rf _build .pytest_cache $(MATHJAX_DIR)

# The strict book build with one core taken by a CPU-bound process beside it (a shared CI
# runner): the book must pass so too. BUSY_CPU=0 pins the busy process to core 0.
.PHONY: book-busy
book-busy: venv
	scripts/busy_build.sh $(MAKE) book
