import atexit
import collections
import fcntl
import functools
import importlib
import importlib.metadata
import json
import os
import pathlib
import shutil
import sys

# JAX's persistent compilation cache for this process and every process it starts (they
# inherit the environment): each program compiled once is stored, however short its compile,
# and a later process (another xdist worker, a worker subprocess, the next run) loads it.
# Set before jax is imported, which reads them; `make test` sets the same.
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ.get(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.abspath(os.path.join(__file__, "..", "..", "_build", "jax-cache")),
)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = os.environ.get(
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"
)
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = os.environ.get(
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0"
)
# The digits splits, likewise kept on disk (jaxloops.data.DATA_CACHE): a process that loads a
# split another made reads it instead of importing scikit-learn (about 1 s of CPU each).
os.environ["JAXLOOPS_DATA_CACHE"] = os.environ.get(
    "JAXLOOPS_DATA_CACHE",
    os.path.abspath(os.path.join(__file__, "..", "..", "_build", "data-cache")),
)
# Figures are drawn off screen, whatever the machine: matplotlib reads its backend from here
# when pyplot is first imported (the package imports it at its first figure).
os.environ["MPLBACKEND"] = "Agg"
# The tests check values, not speed, and most of their time is XLA compiling many small
# programs. CPU compiler settings that cut that time and compute the same values: LLVM's
# optimisation level 0; and, in jaxlib 0.10, XLA's older loop emitters in place of its MLIR
# fusion emitters, with one LLVM module per program instead of several compiled in parallel
# (the suite already runs one worker per core). In jaxlib 0.10.2 the three compile the suite's
# tiny transformer step 3x faster (0.62 s -> 0.21 s). jaxlib 0.11 has no older emitters: its
# XLA aborts on the flag, and the split count alone gains nothing there.
os.environ["XLA_FLAGS"] = " ".join(
    [*filter(None, [os.environ.get("XLA_FLAGS")]), "--xla_backend_optimization_level=0"]
    + (
        ["--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1"]
        if [int(p) for p in importlib.metadata.version("jaxlib").split(".")[:2]] < [0, 11]
        else []
    )
)

import numpy as np
import pytest

# JAX starts in the processes that run tests (`pytest_configure` below), not in the xdist
# controller, which starts the workers only once its own conftest is loaded: a second of
# JAX and the package imported there is a second before any worker starts.


def start_jax() -> None:
    import jax
    import jax.monitoring

    # Float32 means float32: on NVIDIA GPUs JAX's DEFAULT precision multiplies float32
    # matrices in TF32 (10-bit mantissa), which would fail every comparison with a float32 or
    # float64 reference. tests/test_measure_published.py shows where TF32 or bfloat16 differ.
    jax.config.update("jax_default_matmul_precision", "highest")
    # An array of the wrong rank broadcasting silently is how a transposed or missing axis
    # passes a test: the suite refuses implicit rank promotion (the package broadcasts
    # explicitly).
    jax.config.update("jax_numpy_rank_promotion", "raise")
    # `JAXLOOPS_ONE_DEFAULT_DEVICE=1 PYTHONPATH=tests/one_default_device pytest` runs the
    # suite as on a machine with one GPU (tests/one_default_device/sitecustomize.py): refuse
    # to run unsimulated when asked to simulate.
    if os.environ.get("JAXLOOPS_ONE_DEFAULT_DEVICE") == "1" and jax.device_count() != 1:
        raise RuntimeError(
            "JAXLOOPS_ONE_DEFAULT_DEVICE=1 without tests/one_default_device on PYTHONPATH"
        )
    jax.monitoring.register_event_listener(
        lambda event, **_: _cache_counts.update(
            [_CACHE_EVENTS[event]] if event in _CACHE_EVENTS else []
        )
    )
    # The roofline the package's measuring code reads (`measure.roofline()`), measured at a
    # test's size: a 64 x 64 matmul and a 1 MiB read, three samples each. The tests assert
    # values, not speeds, and the chapters' roofline (1024 x 1024 matmuls and a 256 MiB read,
    # 25 samples) took 2.6 s of CPU in each worker that needed it. The variable is unset so
    # that this process keeps it, unless a test sets the variable itself.
    os.environ.pop("JAXLOOPS_ROOFLINE", None)
    roofline = importlib.import_module("jaxloops.measure.roofline")
    small = roofline.measure_roofline(
        jax.random.key(0), matmul_size=64, read_bytes=2**20, samples=3
    )
    roofline.store_roofline(small)


# Shared by the test modules (`from conftest import normal, SMALL_TRANSFORMER`): one copy.


def printed_report(args: list[str], env: dict, timeout: float) -> dict:
    """Runs `python args...` and returns the JSON it printed on a line starting REPORT
    (the probes of the sharding tests), failing with the end of its stderr."""
    import subprocess

    run = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("REPORT"))
    return json.loads(line[len("REPORT") :])


def normal(shape, seed=0, dtype=np.float32):
    """Standard-normal test data from NumPy (no sampler to compile per shape)."""
    return np.random.default_rng(seed).standard_normal(shape, np.float32).astype(dtype)


@functools.cache
def device_bytes(shape: tuple[int, ...], dtype=np.float32) -> int:
    """Bytes an array of `shape` and `dtype` occupies on this process's default device, as
    the device lays it out (`measure.allocated_bytes`): the shape's bytes on a CPU; on a TPU
    its two minor-most dims, in the order that pads least, padded to whole tiles (8 x 128
    for 32 bits; a TPU v5e stores a (1, 3, 257, 263) float32 array in 1,184,256 bytes, not
    811,092). What a compiled program's `memory_analysis()` counts is laid out the same way."""
    import jax

    from jaxloops import measure

    return measure.allocated_bytes(jax.device_put(np.zeros(shape, dtype)))


# A small transformer with distinct sizes, so a transposed axis cannot pass by accident:
# V 13, L 2, D 30, N 10, K 5 (G = 2), H 3, F 21, max_len 11. Made when a test module first
# imports it (`from conftest import SMALL_TRANSFORMER` calls the module's __getattr__).
@functools.cache
def small_transformer_config():
    import jaxloops

    return jaxloops.TransformerConfig(
        vocab_size=13,
        num_layers=2,
        model_dim=30,
        num_heads=10,
        num_kv_heads=5,
        hidden_dim=21,
        max_len=11,
    )


def __getattr__(name):
    if name == "SMALL_TRANSFORMER":
        return small_transformer_config()
    raise AttributeError(f"module 'conftest' has no attribute {name!r}")


# The suite's longest tests (each several seconds: worker processes, whole training runs)
# start first, so that under `pytest -n auto --dist worksteal` the short ones fill in around
# them instead of one long test running alone at the end.
LONG_FIRST = (
    "test_checkpoint.py::test_resumed_run_equals_the_uninterrupted_run_bit_for_bit",
    "test_sharding.py::test_sharded_steps_equal_the_single_device_step_within_rounding",
    "test_checkpoint.py::test_checkpoint_from_8_devices_restores_onto_4",
    "test_memory_precision.py::test_loss_scaling_recovers_a_run_that_float16_alone_loses",
    "test_blockwise.py::test_plain_autodiff_control_gives_the_same_gradient_with_more_scratch",
    "test_transformer.py::test_tiny_model_learns_stdlib_text_with_the_books_train_step",
    "test_transformer.py::test_blockwise_attention_trains_the_same_model",
    "test_measure_timing.py::test_a_fresh_process_writes_the_persistent_cache",
    "test_workers.py::test_one_default_device_simulation_and_cpu_pinned_workers",
    "test_measure_profile.py::test_the_host_thread_is_found_when_the_interpreter_is_called_python3",
)


def pytest_collection_modifyitems(items):
    rank = lambda item: next(
        (i for i, name in enumerate(LONG_FIRST) if name in item.nodeid), len(LONG_FIRST)
    )
    items.sort(key=rank)  # stable: the rest keep their order


@pytest.fixture(scope="session")
def small_transformer():
    """Parameters of SMALL_TRANSFORMER (initialised once for the whole session)."""
    import jax

    import jaxloops

    return jaxloops.init_transformer(jax.random.key(1), small_transformer_config())


@pytest.fixture(scope="session")
def digits():
    """The digits split, on the device."""
    import jaxloops
    from jaxloops.data import Split

    split = jaxloops.load_digits_split(seed=0)
    return Split(jaxloops.to_device(split.train, 64, 10), jaxloops.to_device(split.test, 64, 10))


@pytest.fixture
def plt():
    """matplotlib's pyplot, imported by the tests that draw (0.4 s a process), not at
    collection."""
    import matplotlib.pyplot

    return matplotlib.pyplot


@pytest.fixture
def key():
    import jax

    return jax.random.key(7)


@pytest.fixture(scope="session")
def worker_id(request):
    """xdist's worker name ("gw0", ...), or "master" in a run without workers.

    pytest-xdist defines the same fixture; this one also exists where xdist is absent or
    off (the TPU machine runs the suite in one process: one process at a time holds the chip).
    """
    return getattr(request.config, "workerinput", {}).get("workerid", "master")


def once_per_session(tmp_path_factory, worker_id: str, name: str, compute):
    """`compute(directory)` (JSON-able) run once for the whole session: under pytest-xdist
    the first worker to ask computes it and the others read its result, instead of every
    worker that runs one of the module's tests repeating a slow fixture.

    `directory` is a folder of its own for what `compute` writes.
    """
    if worker_id == "master":  # no xdist
        return compute(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent  # shared by the session's workers
    result = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not result.exists():
            (root / name).mkdir(exist_ok=True)
            result.write_text(json.dumps(compute(root / name)))
        return json.loads(result.read_text())


# What the cache did in this session's processes (not the subprocesses): chapter 1 reads it.
# `requests`: compiles that may use the cache; `hits`: loaded from it; `writes`: stored in it.
CACHE_REPORT = pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"]).parent / "test-cache-report"
_CACHE_EVENTS = {
    "/jax/compilation_cache/compile_requests_use_cache": "requests",
    "/jax/compilation_cache/cache_hits": "hits",
    "/jax/compilation_cache/cache_misses": "writes",  # JAX records it as it writes an entry
}
_cache_counts = collections.Counter()


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller, before any worker starts
        shutil.rmtree(CACHE_REPORT, ignore_errors=True)
        if config.getoption("numprocesses", None):
            return  # the xdist controller runs no test
    start_jax()


def pytest_sessionfinish(session):
    worker = getattr(session.config, "workerinput", {}).get("workerid", "master")
    if session.config.option.collectonly or (
        worker == "master" and session.config.getoption("numprocesses", None)
    ):
        return  # nothing ran here: collecting only, or the xdist controller (workers report)
    CACHE_REPORT.mkdir(parents=True, exist_ok=True)
    counts = {name: _cache_counts[name] for name in _CACHE_EVENTS.values()}
    (CACHE_REPORT / f"{worker}.json").write_text(json.dumps(counts))


def pytest_unconfigure(config):
    """An xdist worker that has sent its results leaves without tearing down its objects.

    Freeing a worker's hundreds of compiled programs and arrays at interpreter exit took
    about 1.7 s, and the controller waits for every worker to exit before it reports. The
    results are already with the controller (`workerfinished`), and nothing is left to write:
    the compilation cache is written as each program compiles, and each test waits for its
    checkpoints. `os._exit` runs as the first exit handler, after the worker's last message.
    """
    if hasattr(config, "workerinput"):
        atexit.register(_leave_now)  # registered last, so run first


def _leave_now():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
