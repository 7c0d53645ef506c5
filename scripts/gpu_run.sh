#!/usr/bin/env bash
# On a machine with a CUDA GPU: run the tests, the strict book build and the GPU benchmarks,
# and write everything to OUT_DIR (default gpu-run/):
#   tests.log, book.log, html.tar.gz (the built book), results.json, attention_latency.png
# Then copy OUT_DIR/results.json to results/gpu/results.json and rebuild: the appendix
# "Measured on a GPU" and the chapter sidebars render it.
#
# Python: if $PYTHON (default python3) already imports a JAX that sees a GPU -- e.g. a
# machine with JAX and its CUDA 13 plugin preinstalled -- it is used as it is. Packages it
# lacks (jupyter-book, myst-nb, ...) are installed from wheels in $WHEELS (default .whl/, made
# by scripts/fetch_wheels.sh on a machine with network; no network needed on the GPU machine:
# pip --no-index) when that folder exists, else from the package index. Otherwise a .venv
# with requirements-cuda12.txt is made by `make venv`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-gpu-run}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1  # no MPLBACKEND: the book needs the inline backend for its figures

if "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null; then
  echo "using $PY with its own JAX: $("$PY" -c 'import jax; print(jax.__version__, jax.devices())')"
  SITE=${SITE:-/tmp/jaxloops-site}
  if [ -d "${WHEELS:-.whl}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${WHEELS:-.whl}"/*.whl || exit 1
  else
    "$PY" -m pip install -q --target "$SITE" jupyter-book==1.0.4.post1 myst-nb==1.4.0 jupytext sphinxcontrib-bibtex || exit 1
  fi
  export PYTHONPATH="$PWD/code:$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
else
  make venv || exit 1
  PY=.venv/bin/python
  "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" || { echo "JAX sees no GPU"; exit 1; }
  export PATH="$PWD/.venv/bin:$PATH"
fi

t0=$(date +%s.%N)
"$PY" -m pytest -p no:cacheprovider 2>&1 | tee "$OUT_DIR/tests.log"
tests_rc=${PIPESTATUS[0]}
t1=$(date +%s.%N)
"$PY" -c "from jupyter_book.cli.main import main; main()" build . --path-output "$OUT_DIR/build" \
  --warningiserror --nitpick --keep-going 2>&1 | tee "$OUT_DIR/book.log"
book_rc=${PIPESTATUS[0]}
t2=$(date +%s.%N)
"$PY" - "$t0" "$t1" "$t2" "$tests_rc" "$book_rc" > "$OUT_DIR/build_times.json" <<'PYEOF'
import json, sys
t0, t1, t2 = map(float, sys.argv[1:4])
print(json.dumps({"tests_seconds": t1 - t0, "book_seconds": t2 - t1,
                  "tests_rc": int(sys.argv[4]), "book_rc": int(sys.argv[5])}))
PYEOF
[ -d "$OUT_DIR/build/_build/html" ] && tar czf "$OUT_DIR/html.tar.gz" -C "$OUT_DIR/build/_build" html
"$PY" scripts/gpu_benchmarks.py --out "$OUT_DIR" --build-times "$OUT_DIR/build_times.json" 2>&1 | tee "$OUT_DIR/benchmarks.log"
bench_rc=${PIPESTATUS[0]}
rm -rf "$OUT_DIR/build"
echo "tests rc=$tests_rc book rc=$book_rc benchmarks rc=$bench_rc; results in $OUT_DIR"
exit $(( tests_rc || book_rc || bench_rc ))
