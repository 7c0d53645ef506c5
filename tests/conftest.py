import os

# The tests check values, not speed, and most of their time is XLA compiling many small
# programs: LLVM's optimisation level 0 compiles ~1.6x faster and computes the same values.
os.environ["XLA_FLAGS"] = " ".join(
    filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"])
)

import jax
import pytest

import jaxloops


@pytest.fixture(scope="session")
def digits():
    """The digits split, on the device."""
    split = jaxloops.load_digits_split(seed=0)
    return jaxloops.Split(
        jaxloops.to_device(split.train, 64, 10), jaxloops.to_device(split.test, 64, 10)
    )


@pytest.fixture
def key():
    return jax.random.key(7)
