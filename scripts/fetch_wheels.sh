#!/usr/bin/env bash
# Downloads, into .whl/, the wheels a GPU run needs on a machine whose Python 3.12 already has
# jax (with its CUDA plugin), optax, numpy, matplotlib, scikit-learn and pytest but no network:
# the book's build tools, orbax-checkpoint (`import jaxloops` imports it) and pytest-xdist.
# scripts/gpu_run.sh installs them with pip --no-index, skipping every package the machine
# already has (scripts/gpu_benchmarks.py wheels), so no carried wheel shadows one of its own.
# Then checks the whole carry (the tree as the device tool counts it, and .whl/) against the
# tool's 64 MiB: exit 1 if it is over.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${PY_VERSION:-3.12}
rm -rf .whl && mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# The versions of requirements.txt, so the device builds the book with the tools CI tests.
# nest-asyncio: orbax-checkpoint needs it to save from a notebook's running event loop under
# Python 3.12 (chapter 13 failed without it in the rehearsal), and nothing else pulls it in.
python3 -m pip download --quiet --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
  "${platforms[@]}" -d .whl \
  jupyter-book==1.0.4.post1 myst-nb==1.4.0 jupytext==1.19.6 sphinxcontrib-bibtex==2.7.0 \
  ipykernel==7.4.0 nbclient orbax-checkpoint==0.12.8 pytest-xdist==3.8.0 nest-asyncio==1.6.0
# Already on the GPU machine, large, or never imported: drop them here (gpu_run.sh also skips any
# other wheel whose package the machine turns out to have).
python3 scripts/gpu_run_tools.py wheels .whl --drop-device-packages
# What is carried: the tree and .whl/. MathJax (book/_static/mathjax, 8.4 MiB) does not fit
# beside orbax-checkpoint's tensorstore (20.8 MiB); the GPU build's pages show maths as TeX.
python3 scripts/gpu_run_tools.py carry .whl
