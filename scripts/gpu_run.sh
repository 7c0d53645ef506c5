#!/usr/bin/env bash
# The GPU run, one command, time-boxed, most valuable first. On a machine with a CUDA GPU:
#
#   scripts/gpu_run.sh [OUT_DIR]              # default OUT_DIR: gpu-run/
#   scripts/gpu_run.sh --rehearse [OUT_DIR]   # the same stages on any machine, toy sizes (CI)
#
# Stages, each under its own limit (seconds, override with LIMIT_<STAGE>=...), and never past
# LIMIT_TOTAL (default 540 s = 9 minutes) for the whole:
#   setup  45   a Python whose JAX sees the GPU; the book's build tools (from .whl/ offline)
#   first 120   implementation report, matmul ceilings (f32 HIGHEST, TF32, bf16), memory read
#               bandwidth, cuDNN bf16 sweep, and naive/XLA at the goal length
#   book  210   the strict book build on the GPU -> OUT_DIR/html.tar.gz, book.log
#   tests  60   the test suite on the GPU -> tests.log
#   rest   75   the rest of the attention sweep, causal sweep, MLP throughput, plot
# OUT_DIR/results.json is rewritten after every measured point and every stage, so a stage
# that times out still leaves what it measured; each stage's status (ok, failed, timeout,
# skipped), seconds and last log lines are in its "stages" section. The run ends with
# `gpu_benchmarks.py check`, which lists every problem; exit status 0 only if there is none.
# Then copy OUT_DIR/results.json to results/gpu/results.json and rebuild: the appendix
# "Measured on a GPU" and the chapter sidebars render it.
#
# --rehearse runs every stage's code on the CPU at toy sizes in well under a minute; the book
# and the tests are reported as skipped (CI runs them itself with make book / make test).
#
# Environment for every stage: XLA_PYTHON_CLIENT_PREALLOCATE=false, so that test workers and
# notebook kernels share the GPU instead of each grabbing 75 % of its memory; the book and the
# tests also get JAX_DEFAULT_MATMUL_PRECISION=highest (float32 means float32, not TF32).
#
# Python: if $PYTHON (default python3) imports a JAX that sees a GPU -- e.g. a machine with
# JAX and its CUDA 13 plugin preinstalled -- it is used as it is; packages it lacks
# (jupyter-book, myst-nb, ...) are installed from wheels in $WHEELS (default .whl/, made by
# scripts/fetch_wheels.sh where there is network) with pip --no-index, else from the index.
# Otherwise a .venv with requirements-cuda12.txt is made by `make venv`.
set -uo pipefail
cd "$(dirname "$0")/.."
REHEARSE=0
if [ "${1:-}" = "--rehearse" ]; then REHEARSE=1; shift; fi
OUT_DIR=${1:-gpu-run}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
rm -f "$OUT_DIR/results.json" "$OUT_DIR/stages.json"
export PYTHONUNBUFFERED=1  # no MPLBACKEND: the book needs the inline backend for its figures
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH="$PWD/code${PYTHONPATH:+:$PYTHONPATH}"
LIMIT_TOTAL=${LIMIT_TOTAL:-540}
START=$(date +%s)
PY=${PYTHON:-python3}
[ "$REHEARSE" = 1 ] && [ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
BENCH=(scripts/gpu_benchmarks.py)
[ "$REHEARSE" = 1 ] && REHEARSE_FLAG=(--rehearse) || REHEARSE_FLAG=()

# stage NAME LIMIT COMMAND...: runs COMMAND under min(LIMIT, time left), logs to NAME.log,
# and records ok / failed / timeout with the seconds and the log's last lines.
stage() {
  local name=$1 limit=$2; shift 2
  local left=$(( LIMIT_TOTAL - ($(date +%s) - START) ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    record "$name" timeout 0 "not started: the run's ${LIMIT_TOTAL} s were spent"
    return
  fi
  echo "== stage $name (limit ${limit} s)"
  local t0 rc status
  t0=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) status=ok ;;
    124|137) status=timeout ;;
    *) status=failed ;;
  esac
  record "$name" "$status" "$(elapsed "$t0")" \
    "exit $rc; limit ${limit} s; $(tail -n 5 "$OUT_DIR/$name.log" | tr '\n' ' ' | cut -c1-800)"
}
record() {
  "$PY" "${BENCH[@]}" record --out "$OUT_DIR" "$1" "$2" "$3" --detail "$4" \
    || echo "{\"$1\": \"$2 ($4)\"}" >> "$OUT_DIR/stages-unrecorded.jsonl"
}
elapsed() { local ms=$(( ($(date +%s%N) - $1) / 1000000 )); echo "$(( ms / 1000 )).$(( ms % 1000 / 100 ))"; }
skip() { record "$1" skipped 0 "$2"; echo "== stage $1 skipped: $2"; }

setup() {
  if [ "$REHEARSE" = 1 ]; then
    "$PY" -c "import jax, jaxloops; print('rehearsal with JAX', jax.__version__, jax.devices())"
    return
  fi
  if "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')"; then
    echo "using $PY with its own JAX: $("$PY" -c 'import jax; print(jax.__version__, jax.devices())')"
    if ! "$PY" -c "import jupyter_book, myst_nb, jupytext, nbclient" 2>/dev/null; then
      SITE=${SITE:-/tmp/jaxloops-site}
      if [ -d "${WHEELS:-.whl}" ]; then
        timeout "$LIMIT_SETUP" "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
          "${WHEELS:-.whl}"/*.whl || return 1
      else
        timeout "$LIMIT_SETUP" "$PY" -m pip install -q --target "$SITE" jupyter-book==1.0.4.post1 \
          myst-nb==1.4.0 jupytext sphinxcontrib-bibtex || return 1
      fi
    fi
  else
    timeout "$LIMIT_SETUP" make venv || return 1
    .venv/bin/python -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" || { echo "JAX sees no GPU"; return 1; }
  fi
  "$PY" -c "import jax; jax.print_environment_info()" | head -20
  if [ ! -d book/_static/mathjax ]; then  # git-ignored; `make mathjax` fetches it with npm
    mkdir -p book/_static
    echo "no book/_static/mathjax: the GPU build's pages will not typeset maths (carry it)"
  fi
}

# setup chooses $PY and $PATH, so it runs as a function; its limit applies to each install.
LIMIT_SETUP=${LIMIT_SETUP:-45}
t0=$(date +%s%N)
setup 2>&1 | tee "$OUT_DIR/setup.log"
setup_rc=${PIPESTATUS[0]}
if [ "$REHEARSE" = 0 ]; then
  SITE=${SITE:-/tmp/jaxloops-site}
  if [ -d "$SITE" ]; then
    export PYTHONPATH="$PYTHONPATH:$SITE" PATH="$SITE/bin:$PATH"
  fi
  if ! "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null; then
    PY=.venv/bin/python; export PATH="$PWD/.venv/bin:$PATH"
  fi
fi
[ "$setup_rc" = 0 ] && setup_status=ok || setup_status=failed
record setup "$setup_status" "$(elapsed "$t0")" "$(tail -n 3 "$OUT_DIR/setup.log" | tr '\n' ' ' | cut -c1-800)"

stage first "${LIMIT_FIRST:-120}" "$PY" "${BENCH[@]}" first --out "$OUT_DIR" "${REHEARSE_FLAG[@]}"

if [ "$REHEARSE" = 1 ]; then
  skip book "rehearsal: no GPU; CI builds the book with make book"
  skip tests "rehearsal: no GPU; CI runs the suite with make test"
else
  stage book "${LIMIT_BOOK:-210}" env -u MPLBACKEND JAX_DEFAULT_MATMUL_PRECISION=highest \
    JAXLOOPS_ROOFLINE="$OUT_DIR/roofline.json" \
    "$PY" -c "from jupyter_book.cli.main import main; main()" build . \
    --path-output "$OUT_DIR/build" --warningiserror --nitpick --keep-going
  [ -d "$OUT_DIR/build/_build/html" ] && tar czf "$OUT_DIR/html.tar.gz" -C "$OUT_DIR/build/_build" html
  rm -rf "$OUT_DIR/build"
  stage tests "${LIMIT_TESTS:-60}" env JAX_DEFAULT_MATMUL_PRECISION=highest \
    "$PY" -m pytest -p no:cacheprovider -q -n 8 --durations=10
fi

stage rest "${LIMIT_REST:-75}" "$PY" "${BENCH[@]}" rest --out "$OUT_DIR" "${REHEARSE_FLAG[@]}"

echo "== whole run: $(( $(date +%s) - START )) s; results in $OUT_DIR"
"$PY" "${BENCH[@]}" check "$OUT_DIR/results.json"
