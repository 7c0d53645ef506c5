import jax
import pytest

import jaxloops


@pytest.fixture(scope="session")
def digits():
    """The digits split, on the device."""
    split = jaxloops.load_digits_split(seed=0)
    return jaxloops.Split(jaxloops.to_device(split.train, 64, 10), jaxloops.to_device(split.test, 64, 10))


@pytest.fixture
def key():
    return jax.random.key(7)
