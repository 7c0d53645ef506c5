#!/usr/bin/env bash
# The GPU run: one command, time-boxed, most valuable first. On the GPU machine, in the
# repository's root, with .whl/ (scripts/fetch_wheels.sh) carried beside the tree:
#
#   scripts/gpu_run.sh [OUT_DIR]              # default OUT_DIR: gpu-run/ (git-ignored)
#   scripts/gpu_run.sh --stand-in [OUT_DIR]   # the same path with the CPU standing in (CI)
#
# Stages, most valuable first, each under its own limit and never past 540 s in all; the limits
# come from `scripts/gpu_run_tools.py limits` (what the first H200 run measured, the table in
# the README; LIMIT_<STAGE>=... overrides one). No session's 15 device minutes hold the whole
# run, so it resumes: where results/gpu/results.json (RESUME=...) is from this device kind and
# JAX version, it is the starting point and its done tasks are not measured again.
#   setup     JAX sees the GPU; the build tools installed from .whl/ (pip --no-index),
#             skipping every package this Python already has
#   headline  implementation report, matmul ceilings, read bandwidth, cuDNN bf16 sweep with
#             naive and XLA at the goal length, chapter 6's MLP rows, chapter 11's LM step and
#             its MFU; each measured in a child process that saves it at once (a crash loses
#             only it)
#   book      each of GPU_BOOK_CHAPTERS (scripts/gpu_run_tools.py, which says why those) executed
#             strictly in turn (scripts/run_chapter.py --keep-going: every failing cell of a
#             chapter is found in one run), those with no record first, or of
#             BOOK_CHAPTERS="12 13" where it is set; each one's status, seconds and failing
#             cell recorded
#   tests     the test suite, one line per test as it ends (a timeout keeps the lines so far)
#   sweeps    the rest of the attention sweep, the causal sweep, the plot
# OUT_DIR then holds at most 4 files (the device hands back 8): results.json (every section,
# each stage's status, seconds and detail, each chapter's), stages.json (the same stage
# records: all there is when setup fails), logs.tar.gz (every stage's and chapter's log,
# rewritten after each stage) and attention_latency.png. The run ends with
# `gpu_run_tools.py check`: exit 0 only if there is no problem.
# Where JAX sees no GPU, setup says so and every other stage is skipped (exit 2).
#
# --stand-in: the CPU stands in for the GPU (.ci/rehearse_device runs it offline, Python 3.12
# as python3): the same stages, the benchmarks at toy sizes (the file says rehearsal: true),
# limits of the measured CPU seconds x 3.
#
# Environment: XLA_PYTHON_CLIENT_PREALLOCATE=false (test workers and notebook kernels share the
# GPU); the book and the tests get JAX_DEFAULT_MATMUL_PRECISION=highest (float32, not TF32).
set -uo pipefail
cd "$(dirname "$0")/.."
STAND_IN=0
case "${1:-}" in --stand-in|--rehearse) STAND_IN=1; shift ;; esac  # --rehearse: its old name
OUT_DIR=${1:-gpu-run}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
rm -f "$OUT_DIR"/{results.json,stages.json,logs.tar.gz,html.tar.gz,attention_latency.png}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jaxloops-gpu-run.XXXXXX")  # logs and the build, bundled
mkdir -p "$WORK/logs"
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-${TMPDIR:-/tmp}/jaxloops-site}  # where the carried wheels are installed
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH="$PWD/code:$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
TOOLS=(scripts/gpu_run_tools.py)
BENCH=(scripts/gpu_benchmarks.py)
MODE=(); [ "$STAND_IN" = 1 ] && MODE=(--stand-in)
BENCH_MODE=(); [ "$STAND_IN" = 1 ] && BENCH_MODE=(--rehearse)
START=$(date +%s)

limits=$("$PY" "${TOOLS[@]}" limits "${MODE[@]}") || { echo "$PY cannot run ${TOOLS[0]}"; exit 2; }
while read -r name seconds; do
  var="LIMIT_${name^^}"
  [ -n "${!var:-}" ] || printf -v "$var" %s "$seconds"
done <<< "$limits"

elapsed() { local ms=$(( ($(date +%s%N) - $1) / 1000000 )); echo "$(( ms / 1000 )).$(( ms % 1000 / 100 ))"; }
bundle() { tar czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs; }
record() {
  "$PY" "${TOOLS[@]}" record --out "$OUT_DIR" "$1" "$2" "$3" --detail "$4" \
    || echo "{\"$1\": \"$2 ($4)\"}" >> "$WORK/logs/unrecorded.jsonl"
  bundle
}
skip() { echo "== stage $1 skipped: $2"; record "$1" skipped 0 "$2"; }
last_lines() { tail -n "$2" "$1" | tr '\n' ' ' | cut -c1-800; }

# stage NAME COMMAND...: runs COMMAND under min(its limit, the time left), logs it, records it.
stage() {
  local name=$1; shift
  local var="LIMIT_${name^^}" log="$WORK/logs/$name.log"
  local limit=${!var} left=$(( LIMIT_TOTAL - ($(date +%s) - START) ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    record "$name" timeout 0 "not started: the run's ${LIMIT_TOTAL} s were spent"; return
  fi
  echo "== stage $name (limit ${limit} s)"
  local t0 rc status detail
  t0=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
  detail="exit $rc; limit ${limit} s; $(last_lines "$log" 5)"
  if [ "$name" = book ] && [ "$rc" != 0 ]; then
    detail="exit $rc; limit ${limit} s; $("$PY" "${TOOLS[@]}" failing-cell "$log" | cut -c1-1900)"
  fi
  record "$name" "$status" "$(elapsed "$t0")" "$detail"
}

setup() {
  local found backend  # one JAX start-up: its backend, then what it found
  found=$("$PY" -c "import sys, jax; print(jax.default_backend()); print(jax.devices()[0].device_kind); print(jax.__version__); print('Python', sys.version.split()[0], 'JAX', jax.__version__, jax.devices())") \
    || { echo "$PY has no working JAX"; return 1; }
  backend=$(sed -n 1p <<< "$found"); DEVICE_KIND=$(sed -n 2p <<< "$found")
  JAX_VERSION=$(sed -n 3p <<< "$found"); sed -n 4p <<< "$found"
  echo "$DEVICE_KIND" > "$WORK/device_kind"; echo "$JAX_VERSION" > "$WORK/jax_version"
  if [ "$STAND_IN" = 0 ] && [ "$backend" != gpu ]; then
    echo "JAX sees no GPU (its backend is $backend): nothing to measure; --stand-in runs this path on the CPU"
    return 3
  fi
  local needed="import jaxloops, jupyter_book, myst_nb, jupytext, nbclient, ipykernel, xdist, nest_asyncio"
  if ! "$PY" -c "$needed" 2>/dev/null; then
    [ -d "$WHEELS" ] || { echo "the build tools are missing and there is no $WHEELS/: run scripts/fetch_wheels.sh where there is network and carry .whl"; return 1; }
    local wanted; mapfile -t wanted < <("$PY" "${TOOLS[@]}" wheels "$WHEELS")
    echo "installing ${#wanted[@]} of $(ls "$WHEELS"/*.whl | wc -l) wheels into $SITE (the others are packages $PY has)"
    timeout "$LIMIT_SETUP" "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade \
      --target "$SITE" "${wanted[@]}" || return 1
  fi
  "$PY" -c "$needed; print('imports: ok')" || return 1
  "$PY" -m pip check || echo "(pip check is informational: the run goes on)"
  mkdir -p book/_static  # html_static_path; MathJax (book/_static/mathjax) only if carried
  [ -d book/_static/mathjax ] || echo "no book/_static/mathjax: this build's pages show maths as TeX"
}

t0=$(date +%s%N)
echo "== stage setup (limit ${LIMIT_SETUP} s per install)"
setup > "$WORK/logs/setup.log" 2>&1
setup_rc=$?
cat "$WORK/logs/setup.log"
if [ "$setup_rc" != 0 ]; then
  record setup failed "$(elapsed "$t0")" "$(last_lines "$WORK/logs/setup.log" 3)"
  why="setup failed"; [ "$setup_rc" = 3 ] && why="JAX sees no GPU"
  for name in headline book tests sweeps; do skip "$name" "$why"; done
  "$PY" "${TOOLS[@]}" check "$OUT_DIR" "${MODE[@]}"
  rm -rf "$WORK"
  [ "$setup_rc" = 3 ] && exit 2 || exit 1
fi
record setup ok "$(elapsed "$t0")" "$(last_lines "$WORK/logs/setup.log" 3)"

# A recorded run of this device kind and JAX is where this one starts: its done tasks are not
# measured again (no session's device time holds the whole run; gpu_run_tools.py says more).
if [ "$STAND_IN" = 0 ]; then
  "$PY" "${TOOLS[@]}" resume "${RESUME:-results/gpu/results.json}" "$OUT_DIR" \
    --device-kind "$(cat "$WORK/device_kind")" --jax "$(cat "$WORK/jax_version")"
fi

stage headline "$PY" "${BENCH[@]}" headline --out "$OUT_DIR" "${BENCH_MODE[@]}"

# book_chapters NAMES...: each chapter executed strictly (scripts/run_chapter.py), in turn,
# under what is left of the stage's limit, each one's status, seconds and failing cell recorded
# in results.json; exit 1 if any failed, 124 if the time ran out.
book_chapters() {
  local end=$(( $(date +%s) + $1 )) rc=0 n name left t0 status detail; shift
  for n in "$@"; do
    name=$(basename "$(ls book/${n}_*.md)" .md)
    left=$(( end - $(date +%s) ))
    if [ "$left" -le 5 ]; then echo "no time left for $name"; rc=124; break; fi
    echo "== chapter $name (at most ${left} s)"
    t0=$(date +%s%N)
    timeout --kill-after=5 "$left" "$PY" scripts/run_chapter.py "$n" --keep-going --out "$WORK/notebooks" \
      > "$WORK/logs/chapter-$name.log" 2>&1
    case $? in 0) status=ok ;; 124|137) status=timeout; rc=124 ;; *) status=failed; [ $rc = 0 ] && rc=1 ;; esac
    detail=$(grep '^FAILED cell' "$WORK/logs/chapter-$name.log" | cut -c1-300)  # --keep-going's list
    [ -n "$detail" ] || detail=$(tail -n 40 "$WORK/logs/chapter-$name.log" | cut -c1-300)
    [ "$status" = ok ] && detail=$(tail -n 1 "$WORK/logs/chapter-$name.log")
    "$PY" "${TOOLS[@]}" record-chapter --out "$OUT_DIR" "$name" "$status" "$(elapsed "$t0")" --detail "$detail"
    echo "$name: $status in $(elapsed "$t0") s"
  done
  return $rc
}
BOOK_CHAPTERS=${BOOK_CHAPTERS:-$("$PY" "${TOOLS[@]}" chapter-order "$OUT_DIR/results.json")}
LIMIT_BOOK_LEFT=$(( LIMIT_TOTAL - ($(date +%s) - START) )); [ "$LIMIT_BOOK_LEFT" -lt "$LIMIT_BOOK" ] || LIMIT_BOOK_LEFT=$LIMIT_BOOK
export -f book_chapters elapsed; export PY WORK OUT_DIR; export TOOLS_PY=${TOOLS[0]}
stage book env -u MPLBACKEND JAXLOOPS_STRICT=1 JAX_DEFAULT_MATMUL_PRECISION=highest \
  JAXLOOPS_ROOFLINE="$WORK/roofline.json" \
  bash -c 'TOOLS=("$TOOLS_PY"); book_chapters "$@"' _ "$(( LIMIT_BOOK_LEFT - 10 ))" $BOOK_CHAPTERS

workers=16; [ "$STAND_IN" = 1 ] && workers=auto
# TESTS: which test files to run (default: the whole suite). CI's rehearsal names the ones that
# test this run's own machinery; it runs the whole suite under the newest JAX beside it.
read -ra SELECTED <<< "${TESTS:-}"
# The tests check values, not speed: no GEMM autotuning (XLA's default kernels), as the CPU's
# test settings drop LLVM's optimisation (tests/conftest.py); the chapters keep it.
stage tests env JAX_DEFAULT_MATMUL_PRECISION=highest \
  XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=0" \
  "$PY" -m pytest -p no:cacheprovider -o addopts= -v -n "$workers" -rfE --durations=10 ${SELECTED[@]+"${SELECTED[@]}"}

stage sweeps "$PY" "${BENCH[@]}" sweeps --out "$OUT_DIR" "${BENCH_MODE[@]}"

echo "== whole run: $(( $(date +%s) - START )) s of ${LIMIT_TOTAL} s; results in $OUT_DIR"
bundle
rm -rf "$WORK"
"$PY" "${TOOLS[@]}" check "$OUT_DIR" "${MODE[@]}"
