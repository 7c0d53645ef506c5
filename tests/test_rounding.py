"""This backend's rounding, measured: float32's epsilon at least, and an operation that rounds
worse is found."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxloops import equivalence, rounding


def test_backend_eps_is_float32s_at_least_and_measures_each_operation():
    errors = rounding.backend_errors()
    assert set(errors) == {"exp", "log", "divide", "sqrt", "matmul"}
    assert all(0 <= e < 1e-2 for e in errors.values()), errors
    eps = float(np.finfo(np.float32).eps)
    assert rounding.backend_eps() == max(eps, *errors.values())
    assert equivalence.backend_eps is rounding.backend_eps  # the bounds' module re-exports it


def test_backend_eps_finds_an_operation_that_rounds_worse(monkeypatch):
    """An exp wrong by 1e-5 relative (a TPU's exp is less accurate than a CPU's) is seen."""
    exp = jnp.exp
    monkeypatch.setattr(jnp, "exp", lambda x: exp(x) * (1 + 1e-5))
    rounding._backend_errors.cache_clear()  # measured again, with the wrong exp
    try:
        assert rounding.backend_errors()["exp"] == pytest.approx(1e-5, rel=0.05)
        assert rounding.backend_eps() == pytest.approx(1e-5, rel=0.05)
    finally:
        rounding._backend_errors.cache_clear()  # the next test measures the real one


def test_backend_eps_of_some_operations_and_an_unknown_one():
    errors, eps = rounding.backend_errors(), float(np.finfo(np.float32).eps)
    assert rounding.backend_eps(("exp", "log")) == max(eps, errors["exp"], errors["log"])
    assert rounding.backend_eps(rounding.ATTENTION) <= rounding.backend_eps()
    with pytest.raises(ValueError, match=r"no measured error for \['tanh'\]"):
        rounding.backend_eps(("exp", "tanh"))
