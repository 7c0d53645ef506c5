#!/usr/bin/env bash
# Downloads, into .whl/, the wheels the book build needs on a CUDA machine whose Python 3.12
# already has jax (with its CUDA plugin), optax, numpy, matplotlib, scikit-learn and pytest
# but no network. scripts/gpu_run.sh installs them with pip --no-index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${PY_VERSION:-3.12}
rm -rf .whl && mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --quiet --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
  "${platforms[@]}" -d .whl \
  jupyter-book==1.0.4.post1 myst-nb==1.4.0 jupytext==1.19.6 sphinxcontrib-bibtex==2.7.0 ipykernel \
  nbclient
# Already on the GPU machine, and large: keep only what it lacks.
for name in jax jaxlib numpy scipy matplotlib scikit_learn pillow contourpy fonttools kiwisolver \
            pytest optax ml_dtypes opt_einsum; do
  rm -f .whl/"${name}"-*.whl
done
# The device tool carries at most 64 MiB of ignored files per call: say so before it fails.
size=$(du -sm .whl | cut -f1)
echo ".whl: ${size} MiB"
[ "$size" -le 60 ] || echo "warning: .whl is over 60 MiB; remove wheels the GPU machine already has"

