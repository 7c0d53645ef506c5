import fcntl
import json
import os

# The tests check values, not speed, and most of their time is XLA compiling many small
# programs: LLVM's optimisation level 0 compiles ~1.6x faster and computes the same values.
os.environ["XLA_FLAGS"] = " ".join(
    filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"])
)

import jax
import numpy as np
import pytest

import jaxloops
from jaxloops.data import Split

# Float32 means float32: on NVIDIA GPUs JAX's DEFAULT precision multiplies float32 matrices in
# TF32 (10-bit mantissa), which would fail every comparison with a float32 or float64
# reference. tests/test_measure_published.py shows where TF32 or bfloat16 would differ.
jax.config.update("jax_default_matmul_precision", "highest")
# An array of the wrong rank broadcasting silently is how a transposed or missing axis passes
# a test: the suite refuses implicit rank promotion (the package broadcasts explicitly).
jax.config.update("jax_numpy_rank_promotion", "raise")

# `JAXLOOPS_ONE_DEFAULT_DEVICE=1 PYTHONPATH=tests/one_default_device pytest` runs the suite as
# on a machine with one GPU (tests/one_default_device/sitecustomize.py): refuse to run
# unsimulated when asked to simulate.
if os.environ.get("JAXLOOPS_ONE_DEFAULT_DEVICE") == "1" and jax.device_count() != 1:
    raise RuntimeError(
        "JAXLOOPS_ONE_DEFAULT_DEVICE=1 without tests/one_default_device on PYTHONPATH"
    )

# Shared by the test modules (`from conftest import normal, SMALL_TRANSFORMER`): one copy.


def normal(shape, seed=0, dtype=np.float32):
    """Standard-normal test data from NumPy (no sampler to compile per shape)."""
    return np.random.default_rng(seed).standard_normal(shape, np.float32).astype(dtype)


# A small transformer with distinct sizes, so a transposed axis cannot pass by accident:
# V 13, L 2, D 30, N 10, K 5 (G = 2), H 3, F 21, max_len 11.
SMALL_TRANSFORMER = jaxloops.TransformerConfig(
    vocab_size=13,
    num_layers=2,
    model_dim=30,
    num_heads=10,
    num_kv_heads=5,
    hidden_dim=21,
    max_len=11,
)


@pytest.fixture(scope="session")
def small_transformer():
    """Parameters of SMALL_TRANSFORMER (initialised once for the whole session)."""
    return jaxloops.init_transformer(jax.random.key(1), SMALL_TRANSFORMER)


@pytest.fixture(scope="session")
def digits():
    """The digits split, on the device."""
    split = jaxloops.load_digits_split(seed=0)
    return Split(jaxloops.to_device(split.train, 64, 10), jaxloops.to_device(split.test, 64, 10))


@pytest.fixture
def key():
    return jax.random.key(7)


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
