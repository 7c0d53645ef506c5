# Two commands a reader needs: `make book` and `make test`. Each creates .venv and installs
# what it needs on first use (and again whenever a requirements file changes).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A GPU listed by nvidia-smi selects the CUDA 12 requirements; anything else gets the CPU set.
REQUIREMENTS := $(shell if nvidia-smi -L 2>/dev/null | grep -q GPU; then echo requirements-cuda12.txt; else echo requirements.txt; fi)

.PHONY: book test clean venv

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-cuda12.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r $(REQUIREMENTS)
	touch $@

test: venv
	$(BIN)/python -m pytest

book: venv
	rm -rf _build/html _build/.doctrees _build/jupyter_execute
	$(BIN)/jupyter-book build . --warningiserror --nitpick --keep-going
	@echo "Open _build/html/index.html in a browser."

clean:
	rm -rf _build .pytest_cache
